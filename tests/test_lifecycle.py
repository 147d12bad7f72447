"""Server lifecycle through the plugin, as a user runs it: real pytest subprocesses, the real simulator."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import psutil
import pytest
from helpers import die_with_pytest, interruptible, marked_processes, profile_toml, wait_for_no_processes

pytestmark = pytest.mark.timeout(180)

READY_TEST = """
def test_ready(sglang_server):
    import requests
    assert sglang_server.base_url.startswith("http://127.0.0.1:")
    assert requests.get(sglang_server.url("/health"), timeout=5).status_code == 200
    assert sglang_server.startup_seconds > 0
    assert sglang_server.phases["ready"] == sglang_server.startup_seconds
    print("PID", sglang_server.pid, sglang_server.profile)
"""


def project(pytester: pytest.Pytester, toml: str, tests: str = READY_TEST) -> None:
    pytester.makefile(".toml", pyproject="[tool.pytest.ini_options]\n" + toml)
    pytester.makepyfile(test_user=tests)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", *args, timeout=150)


def test_session_server_is_ready_and_torn_down(pytester: pytest.Pytester, mark: str) -> None:
    project(pytester, profile_toml("base", mark, 'args = ["--tp", "2"]'))
    result = run(pytester, "--sglang-profile=base", "--sglang-sim")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*[[]sglang base[]] launching: log *base.log*", "*sglang servers*",
                                 "base: ready in * s  [[]launch *load_weights*kv_cache*cuda_graph*warmup*"])


def test_profiles_run_one_after_another(pytester: pytest.Pytester, mark: str) -> None:
    tests = """
import psutil
seen = []
def test_one_server_at_a_time(sglang_server):
    for profile, pid in seen:
        if profile != sglang_server.profile:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    seen.append((sglang_server.profile, sglang_server.pid))
def test_again(sglang_server):
    assert (sglang_server.profile, sglang_server.pid) in seen
"""
    toml = profile_toml("a", mark) + profile_toml("b", mark).replace("profiles.b]", 'profiles.b]\nextends = "a"')
    project(pytester, toml, tests)
    result = run(pytester, "--sglang-profile=a,b", "--sglang-sim", "-v")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*test_one_server_at_a_time?a? PASSED*", "*test_again?a? PASSED*",
                                 "*test_one_server_at_a_time?b? PASSED*"])


def test_unknown_profile_lists_the_known_ones(pytester: pytest.Pytester, mark: str) -> None:
    project(pytester, profile_toml("baseline", mark) + profile_toml("eagle3", mark))
    result = run(pytester, "--sglang-profile=eagel3", "--sglang-sim")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*Unknown profile 'eagel3'*Known profiles in *pyproject.toml: baseline, eagle3.*"
                                 "Did you mean 'eagle3'?*"])


def test_malformed_toml_names_file_and_line(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", servers='[profiles.a]\nmodel = "m"\nargs = ["--tp" "2"]\nport = 1\n')
    pytester.makepyfile(test_user=READY_TEST)
    result = run(pytester, "--sglang-profile=a", "--sglang-config=servers.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*servers.toml: malformed TOML*line 3*"])


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("traceback", ["*server crashed during startup (its process was still alive*",
                       "*AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute*"]),
        ("exit", ["*server exited during startup*killed by SIGKILL (exit code 137)*",
                  "*AttributeError: 'KimiK25ForConditionalGeneration'*"]),
        ("bad-flag", ["*server exited during startup*exit code 2*", "*error: unrecognized arguments*",
                      "*exit code 2 is the server?s command-line parser rejecting a flag*"]),
        ("hang", ["*server was not ready within its startup timeout of 4 s*", "*Last * log lines:*",
                  "*Try: raise startup_timeout*"]),
    ],
)
def test_startup_failures_error_every_test_with_the_root_cause(
    pytester: pytest.Pytester, mark: str, fault: str, expected: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # pytest cuts short-summary lines to the terminal's width
    # Every failure path must also kill children that left the group and ignore SIGTERM.
    toml = profile_toml("p", mark, 'startup_timeout = 4\nargs = ["--tp", "2"]',
                        f'startup_seconds = 2.0, fault = "{fault}", ignore_sigterm = true')
    project(pytester, toml, READY_TEST + "\ndef test_second(sglang_server):\n    pass\n")
    result = run(pytester, "--sglang-profile=p", "--sglang-sim", "-rE")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(expected)
    result.stdout.fnmatch_lines(["*Full log: *p.log*"])
    out = result.stdout.str()
    assert "During handling of the above exception" not in out
    # One launch, one diagnosis: the second test says in one line that the server failed and why. (Under
    # CI=true pytest's short summary repeats a whole message, so count in the errors section alone.)
    errors_section = out.split("short test summary info")[0]
    assert out.count("launching: log") == 1
    assert errors_section.count("Full log:") == 1, out
    result.stdout.fnmatch_lines(["*[[]sglang p[]] the server for this profile failed to start (the first test that "
                                 "used it shows the whole diagnosis)*"])
    if fault in ("traceback", "exit"):  # the short summary line carries the root cause
        result.stdout.fnmatch_lines(["ERROR test_user.py::test_ready?p? - Failed: [[]sglang p[]] server * during "
                                     "startup*: AttributeError: 'KimiK25ForConditionalGeneration' object*"])
    if fault != "hang":
        assert "startup timeout" not in result.stdout.str()  # failed fast, did not wait the timeout out


def test_busy_port_is_an_error_naming_the_holder(pytester: pytest.Pytester, mark: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        project(pytester, profile_toml("p", mark, f"port = {port}"))
        result = run(pytester, "--sglang-profile=p", "--sglang-sim")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*Port 127.0.0.1:{port} is busy: something listens on it; held by pid {os.getpid()}*",
                                 "*--sglang-url=http://127.0.0.1:*"])


def test_stale_server_answering_on_the_port_is_never_mistaken_for_ours(pytester: pytest.Pytester, mark: str) -> None:
    class Healthy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    stale = HTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=stale.serve_forever, daemon=True).start()
    try:
        project(pytester, profile_toml("p", mark, f"port = {stale.server_port}"))
        result = run(pytester, "--sglang-profile=p", "--sglang-sim")
    finally:
        stale.shutdown()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*is busy: a server answers on it (GET /health -> HTTP 200)*stale server*"])


def test_missing_model_path_is_reported_before_launch(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makefile(".toml", pyproject='[tool.pytest_sglang.profiles.p]\nmodel = "/no/such/model-dir"\n')
    pytester.makepyfile(test_user=READY_TEST)
    result = run(pytester, "--sglang-profile=p")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*profile 'p', key 'model': model path /no/such/model-dir does not exist*"])


def test_server_dying_mid_session_fails_later_tests_with_its_traceback(pytester: pytest.Pytester, mark: str) -> None:
    tests = """
