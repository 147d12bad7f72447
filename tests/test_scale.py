"""One launch for a whole pytest-xdist run, startups that pytest-timeout cannot cut, and a stall deadline: real
pytest runs with -n, the real simulator, every process accounted for."""

from __future__ import annotations

import json
import re

import pytest
from helpers import profile_toml, wait_for_no_processes

pytestmark = pytest.mark.timeout(240)

SHARED = """
import json, os, psutil, pytest

def others_alive(mine):
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get("TEST_MARK") == os.environ["MARK"] and env.get("PROFILE_TAG") not in (None, mine):
            if proc.status() != psutil.STATUS_ZOMBIE:
                return True
    return False

@pytest.mark.parametrize("n", range(6))
def test_uses_the_server(sglang_server, n):
    assert not others_alive(sglang_server.profile), "servers of two profiles ran at once"
    with open(os.environ["SEEN"], "a") as fh:
        fh.write(json.dumps([sglang_server.profile, sglang_server.pid, os.environ["PYTEST_XDIST_WORKER"],
                             sglang_server.origin]) + "\\n")
"""


def shared_profile(name: str, mark: str, sim: str = "startup_seconds = 1.0") -> str:
    return profile_toml(name, mark, sim=sim).replace(f'TEST_MARK = "{mark}"',
                                                    f'TEST_MARK = "{mark}", PROFILE_TAG = "{name}"')


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=200)


def seen(pytester: pytest.Pytester) -> list[tuple[str, int, str, str]]:
    return [tuple(json.loads(line)) for line in (pytester.path / "seen.jsonl").read_text().splitlines()]


