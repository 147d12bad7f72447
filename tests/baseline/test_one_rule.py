"""The one rule every check ends in (baseline/engine/verdict.settle): an interval wholly past the tolerance is
"regressed" whatever the spread behind it, one clear of the tolerance's bad edge is never "not judged", and only
an interval across that edge from samples over the spread limit is "not judged", saying how wide and what would
decide it. Recorded A/A runs judge an A/B check whenever they exist; each check says what it could have seen."""

from __future__ import annotations

import math

import pytest
from helpers import profile_toml

from pytest_sglang.baseline.directions import Tolerance
from pytest_sglang.baseline.engine import compare_ab, judge, judge_paired, judge_sessions
from pytest_sglang.baseline.engine.power import detectable_pct, history_se
from pytest_sglang.baseline.engine.verdict import placement, settle

FIVE = Tolerance.parse("output_throughput", "5%")
FIRST = [100.0, 104.0, 97.0, 101.0, 99.0, 103.0, 98.0, 100.0]
# The H200's 0.574x candidate (issue 24): the ratios spread over the 10 % limit, all far below 0.95.
SLOW_RATIOS = [0.45, 0.66, 0.52, 0.70, 0.55, 0.62, 0.49, 0.58]
# Identical servers on a noisy host: the ratios straddle the tolerance's edge.
NOISY_RATIOS = [0.82, 1.15, 0.95, 1.10, 0.86, 1.02, 0.90, 1.16]


def second(ratios: list[float]) -> list[float]:
    return [a * r for a, r in zip(FIRST, ratios, strict=True)]


def test_the_rule_itself() -> None:
    assert placement(-40.0, -10.0, 5.0) == "beyond" and placement(-4.0, 30.0, 5.0) == "clear"
    assert placement(-8.0, 2.0, 5.0) == "across"
    assert settle("ok", "beyond", too_wide=True) == "regressed"
    assert settle("ok", "clear", too_wide=True) == "ok"
    assert settle("ok", "across", too_wide=True) == "not-judged"
    assert settle("ok", "across", too_wide=False) == "ok"
    assert settle("ok", None, too_wide=True) == "not-judged"


def test_a_certain_a_b_regression_is_regressed_whatever_the_pairs_spread() -> None:
    j = judge_paired("output_throughput", FIRST, second(SLOW_RATIOS), FIVE, first_label="main",
                     second_label="mrr8")
    assert j.spread_cv_pct is not None and j.spread_cv_pct > 10.0  # over the default limit...
    assert j.ci is not None and j.ci[1] < 0.95  # ...but wholly past the tolerance
    assert j.status == "regressed" and j.reason is None


def test_an_interval_across_the_edge_and_too_wide_says_how_wide_and_what_decides_it() -> None:
    j = judge_paired("output_throughput", FIRST, second(NOISY_RATIOS), FIVE)
    assert j.status == "not-judged"
    assert j.spread_cv_pct is not None
    assert f"the paired ratios spread CV {j.spread_cv_pct:.1f}% over 8 pairs (limit 10%)" in j.message
    assert j.ci is not None and f"CI {j.ci[0]:.2f}-{j.ci[1]:.2f}x reaches both sides of the tolerance's edge " \
                                 "0.95x" in j.message
    assert "would decide a ratio this far from the edge, or 5 recorded A/A runs" in j.message


def test_a_spread_just_over_the_limit_is_printed_over_the_limit() -> None:
    ratios = [0.79, 1.00, 0.88, 1.03, 0.90, 1.03, 0.86, 1.04]
    j = judge_paired("output_throughput", FIRST, second(ratios), FIVE, max_cv_pct=10.0)
    cv = j.spread_cv_pct
    assert cv is not None and 10.0 < cv < 10.5
    assert j.status == "not-judged" and f"CV {cv:.1f}% over 8 pairs (limit 10%)" in j.message
    assert "CV 10% over" not in j.message


def test_clear_of_the_edge_is_judged_however_wide() -> None:
    wide_but_better = [1.00, 1.40, 0.99, 1.30, 1.05, 1.50, 1.02, 1.25]
    j = judge_paired("output_throughput", FIRST, second(wide_but_better), FIVE)
    assert j.spread_cv_pct is not None and j.spread_cv_pct > 10.0
    assert j.status in ("ok", "improved")


def test_recorded_a_a_runs_judge_even_what_the_pairs_spread_left_unjudged() -> None:
    aa = [math.log(r) for r in (1.05, 0.97, 1.02, 0.99, 1.03, 0.96, 1.01, 0.98)]
    outcome = compare_ab("main", "mrr8", {"output_throughput": (FIRST, second(SLOW_RATIOS))},
                         {"output_throughput": "5%"}, instance_noise={"output_throughput": aa})
    (j,) = outcome.judgements
    assert outcome.gate == "regressed" and j.method == "instance-noise" and j.aa_runs == 8
    assert j.instance_noise_cv_pct is not None and f"CV {j.instance_noise_cv_pct:.1f}% over 8 A/A runs" in j.message
    same = compare_ab("main", "same", {"output_throughput": (FIRST, second(NOISY_RATIOS))},
                      {"output_throughput": "5%"}, instance_noise={"output_throughput": [0.1, -0.1, 0.12, -0.08,
                                                                                          0.05, -0.11]})
    (k,) = same.judgements
    assert same.gate == "passed" and k.method == "instance-noise" and k.reason is None
    assert not k.message.startswith("output_throughput too noisy")