import requests
def test_first_request(sglang_server):
    r = requests.post(sglang_server.url("/generate"), json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200
def test_after_the_crash(sglang_server):
    import time; time.sleep(1.5)
    requests.get(sglang_server.url("/health"), timeout=5)
def test_later(sglang_server):
    pass
"""
    project(pytester, profile_toml("p", mark, sim="startup_seconds = 0.6, crash_after_requests = 1"), tests)
    result = run(pytester, "--sglang-profile=p", "--sglang-sim")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert out.count("server died during the session") >= 2, out
    # Each short-summary line says the server died, not the ConnectionError the test saw (under CI=true pytest
    # prints the whole message there, the test's own error included on a later line).
    failed = [line for line in out.split("short test summary")[-1].splitlines() if line.startswith("FAILED")]
    assert len(failed) == 2 and all("server died" in line for line in failed), failed  # cut to the width
    result.stdout.fnmatch_lines(["FAILED test_user.py::test_later?p? - Failed: ?sglang p? server died*"])
    assert "last phase: ready)" in out, "it had been ready, whatever its last log line"
    result.stdout.fnmatch_lines(["*sglang servers*", "p: ready in * s, then DIED during the session: *"])


def test_stubborn_children_that_escape_the_group_are_killed(pytester: pytest.Pytester, mark: str) -> None:
    toml = profile_toml("p", mark, 'args = ["--tp", "2"]\nshutdown_grace = 1',
                        "startup_seconds = 0.6, ignore_sigterm = true")
    tests = READY_TEST + """
import os
import psutil
def test_children_escaped(sglang_server):
    marked = [p for p in psutil.process_iter() if p.pid != os.getpid() and _mark(p)]
    assert any(os.getsid(p.pid) != os.getsid(sglang_server.pid) for p in marked), "no child escaped via setsid"
def _mark(p):
    try:
        return p.environ().get("TEST_MARK") == "%s"
    except psutil.Error:
        return False
""".replace("%s", mark)
    project(pytester, toml, tests)
    run(pytester, "--sglang-profile=p", "--sglang-sim").assert_outcomes(passed=2)
    assert not wait_for_no_processes(mark, timeout=5)


def _start_pytest(pytester: pytest.Pytester, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", *args],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=interruptible,
    )


def _pytest_during_a_long_startup(pytester: pytest.Pytester, mark: str) -> subprocess.Popen[str]:
    """A pytest run whose server (tp 2, children setsid'd and deaf to SIGTERM) is mid-way through a 600 s start."""
    project(pytester, profile_toml("p", mark, 'args = ["--tp", "2"]',
                                   sim="startup_seconds = 600, ignore_sigterm = true"))
    proc = _start_pytest(pytester, "--sglang-profile=p", "--sglang-sim")
    _wait_for_server_processes(mark)
    return proc


def _wait_for_server_processes(mark: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while len(marked_processes(mark)) < 4:  # launcher, two ranks (escaped: setsid), detokenizer
        assert time.monotonic() < deadline, "the server never started"
        time.sleep(0.1)


def test_ctrl_c_during_a_long_startup_leaves_nothing(pytester: pytest.Pytester, mark: str) -> None:
    proc = _pytest_during_a_long_startup(pytester, mark)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "KeyboardInterrupt" in out
    assert re.search(r"^p: INTERRUPTED during startup after \d+\.\d s(?: \(last phase: [^)]+\))?; the server's "
                     r"process tree was killed", out, re.M), out
    assert "attached to a running server" not in out
    assert not wait_for_no_processes(mark, timeout=10)


def test_pytest_killed_outright_still_leaves_nothing(pytester: pytest.Pytester, mark: str) -> None:
    proc = _pytest_during_a_long_startup(pytester, mark)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert not wait_for_no_processes(mark, timeout=15), "the reaper did not clean up after a killed pytest"


@pytest.fixture
def running_sim(mark: str, tmp_path: Path) -> Iterator[str]:
    """A simulator started by hand, as a user's own server: its base URL."""
    port = _free_port()
    env = {**os.environ, "TEST_MARK": mark, "PYTEST_SGLANG_SIM": '{"startup_seconds": 0.3}'}
    log = open(tmp_path / "sim.log", "wb")  # noqa: SIM115 - closed below
    sim = subprocess.Popen([sys.executable, "-m", "pytest_sglang.sim", "--model-path", "m", "--port", str(port)],
                           env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                           preexec_fn=die_with_pytest())
    try:
        yield f"http://127.0.0.1:{port}"
        assert sim.poll() is None, "an attached server must not be killed"
    finally:
        os.killpg(sim.pid, signal.SIGKILL)
        sim.wait()
        log.close()


def test_attach_with_url_launches_and_kills_nothing(pytester: pytest.Pytester, running_sim: str) -> None:
    pytester.makepyfile(test_user="def test_attached(sglang_server):\n"
                                  "    assert sglang_server.startup_seconds is None\n"
                                  "    assert sglang_server.phases == {}\n"
                                  "    assert sglang_server.pid is None\n")
    result = run(pytester, f"--sglang-url={running_sim}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*url: attached to a running server at http://127.0.0.1:* (startup not measured)"])


def test_attached_startup_is_never_checked_or_recorded(pytester: pytest.Pytester, running_sim: str) -> None:
    pytester.makepyfile(test_user="def test_startup(sglang_server, sglang_baseline):\n"
                                  "    sglang_baseline.check(sglang_server, startup_seconds='20%')\n")
    baseline = pytester.path / "baseline.json"
    result = run(pytester, f"--sglang-url={running_sim}", f"--sglang-baseline={baseline}",
                 "--sglang-update-baseline", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*this run did not start the server (--sglang-url)*no startup time*"])
    assert not baseline.exists(), "nothing may be recorded from an attached server"


def test_url_with_a_path_says_to_drop_it(pytester: pytest.Pytester, running_sim: str) -> None:
    pytester.makepyfile(test_user=READY_TEST)
    result = run(pytester, f"--sglang-url={running_sim}/v1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, "a wrong path is known before any test runs"
    result.stderr.fnmatch_lines([f"*--sglang-url={running_sim}/v1 has a path (/v1): give the server's root, "
                                 f"--sglang-url={running_sim};*"])


def test_url_with_several_profiles_is_a_usage_error(pytester: pytest.Pytester, mark: str) -> None:
    project(pytester, profile_toml("a", mark) + profile_toml("b", mark))
    result = run(pytester, "--sglang-url=http://127.0.0.1:1", "--sglang-profile=a,b")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--sglang-url names one running server, but 2 profiles were selected (a, b)*"])


def test_url_that_does_not_answer_is_a_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=READY_TEST)
    result = run(pytester, f"--sglang-url=http://127.0.0.1:{_free_port()}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--sglang-url server does not answer GET /health with 200*"])


def test_reuse_attaches_to_the_kept_server_next_run(pytester: pytest.Pytester, mark: str) -> None:
    project(pytester, profile_toml("p", mark))
    first = pytester.runpytest_subprocess("-s", "--sglang-profile=p", "--sglang-sim", "--sglang-reuse")
    first.assert_outcomes(passed=1)
    try:
        kept = marked_processes(mark)
        assert kept, "--sglang-reuse must keep the server after the session"
        first.stdout.fnmatch_lines(["kept: p: pid * on port *; stop it with `pytest --sglang-stop`"])
        second = pytester.runpytest_subprocess("-s", "--sglang-profile=p", "--sglang-sim", "--sglang-reuse")
        second.assert_outcomes(passed=1)
        second.stdout.fnmatch_lines(["*reusing the server on port*", "p: reused the kept server, pid * on port *"])
        assert _pid_line(first) == _pid_line(second)
    finally:
        for proc in marked_processes(mark):
            proc.kill()


def test_a_launch_onto_the_port_of_a_kept_server_says_how_to_stop_it(pytester: pytest.Pytester, mark: str) -> None:
    project(pytester, profile_toml("p", mark, f"port = {_free_port()}"))
    args = ("-p", "no:cacheprovider", "--sglang-profile=p", "--sglang-sim")
    pytester.runpytest_subprocess(*args, "--sglang-reuse").assert_outcomes(passed=1)
    try:
        plain = pytester.runpytest_subprocess(*args)
        plain.assert_outcomes(errors=1)
        plain.stdout.fnmatch_lines(["*is busy: it is the server that --sglang-reuse kept for profile 'p' (pid *). "
                                    "Stop it with `pytest --sglang-stop`, or run with --sglang-reuse to use it.*"])
    finally:
        assert pytester.runpytest_subprocess("--sglang-stop").ret == 0
    assert not wait_for_no_processes(mark, timeout=15)


def test_reuse_relaunches_when_a_sim_knob_changed_and_needs_no_cache_provider(
    pytester: pytest.Pytester, mark: str
) -> None:
    project(pytester, profile_toml("p", mark, sim="startup_seconds = 0.6"))
    args = ("-p", "no:cacheprovider", "-s", "--sglang-profile=p", "--sglang-sim", "--sglang-reuse")
    first = pytester.runpytest_subprocess(*args)
    first.assert_outcomes(passed=1)
    old_pid = int(_pid_line(first).split()[1])
    project(pytester, profile_toml("p", mark, sim="startup_seconds = 0.6, crash_after_requests = 1"))
    second = pytester.runpytest_subprocess(*args)
    second.assert_outcomes(passed=1)
    second.stdout.fnmatch_lines([f"*not reusing the kept server: its profile changed; stopping pid {old_pid} and "
                                 "launching anew*"])
    assert int(_pid_line(second).split()[1]) != old_pid
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE
    stop = pytester.runpytest_subprocess("--sglang-stop")
    assert stop.ret == 0
    stop.stdout.fnmatch_lines(["pytest-sglang --sglang-stop: stopped p: pid * on port *"])
    assert not wait_for_no_processes(mark, timeout=15), "--sglang-stop must stop the kept tree"
    again = pytester.runpytest_subprocess("--sglang-stop")
    again.stdout.fnmatch_lines(["pytest-sglang --sglang-stop: no kept servers for this rootdir"])


def test_api_key_never_reaches_the_terminal(pytester: pytest.Pytester, mark: str) -> None:
    toml = profile_toml("p", mark, 'args = ["--api-key", "sk-topsecret-123"]',
                        'startup_seconds = 0.6, fault = "exit"')
    project(pytester, toml)
    result = run(pytester, "--sglang-profile=p", "--sglang-sim")
    result.assert_outcomes(errors=1)
    assert "sk-topsecret-123" not in result.stdout.str() + result.stderr.str()
    assert "--api-key ***" in result.stdout.str()


def _pid_line(result: pytest.RunResult) -> str:
    return next(line for line in result.stdout.lines if line.startswith("PID"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_json_flag_values_and_a_reused_log_dir(pytester: pytest.Pytester, mark: str) -> None:
    """Braces in args reach the server as written; a previous run's log (with its ready line) is not read."""
    body = 'args = ["--json-model-override-args", \'{"rope_scaling": {"factor": 2}}\']'
    project(pytester, profile_toml("p", mark, body, 'startup_seconds = 2.0, fault = "hang"') + "startup_timeout = 3\n")
    logs = pytester.path / "logs"
    logs.mkdir()
    (logs / "p.log").write_text("[2026-01-01 00:00:00] The server is fired up and ready to roll!\n")
    result = run(pytester, "--sglang-profile=p", "--sglang-sim", f"--sglang-log-dir={logs}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*not ready within its startup timeout of 3 s*",
                                 '*--json-model-override-args {"rope_scaling": {"factor": 2}}*'])
