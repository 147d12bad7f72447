"""The sglang_ab marker and fixture through real pytest runs on the simulator: both servers alive, reuse of an
open server, pass / regressed / not judged, one side failing to start, a pair not selected, bracketing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import profile_toml

WORKLOAD = "num_requests=8, concurrency=8, input_len=16, output_len=24"
# Paces low enough that a loaded 2-core runner (four CPU burners beside the suite) keeps up with the streams: at
# 400 tok/s a stream, 3,200 chunks/s, the starved simulator and client read main at about 0.7 of its pace, which
# squeezed a 0.5x candidate to 0.68x and main's bracket drifted 25 %; at 100 tok/s the ratio is the knobs'.
FAST = "startup_seconds = 0.2, decode_tok_s = 100, ttft_ms = 5"
SLOW = "startup_seconds = 0.2, decode_tok_s = 50, ttft_ms = 5"

TESTS = f'''
import pytest

def test_plain(sglang_server):
    assert sglang_server.base_url

@pytest.mark.sglang_ab("main", "same")
def test_same_passes(sglang_ab):
    r = sglang_ab({WORKLOAD}, rounds=6)
    assert r.pairs == 6 and len(r.rounds["main"]) == len(r.rounds["same"]) == 6
    r.check(output_throughput="25%", median_itl_ms="25%", max_cv="off")  # a loaded CI runner: wide bounds
    print("RATIO", r.ratio["output_throughput"], r.ci["output_throughput"], r.p_value["output_throughput"])

@pytest.mark.sglang_ab("main", "same")
def test_few_pairs_not_judged(sglang_ab):
    sglang_ab({WORKLOAD}, rounds=3).check(output_throughput="5%")

@pytest.mark.sglang_ab("main", "slow")
def test_slow_regresses(sglang_ab):
    sglang_ab({WORKLOAD}, rounds=8).check(output_throughput="5%", max_cv="off")

@pytest.mark.sglang_ab("main", "broken")
def test_broken_side(sglang_ab):
    sglang_ab({WORKLOAD}, rounds=6)

@pytest.mark.sglang_ab("main", "elsewhere")
def test_not_selected(sglang_ab):
    sglang_ab({WORKLOAD}, rounds=6)
'''


def test_ab_pass_regress_not_judged_broken_and_unselected(pytester: pytest.Pytester, mark: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    pytester.makefile(".toml", pyproject="".join([
        profile_toml("main", mark, sim=FAST), profile_toml("same", mark, sim=FAST),
        profile_toml("slow", mark, sim=SLOW), profile_toml("elsewhere", mark, sim=FAST),
        profile_toml("broken", mark, sim="startup_seconds = 0.2, fault = 'bad-flag'")]))
    pytester.makepyfile(test_ab=TESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", "-s", "-rsw",
                                           "--sglang-profile=same,slow,broken,main", f"--sglang-report={report}",
                                           "--junitxml=junit.xml", timeout=240)
    result.assert_outcomes(passed=5, failed=1, errors=2, skipped=1)
    out = result.stdout.str()
    ratio = float(re.search(r"RATIO (\S+)", out).group(1))  # type: ignore[union-attr]
    assert 0.9 < ratio < 1.1
    result.stdout.fnmatch_lines([
        "*A/B main vs broken: the server of profile 'broken' failed to start while main was running*"
        "--mem-fraction-static*",
        "*slow output_throughput 0.[4-7]?x main (95% CI 0.*, 8 pairs, p=0.0*; tolerance 5%) regressed*",
        "*NotJudgedWarning: output_throughput not judged: 3 pairs cannot reach significance at 95% (rounds=6 can)*",
        "*SKIPPED*A/B main vs elsewhere: profile 'elsewhere' is not selected*--sglang-profile=same,slow,"
        "broken,main,elsewhere*",
    ])
    # main: test_plain's server, still open, serves every pair; same and slow: launched again for theirs
    launches = re.findall(r"\[sglang (\w+)\] launching", out)
    assert launches == ["same", "slow", "broken", "main", "same", "slow", "broken"], launches
    data = json.loads(report.read_text())
    ab = {a["nodeid"].rsplit("::", 1)[1]: a for a in data["ab"]}
    assert ab["test_slow_regresses"]["gate"] == "regressed" and ab["test_same_passes"]["gate"] == "passed"
    assert ab["test_few_pairs_not_judged"]["gate"] == "not-judged"
    assert ab["test_slow_regresses"]["ratio"]["output_throughput"] < 0.8
    result.stdout.fnmatch_lines(["A/B slow vs main: output_throughput 0.*x (95% CI 0.*-0.*), 8 pairs interleaved, "
                                 "p=0.0*: REGRESSED  *test_slow_regresses?",
                                 "REGRESSED slow vs main test_ab.py::test_slow_regresses: slow output_throughput*"])
    summary = (pytester.path / "summary.md").read_text()
    assert "- A/B same vs main: output_throughput" in summary and "6 pairs interleaved" in summary
    junit = (pytester.path / "junit.xml").read_text()
    assert 'name="sglang_ab_ratio_output_throughput"' in junit and 'name="sglang_gate" value="regressed"' in junit


BRACKETED = f'''
import pytest

@pytest.mark.sglang_ab("main", "slow", together=False)
def test_bracketed(sglang_ab):
    r = sglang_ab({WORKLOAD}, rounds=6)
    print("DRIFT", r.drift_pct)
    r.check(output_throughput="20%", max_cv="off")  # 0.5x: wholly past 20 % whatever main's bracket drifted
'''


def test_bracketing_runs_one_server_at_a_time_and_reports_the_drift(pytester: pytest.Pytester, mark: str,
                                                                   tmp_path: Path) -> None:
    pytester.makefile(".toml", pyproject=profile_toml("main", mark, sim=FAST) + profile_toml("slow", mark, sim=SLOW))
    pytester.makepyfile(test_ab=BRACKETED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", "-s",
                                           "--sglang-profile=main,slow", timeout=120)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*slow output_throughput 0.[4-7]?x main (95% CI *, 6 vs 3+3 rounds, p=*; main drifted "
                                 "*% from before to after; instance noise not yet known (0 of 5 A/A runs); "
                                 "catches about *% at 80% power (6 rounds); tolerance 20%) regressed*"])
    launches = re.findall(r"\[sglang (\w+)\] launching", result.stdout.str())
    assert launches == ["main", "slow", "main"]


def test_a_drifting_machine_is_not_judged(pytester: pytest.Pytester, mark: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Both profiles at one pace: the candidate's rounds sit between main's before and after, so the interval of the
    # change spans the tolerance's edge (a real difference wholly past it would be judged whatever the drift).
    drifting = "startup_seconds = 0.2, decode_tok_s = 100, ttft_ms = 5, wander = 3.0"
    pytester.makefile(".toml", pyproject=profile_toml("main", mark, sim=drifting) +
                      profile_toml("slow", mark, sim=drifting))
    pytester.makepyfile(test_ab=BRACKETED)
    monkeypatch.setenv("PYTEST_SGLANG_SIM_SEED", "7")  # a walk that moves the host by far more than 20 % in seconds
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", "-rw",
                                           "--sglang-profile=main,slow", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*NotJudgedWarning: output_throughput not judged: the machine drifted *% during the "
                                 "comparison (main before vs after; tolerance 20%)*"])


MISUSED = """
import pytest

