"""A fleet under pytest, on the simulator playing every member: one readiness, each member named when it fails,
one teardown on every path."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from helpers import interruptible, marked_processes, profile_toml, wait_for_no_processes


def fleet_toml(name: str, mark: str, body: str, sim: str = "startup_seconds = 0.6") -> str:
    return profile_toml(name, mark, body, sim=sim)


DP = 'replicas = 2\nrouter = { args = ["--policy", "round_robin"] }'
PD = "prefill = { replicas = 1 }\ndecode = { replicas = 1 }"


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", *args, timeout=240)


SERVES = """
import requests

def complete(server, prompt):
    r = requests.post(server.url("/v1/completions"), json={"model": "m", "prompt": prompt, "max_tokens": 8,
                      "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]

def served(member):
    text = requests.get(member.url("/metrics")).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("sglang:num_requests_total"))

def test_members(sglang_server):
    members = sglang_server.members
    assert list(members) == EXPECTED
    assert [m.role for m in members.values()] == ROLES
    assert sglang_server.base_url == members["router"].base_url
    for name, member in members.items():
        assert member.log_path.name == f"f.{name}.log" and member.log_path.is_file()
        assert member.pid > 0 and member.startup_seconds > 0

def test_serves_through_the_router(sglang_server):
    assert [complete(sglang_server, f"prompt {i}") for i in range(6)]
    counts = {name: served(m) for name, m in sglang_server.members.items() if m.role != "router"}
    print("SERVED", counts)
    assert all(count > 0 for count in counts.values()), counts

def test_bench_through_the_router(sglang_bench):
    result = sglang_bench(num_requests=8, concurrency=4, input_len=16, output_len=8, warmup=0)
    assert result.completed == 8
    servers = [name for name in EXPECTED if name != "router"]
    assert list(result.members) == servers
    answering = [load for load in result.members.values() if load.role in ("worker", "decode")]
    assert sum(load.requests for load in answering) == 8
    assert sum(load.generation_tokens for load in answering) == 8 * 8
"""


@pytest.mark.parametrize("topology, members, roles", [
    (DP, ["worker0", "worker1", "router"], ["worker", "worker", "router"]),
    (PD, ["prefill0", "decode0", "router"], ["prefill", "decode", "router"]),
], ids=["router", "pd"])
def test_a_fleet_is_one_server_to_its_tests(pytester: pytest.Pytester, mark: str, topology: str,
                                            members: list[str], roles: list[str]) -> None:
    pytester.makefile(".toml", pyproject=fleet_toml("f", mark, topology + '\nargs = ["--enable-metrics"]'))
    pytester.makepyfile(test_fleet=f"EXPECTED = {members!r}\nROLES = {roles!r}\n" + SERVES)
    result = run(pytester, "--sglang-profile=f", "-s", "--sglang-report=report.json")
    result.assert_outcomes(passed=3)
    page = (pytester.path / "report.html").read_text()
    assert "What each fleet member served" in page and f"{members[0]} ({roles[0]})" in page
    result.stdout.fnmatch_lines(["*[[]sglang f[]] launching *", "*servers ready after * s; router started*",
                                 "f: ready in *", f"fleet members: f test_bench_through_the_router: {members[0]} *"])
    assert not wait_for_no_processes(mark, timeout=20)


FIRST_AND_SECOND = "def test_first(sglang_server):\n    pass\n\ndef test_second(sglang_server):\n    pass\n"


def test_a_member_that_crashes_at_startup_fails_the_fleet_naming_it(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makefile(".toml", pyproject=fleet_toml(
        "f", mark, DP, sim='startup_seconds = 30, fault = "traceback", fault_after = 0.5, fault_member = "worker1"'))
    pytester.makepyfile(test_user=FIRST_AND_SECOND)
    result = run(pytester, "--sglang-profile=f")
    result.assert_outcomes(errors=2)
    out = result.stdout.str()
    assert "worker1 crashed during startup" in out or "worker1 exited during startup" in out, out
    result.stdout.fnmatch_lines(["*AttributeError: *", "*Full log: *f.worker1.log*",
                                 "f: FAILED TO START: worker1: AttributeError: * (log: *f.worker1.log)"])
    assert "worker0 crashed" not in out and "worker0 exited" not in out
    assert not wait_for_no_processes(mark, timeout=20), "a member outlived the failed startup"


def test_the_router_failing_at_startup_is_named_with_its_panic(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makefile(".toml", pyproject=fleet_toml(
        "f", mark, DP, sim='startup_seconds = 0.5, fault = "traceback", fault_member = "router"'))
    pytester.makepyfile(test_user=FIRST_AND_SECOND)
    result = run(pytester, "--sglang-profile=f")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*router: server * during startup*panicked at*", "*Full log: *f.router.log*"])
    assert not wait_for_no_processes(mark, timeout=20)


KILLS_A_MEMBER = """
import os, signal, time
import psutil

def test_1_kill_worker1(sglang_server):
    pid = sglang_server.members["worker1"].pid
    os.kill(pid, signal.SIGKILL)
    while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:  # dead, before the next test asks
        time.sleep(0.05)

def test_2_after_the_kill(sglang_server):
    pass

def test_3_still_after(sglang_server):
    pass
"""


def test_a_member_killed_mid_session_fails_the_next_tests_naming_it(pytester: pytest.Pytester, mark: str) -> None:
    # the router's own health check (every 60 s by default) has not noticed: the plugin watches the member itself
    pytester.makefile(".toml", pyproject=fleet_toml("f", mark, DP))
    pytester.makepyfile(test_user=KILLS_A_MEMBER)
    result = run(pytester, "--sglang-profile=f")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*fleet member worker1 (worker): server died during the session*",
                                 "f: ready in * s, then DIED during the session: worker1: * (log: *f.worker1.log)"])
    assert "fleet member worker0" not in result.stdout.str()
    assert not wait_for_no_processes(mark, timeout=20)


def test_a_member_killed_in_the_last_test_fails_the_run_at_teardown(pytester: pytest.Pytester, mark: str) -> None:
    # no later test checks it: the fixture's teardown does, and the run does not pass with a dead member
    pytester.makefile(".toml", pyproject=fleet_toml("f", mark, DP))
    pytester.makepyfile(test_user=KILLS_A_MEMBER.split("def test_2")[0])
    result = run(pytester, "--sglang-profile=f")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_1_kill_worker1*",
                                 "*fleet member worker1 (worker): server died during the session*",
                                 "f: ready in * s, then DIED during the session: worker1: *"])
    assert result.ret != 0
    assert not wait_for_no_processes(mark, timeout=20)


XDIST_TESTS = """
import os, requests

def test_through_the_router_{i}(sglang_server):
    assert list(sglang_server.members) == ["worker0", "worker1", "router"]
    assert [m.role for m in sglang_server.members.values()] == ["worker", "worker", "router"]
    r = requests.post(sglang_server.url("/generate"), json={{"text": "hi", "sampling_params": {{"max_new_tokens": 4}}}})
    assert r.status_code == 200, r.text
    with open(os.environ["SEEN"], "a") as fh:
        fh.write(f"{{os.getpid()}} {{sglang_server.members['router'].pid}}\\n")
"""


def test_xdist_workers_share_one_fleet(pytester: pytest.Pytester, mark: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = pytester.path / "seen.txt"
    monkeypatch.setenv("SEEN", str(seen))
    pytester.makefile(".toml", pyproject=fleet_toml("f", mark, DP))
    pytester.makepyfile(**{f"test_part{i}": XDIST_TESTS.format(i=i) for i in range(4)})
    result = run(pytester, "-n", "2", "--sglang-profile=f")
    result.assert_outcomes(passed=4)
    assert result.stdout.str().count("launching a fleet for every xdist worker") == 1, result.stdout.str()
    lines = [line.split() for line in seen.read_text().splitlines()]
    assert len({worker for worker, _ in lines}) == 2 and len({router for _, router in lines}) == 1, lines
    assert not wait_for_no_processes(mark, timeout=20)


def _pytest_during_a_long_fleet_startup(pytester: pytest.Pytester, mark: str) -> subprocess.Popen[str]:
    pytester.makefile(".toml", pyproject=fleet_toml("f", mark, DP, sim="startup_seconds = 600"))
    pytester.makepyfile(test_user=FIRST_AND_SECOND)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "--sglang-sim",
                             "--sglang-profile=f"], cwd=pytester.path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 60
    while len(marked_processes(mark)) < 6:  # two members: each a launcher, a scheduler and a detokenizer
        assert time.monotonic() < deadline and proc.poll() is None, "the fleet's members never started"
        time.sleep(0.1)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_pytest_stopped_during_a_fleet_startup_leaves_nothing(pytester: pytest.Pytester, mark: str,
                                                              sig: signal.Signals) -> None:
    proc = _pytest_during_a_long_fleet_startup(pytester, mark)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert not wait_for_no_processes(mark, timeout=20), f"fleet members outlived a {sig.name} of pytest"


def test_show_prints_every_members_command(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makefile(".toml", pyproject=fleet_toml("f", mark, PD))
    result = pytester.runpytest_subprocess("--sglang-show", "--sglang-profile=f", "--sglang-sim")
    result.stdout.fnmatch_lines([
        "profile f",
        "*a fleet of 2 prefill/decode servers behind a router*",
        "*prefill0 * -m pytest_sglang.sim *--disaggregation-mode prefill --disaggregation-bootstrap-port *",
        "*decode0 * --disaggregation-mode decode*",
        "*router * -m pytest_sglang.sim.router *--pd-disaggregation --prefill http://127.0.0.1:* --decode *",
        "*ready when*then the router's GET /readiness answers 200 counting 2 healthy*",
    ])
    assert result.ret == 0
    assert not marked_processes(mark)
