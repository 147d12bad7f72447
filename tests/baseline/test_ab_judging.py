"""The A/B judging of the engine: paired rounds, bracketing, what it cannot compare, profile comparisons (the
statistics themselves: tests/stats/test_inference.py)."""

from __future__ import annotations

import math

import pytest

from pytest_sglang.baseline.directions import Tolerance
from pytest_sglang.baseline.engine import compare_ab, judge_bracketed, judge_paired


def test_paired_regression_fails_with_ratio_interval_and_p() -> None:
    a = [100.0, 103, 98, 101, 99, 102, 100, 97, 104, 100]
    b = [x * 0.9 * (1 + 0.004 * ((i % 3) - 1)) for i, x in enumerate(a)]
    j = judge_paired("output_throughput", a, b, Tolerance.parse("x", "5%"), first_label="main",
                     second_label="candidate")
    assert j.status == "regressed"
    assert j.ratio == pytest.approx(0.9, abs=0.005)
    assert j.ci is not None and j.ci[0] < 0.9 < j.ci[1] < 0.95
    assert j.p_value == pytest.approx(2 ** -10)
    assert j.message.startswith("candidate output_throughput 0.90x main (95% CI 0.90-0.90")
    assert "10 pairs, p<0.001" in j.message and "tolerance 5%" in j.message


def test_latency_up_is_the_bad_direction() -> None:
    a = [10.0 + 0.1 * (i % 4) for i in range(8)]
    worse = judge_paired("median_itl_ms", a, [x * 1.2 for x in a], Tolerance.parse("x", "5%"))
    better = judge_paired("median_itl_ms", a, [x * 0.8 for x in a], Tolerance.parse("x", "5%"))
    assert (worse.status, better.status) == ("regressed", "improved")


def test_within_tolerance_or_not_significant_passes() -> None:
    a = [100.0] * 10
    small = judge_paired("output_throughput", a, [98.0 + (i % 2) for i in range(10)], Tolerance.parse("x", "5%"))
    assert small.status == "ok"
    # beyond the tolerance in the median but half the pairs the other way: not significant
    mixed = [90.0, 110.0, 89.0, 108.0, 91.0, 92.0, 112.0, 90.0, 109.0, 88.0]
    noisy = judge_paired("output_throughput", a, mixed, Tolerance.parse("x", "5%"), max_cv_pct=None)
    # the best estimate is past the tolerance's edge and the interval reaches both sides: never a pass
    assert noisy.status == "not-judged" and noisy.p_value is not None and noisy.p_value > 0.05
    assert "not judged: the ratio 0.92x is past the tolerance's edge, but their 95% CI " in noisy.message
    wide_but_within = [97.0, 103.0, 96.0, 104.0, 98.0, 102.0, 97.0, 103.0, 99.0, 101.0]
    assert judge_paired("output_throughput", a, wide_but_within, Tolerance.parse("x", "5%"),
                        max_cv_pct=None).status == "ok"


def test_too_few_pairs_or_too_noisy_is_not_judged() -> None:
    few = judge_paired("output_throughput", [100.0] * 5, [80.0] * 5, Tolerance.parse("x", "5%"))
    assert few.status == "not-judged" and "5 pairs cannot reach significance at 95% (rounds=6 can)" in few.message
    # one pair the other way in 6: one-sided p = 2/64 = 0.031, above the two-sided 2.5 % a tail: not significant
    one_off = judge_paired("output_throughput", [100.0] * 6, [80.0, 81, 82, 83, 84, 101], Tolerance.parse("x", "5%"),
                           max_cv_pct=None)
    assert one_off.status == "not-judged" and one_off.p_value == pytest.approx(2 / 64)
    assert "is past the tolerance's edge, but their 95% CI" in one_off.message
    wild = [60.0, 140.0, 70.0, 130.0, 50.0, 150.0]
    noisy = judge_paired("output_throughput", [100.0] * 6, wild, Tolerance.parse("x", "5%"))
    assert noisy.status == "not-judged" and "too noisy to judge: the paired ratios spread CV" in noisy.message


def test_bracketing_reports_the_drift_and_refuses_a_drifting_machine() -> None:
    tol = Tolerance.parse("x", "5%")
    steady = judge_bracketed("output_throughput", [100.0, 101, 99], [90.0, 91, 89], [100.0, 99, 101], tol)
    assert steady.status == "regressed" and steady.drift_pct == pytest.approx(0.0)
    assert "drifted +0.0% from before to after" in steady.message
    drifting = judge_bracketed("output_throughput", [100.0, 101, 99], [90.0, 91, 89], [80.0, 81, 79], tol)
    assert drifting.status == "not-judged"
    assert "not judged: the machine drifted 20.0% during the comparison" in drifting.message


def test_compare_ab_names_what_it_cannot_compare() -> None:
    samples = {"output_throughput": ([100.0] * 6, [100.0] * 6)}
    outcome = compare_ab("main", "candidate", samples, {"output_throughput": "5%", "median_itl_ms": "5%",
                                                        "bogus": "5%"})
    # the test fails (a check it asked for could not be made), and the gate says so: not judged, as a baseline
    # check's errors gate, never a regression nothing measured
    assert outcome.failed and outcome.gate == "not-judged" and "bogus" in (outcome.gate_reason or "")
    assert any("median_itl_ms was not measured" in e for e in outcome.errors)
    assert any("no direction known for metric 'bogus'" in e for e in outcome.errors)
    assert compare_ab("main", "candidate", samples, {"output_throughput": "5%"}).gate == "passed"
    assert math.isclose(outcome.judgements[0].ratio, 1.0)


def test_profile_comparison_reports_the_interval_and_significance_of_rounds() -> None:
    from pytest_sglang.baseline.engine import compare_profiles

    eagle3 = {"output_throughput": [54.1, 53.0, 55.2, 54.0, 54.4]}
    baseline = {"output_throughput": [100.0, 98.0, 101.0, 99.5, 100.2]}
    slower = compare_profiles("eagle3", eagle3, "baseline", baseline, "t", {"output_throughput": "0%"})
    assert slower.failed
    assert "eagle3 is 0.54x baseline (95% CI 0.53-0.55, 5 rounds vs 5, p=0.004)" in slower.message
    faster = compare_profiles("baseline", baseline, "eagle3", eagle3, "t", {"output_throughput": "50%"})
    assert not faster.failed and faster.gains["output_throughput"] == pytest.approx((100.0 / 54.1 - 1) * 100, abs=0.1)
    assert "baseline is 1.85x eagle3 (95% CI" in faster.message
    one = compare_profiles("eagle3", {"output_throughput": 54.1}, "baseline", {"output_throughput": 100.0}, "t", {})
    assert "x baseline" not in one.message  # one figure a side: no interval to give