@pytest.mark.sglang_ab("main")
def test_one_profile(sglang_ab):
    pass

@pytest.mark.sglang_ab("main", "main")
def test_same_profile_twice(sglang_ab):
    pass

def test_unmarked(sglang_ab):
    pass

@pytest.mark.sglang_ab("main", "other", together="no")
def test_together_not_a_bool(sglang_ab):
    pass

@pytest.mark.sglang_ab("main", "other")
def test_pair(sglang_ab):
    pass
"""


@pytest.mark.parametrize("option", ["-n1", "--sglang-url=http://127.0.0.1:9"])
def test_misuse_says_what_to_do(pytester: pytest.Pytester, mark: str, option: str) -> None:
    pytester.makefile(".toml", pyproject=profile_toml("main", mark, sim=FAST) + profile_toml("other", mark, sim=FAST))
    pytester.makepyfile(test_ab=MISUSED)
    # --sglang-url attaches to a running server: with --sglang-sim beside it the run would be a usage error
    given = ["--sglang-sim", "--sglang-profile=main,other"] if option.startswith("-n") else ["--sglang-profile=main"]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", *given, option, timeout=120)
    out = result.stdout.str()
    assert "takes two different profile names and together=True|False, got args ('main',)" in out
    assert "got args ('main', 'main')" in out
    assert 'needs to know which two profiles to compare: mark the test @pytest.mark.sglang_ab("main", ' in out
    if option.startswith("-n"):
        assert "together=...) must be True or False, got 'no'" in out
        assert "sglang_ab does not run under pytest-xdist yet" in out and "without -n" in out
    else:
        assert "sglang_ab launches both profiles' servers; --sglang-url attaches to one running server" in out


def test_the_pairs_startup_is_not_charged_to_the_tests_timeout(pytester: pytest.Pytester, mark: str) -> None:
    # margins the test sets: the two startups (6 s each) add up past the 10-s timeout, which leaves the rounds
    # (a second unloaded, at FAST's pace) 10 s on a loaded runner (at 400 tok/s and 8 s, a suite run under four
    # CPU burners and a second suite timed out)
    slow_start = "startup_seconds = 6, decode_tok_s = 100, ttft_ms = 5"
    pytester.makefile(".toml", pyproject=profile_toml("main", mark, sim=slow_start) +
                      profile_toml("same", mark, sim=slow_start))
    pytester.makepyfile(test_ab=f'''
import pytest

@pytest.mark.sglang_ab("main", "same")
def test_pair(sglang_ab):
    sglang_ab({WORKLOAD}, rounds=2)
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", "--timeout=10",
                                           "--sglang-profile=main,same", timeout=120)
    result.assert_outcomes(passed=1)