def test_a_certain_baseline_regression_is_regressed_whatever_the_rounds_spread() -> None:
    base = [100.0, 120.0, 90.0, 110.0, 95.0]  # CV over 10 %
    slow = [60.0, 74.0, 55.0, 68.0, 58.0]  # CV over 10 %, every round far below every baseline round
    j = judge("output_throughput", slow, base, FIVE, max_cv_pct=10.0)
    assert j.current_cv_pct is not None and j.current_cv_pct > 10.0
    assert j.status == "regressed" and j.ci_pct is not None and j.ci_pct[1] < -5.0


def test_a_session_beyond_the_session_noise_regresses_however_its_rounds_spread() -> None:
    sessions = [100.0, 103.0, 98.0, 101.0, 99.0, 102.0]
    wild_but_slow = [50.0, 65.0, 45.0, 60.0, 52.0]
    j = judge_sessions("output_throughput", wild_but_slow, sessions, FIVE, max_cv_pct=10.0)
    assert j.status == "regressed"
    ok_but_wild = [80.0, 120.0, 95.0, 110.0, 100.0]
    assert judge_sessions("output_throughput", ok_but_wild, sessions, FIVE, max_cv_pct=10.0).status == "not-judged"


@pytest.mark.parametrize("direction_metric", ["output_throughput", "median_ttft_ms"])
def test_what_a_check_could_have_seen_grows_with_noise_and_shrinks_with_samples(direction_metric: str) -> None:
    d = "higher" if direction_metric == "output_throughput" else "lower"
    quiet = detectable_pct(0.02, 5.0, d, alpha=0.025)  # type: ignore[arg-type]
    loud = detectable_pct(0.08, 5.0, d, alpha=0.025)  # type: ignore[arg-type]
    assert quiet is not None and loud is not None and 5.0 < quiet < loud
    assert detectable_pct(None, 5.0, d, alpha=0.025) is None  # type: ignore[arg-type]
    short, longer = history_se(0.08, runs=10), history_se(0.08, runs=30)
    assert short is not None and longer is not None and longer < short


def test_the_a_b_message_and_record_say_what_it_could_have_seen() -> None:
    outcome = compare_ab("main", "same", {"output_throughput": (FIRST, second([1.0] * 8))},
                         {"output_throughput": "5%"})
    (j,) = outcome.judgements
    assert j.detectable_pct is not None and f"catches about {j.detectable_pct:.0f}% at 80% power (8 pairs)" \
        in j.message
    assert outcome.to_dict()["checks"][0]["detectable_pct"] == j.detectable_pct


UNMEASURED_CHECK = """
def test_energy(sglang_bench, sglang_baseline):
    r = sglang_bench(num_requests=2, concurrency=2, input_len=8, output_len=8, warmup=0)
    sglang_baseline.check(r, energy_per_output_token_j="5%")
"""


@pytest.mark.parametrize("policy", ["default", "warn", "fail", "ini-fail"])
def test_what_a_not_judged_check_does_to_its_test(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                  mark: str, policy: str) -> None:
    """A figure no source measured (no GPU here) is "not judged": it warns and passes by default; with
    --sglang-not-judged=fail (or the ini option) the test fails saying why and which option made it fail."""
    monkeypatch.setenv("PYTEST_SGLANG_GPU_QUERY", "off")
    ini = 'sglang_not_judged = "fail"' if policy == "ini-fail" else ""
    pytester.makefile(".toml", pyproject=f"[tool.pytest.ini_options]\n{ini}\n" + profile_toml("p", mark))
    pytester.makepyfile(test_user=UNMEASURED_CHECK)
    args = ["-p", "no:cacheprovider", "--sglang-profile=p", "--sglang-sim"]
    if policy in ("warn", "fail"):
        args.append(f"--sglang-not-judged={policy}")
    result = pytester.runpytest(*args)
    if policy in ("fail", "ini-fail"):
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*energy_per_output_token_j not judged: *(--sglang-not-judged=fail makes this a "
                                     "failure)*"])
    else:
        result.assert_outcomes(passed=1, warnings=1)
        result.stdout.fnmatch_lines(["*NotJudgedWarning: energy_per_output_token_j not judged: *"])


def test_a_bad_not_judged_ini_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", pyproject='[tool.pytest.ini_options]\nsglang_not_judged = "maybe"\n')
    pytester.makepyfile(test_user="def test_plain():\n    assert True\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*sglang_not_judged = 'maybe' is not one of warn, fail*"])