def test_xdist_workers_share_one_launch_per_profile(pytester: pytest.Pytester, mark: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARK", mark)
    monkeypatch.setenv("SEEN", str(pytester.path / "seen.jsonl"))
    pytester.makefile(".toml", pyproject=shared_profile("a", mark) + shared_profile("b", mark))
    pytester.makepyfile(test_shared=SHARED)
    report = pytester.path / "report.json"
    result = run(pytester, "-n", "3", "--sglang-profile=a,b", "--sglang-sim", f"--sglang-report={report}")
    result.assert_outcomes(passed=12)
    rows = seen(pytester)
    assert {profile for profile, _, _, _ in rows} == {"a", "b"}
    for profile in ("a", "b"):
        pids = {pid for p, pid, _, _ in rows if p == profile}
        assert len(pids) == 1, f"profile {profile} launched {len(pids)} times: {pids}"
        origins = {worker: origin for p, _, worker, origin in rows if p == profile}
        assert list(origins.values()).count("launched") == 1, origins  # the others joined it
        assert set(origins.values()) <= {"launched", "joined"}, origins
    assert len({worker for _, _, worker, _ in rows}) > 1, "the tests did not spread over the workers"
    assert not wait_for_no_processes(mark, timeout=15), "the controller must stop every shared server"
    result.stdout.fnmatch_lines(["*sglang servers*", "a: ready in * s*", "b: ready in * s*"])
    profiles = json.loads(report.read_text())["profiles"]
    assert profiles["a"]["startup_seconds"] > 0 and profiles["b"]["startup_seconds"] > 0
    assert profiles["a"]["origin"] == profiles["b"]["origin"] == "launched"  # the launching worker's record


def test_a_crashed_worker_leaves_no_orphan(pytester: pytest.Pytester, mark: str, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    pytester.makefile(".toml", pyproject=profile_toml("p", mark, sim="startup_seconds = 0.5"))
    pytester.makepyfile(test_crash="""
import os
def test_kills_its_worker(sglang_server):
    os._exit(3)
def test_other(sglang_server):
    assert sglang_server.pid
""")
    result = run(pytester, "-n", "2", "--sglang-profile=p", "--sglang-sim")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1 and outcomes.get("passed") == 1, result.stdout.str()
    assert not wait_for_no_processes(mark, timeout=15), "a crashed worker must leave no server behind"


def test_startup_is_not_charged_to_the_first_tests_timeout(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makefile(".toml", pyproject=profile_toml("p", mark, sim="startup_seconds = 4"))
    pytester.makepyfile(test_user="def test_first(sglang_server):\n    pass\n"
                                  "def test_second(sglang_server):\n    pass\n")
    for method in ("signal", "thread"):
        result = run(pytester, "--sglang-profile=p", "--sglang-sim", "--timeout=2", f"--timeout-method={method}")
        result.assert_outcomes(passed=2)
        assert "Timeout" not in result.stdout.str()
        assert not wait_for_no_processes(mark, timeout=15)


def test_the_tests_own_timeout_still_holds_and_leaves_no_server(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makefile(".toml", pyproject=profile_toml("p", mark, sim="startup_seconds = 0.5"))
    pytester.makepyfile(test_user="import time\ndef test_slow(sglang_server):\n    time.sleep(30)\n")
    for method in ("signal", "thread"):
        result = run(pytester, "--sglang-profile=p", "--sglang-sim", "--timeout=2", f"--timeout-method={method}")
        assert "Timeout" in result.stdout.str() + result.stderr.str()
        assert not wait_for_no_processes(mark, timeout=20), f"--timeout-method={method} left the server running"


def test_a_silent_hang_fails_at_the_stall_timeout_not_the_hard_cap(pytester: pytest.Pytester, mark: str) -> None:
    toml = profile_toml("p", mark, "startup_timeout = 120\nstall_timeout = 2",
                        sim='startup_seconds = 1.0, fault = "hang"')
    pytester.makefile(".toml", pyproject=toml)
    pytester.makepyfile(test_user="def test_first(sglang_server):\n    pass\n")
    result = run(pytester, "--sglang-profile=p", "--sglang-sim")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*no progress for 2 s in phase * (stall_timeout 2 s*", "*Last * log lines:*",
                                 "*Try: *raise stall_timeout in the profile*"])
    assert "startup timeout" not in result.stdout.str()
    assert result.duration < 120  # a margin the profile sets: the stall ended it long before the 120 s cap could


def test_the_probes_own_requests_are_not_progress(pytester: pytest.Pytester, mark: str) -> None:
    # The ready line comes, then GET /healthz answers 404 on every poll, each answer an access-log line: the stall
    # deadline still holds, and says what the probe got.
    toml = profile_toml("p", mark, 'startup_timeout = 60\nstall_timeout = 2\nhealth_path = "/healthz"',
                        sim="startup_seconds = 0.3")
    pytester.makefile(".toml", pyproject=toml)
    pytester.makepyfile(test_user="def test_first(sglang_server):\n    pass\n\ndef test_second(sglang_server):\n"
                                  "    pass\n")
    result = run(pytester, "--sglang-profile=p", "--sglang-sim", "--sglang-log-dir=logs")
    result.assert_outcomes(errors=2)
    # the refusal (the same 404 for stall_timeout) or the stall, whichever the loop sees first: both name the
    # probe's answer and the stall_timeout on one line, in either order
    assert any("GET /healthz answered 404 for 2 s" in line and "stall_timeout 2 s" in line
               for line in result.outlines), result.stdout.str()
    result.stdout.fnmatch_lines([
        "*Try:*health_path*",
        "*the server for this profile failed to start (*)*GET /healthz answered 404 for 2 s*",
        "p: FAILED TO START:*GET /healthz answered 404 for 2 s*",
    ])
    assert "last phase: ready)" not in result.stdout.str()
    assert (pytester.path / "logs" / "p.log").read_text().count('"GET /healthz HTTP/1.1" 404') > 10



def test_profile_comparisons_see_every_workers_results(pytester: pytest.Pytester, mark: str) -> None:
    toml = (profile_toml("slow", mark, sim="startup_seconds = 0.3, decode_tok_s = 40")
            + profile_toml("fast", mark, sim="startup_seconds = 0.3, decode_tok_s = 400"))
    pytester.makefile(".toml", pyproject=toml)
    pytester.makepyfile(test_user="""
import pytest

@pytest.mark.parametrize("n", range(3))
def test_other(sglang_server, n):
    pass

def test_throughput(sglang_server, sglang_bench):
    sglang_bench(num_requests=4, concurrency=4, input_len=8, output_len=16, warmup=0)

@pytest.mark.sglang_compare
def test_compare(sglang_results):
    changes = sglang_results.compare("fast", "slow", "test_throughput", output_throughput="50%")
    assert changes["output_throughput"] > 50
""")
    report = pytester.path / "report.json"
    result = run(pytester, "-n", "2", "--sglang-profile=slow,fast", "--sglang-sim", f"--sglang-report={report}")
    result.assert_outcomes(passed=9)
    benches = {name: prof["benchmarks"] for name, prof in json.loads(report.read_text())["profiles"].items()}
    assert [len(benches["slow"]), len(benches["fast"])] == [1, 1], "the report must hold every worker's figures"
    assert not wait_for_no_processes(mark, timeout=15)


def test_greedy_outputs_are_compared_across_workers(pytester: pytest.Pytester, mark: str) -> None:
    """Each profile's sglang_outputs may run on another worker than the comparison: it still sees them all."""
    sim = "startup_seconds = 0.3, decode_tok_s = 400, ttft_ms = 5"
    toml = (profile_toml("base", mark, sim=sim) + profile_toml("same", mark, sim=sim)
            + profile_toml("changed", mark, sim=sim + ", output_variant = 1"))
    pytester.makefile(".toml", pyproject=toml)
    pytester.makepyfile(test_user="""
import pytest

@pytest.mark.parametrize("n", range(3))
def test_other(sglang_server, n):
    pass

def test_outputs(sglang_outputs):
    sglang_outputs(["The capital city of France is", [11, 12, 13]], max_tokens=8)

@pytest.mark.sglang_compare
def test_same(sglang_results):
    assert sglang_results.compare_outputs("base", "same").compared == 2

@pytest.mark.sglang_compare
def test_changed(sglang_results):
    sglang_results.compare_outputs("base", "changed")
""")
    result = run(pytester, "-n", "2", "--sglang-profile=base,same,changed", "--sglang-sim")
    result.assert_outcomes(passed=13, failed=1)
    out = result.stdout.str()
    assert "greedy outputs differ between profiles 'base' and 'changed': 2 of 2 prompts differ" in out, out
    assert "first differing token at position 4 (of 8 and 8)" in out, out
    assert not wait_for_no_processes(mark, timeout=15)


def test_under_xdist_the_controller_shows_the_startup_as_it_happens(pytester: pytest.Pytester, mark: str) -> None:
    # a worker's own terminal output is not shown until its tests report: the controller relays its status lines
    pytester.makefile(".toml", pyproject=profile_toml("p", mark, sim="startup_seconds = 1.0"))
    pytester.makepyfile(test_user="def test_first(sglang_server):\n    pass\n\ndef test_second(sglang_server):\n"
                                  "    pass\n")
    result = run(pytester, "-n", "2", "--sglang-profile=p", "--sglang-sim")
    result.assert_outcomes(passed=2)
    out = result.stdout.lines
    launching = next(i for i, line in enumerate(out) if line.startswith("[sglang p] launching"))
    phases = [line for line in out[launching:] if re.match(r"\[sglang p\] \d+ s  ", line)]
    assert phases, result.stdout.str()
    assert launching < next(i for i, line in enumerate(out) if "sglang servers" in line)
    assert not wait_for_no_processes(mark, timeout=15)
