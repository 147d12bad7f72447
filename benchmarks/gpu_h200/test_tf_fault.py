"""Run only with the fault profiles (run_h200.sh T does): the server cannot start, so this test errors in setup,
and the error must carry the real server's root-cause line."""


def test_server_starts(sglang_server):
    assert sglang_server.startup_seconds > 0
