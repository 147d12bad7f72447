"""The gate: rounds against the baseline's rounds, significance before failure, too noisy to judge, 3sigma,
version 1 files, infrastructure outcomes told apart from regressions."""

from __future__ import annotations

import json
import statistics
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_sglang.baseline import (
    BaselineChecker,
    BaselineStore,
    Comparison,
    Machine,
    NotJudgedWarning,
    Tolerance,
    compare,
    gate_of,
    judge,
)
from pytest_sglang.bench import BenchResult, combine_rounds
from pytest_sglang.errors import BaselineError
from pytest_sglang.stats.inference import EXACT_MAX_N, bootstrap_change_ci, min_p, rank_sum_p

M = Machine(name="cpu: test (2 cores)", server="sglang 0.5.2")
T = "tests/test_perf.py::test_tp"
BASE = [344.7, 343.1, 346.0, 342.5, 345.2]
SLOW = [323.3, 322.0, 324.8, 321.5, 323.9]  # about 6.2 % lower, no overlap
FIVE = Tolerance(5.0, True)


def rounds(values: list[float], **extra: object) -> BenchResult:
    per_round = []
    for v in values:
        per_round.append(BenchResult(output_throughput=v, completed=8, median_ttft_ms=40.0, **extra))
    return combine_rounds(per_round)


# ---- the statistics -------------------------------------------------------------------------------------


def test_exact_rank_test_matches_the_tables() -> None:
    assert rank_sum_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], "less") == pytest.approx(1 / 252)
    assert rank_sum_p([1, 2, 3], [4, 5, 6], "less") == pytest.approx(0.05)
    assert rank_sum_p([1, 2, 3, 5], [4, 6, 7, 8], "less") == pytest.approx(2 / 70)  # U = 1
    assert rank_sum_p([1, 2, 3], [4, 5, 6], "greater") == 1.0
    assert rank_sum_p([5, 5, 5], [5, 5, 5], "less") == 1.0  # all tied: no evidence either way
    assert min_p(5, 5) == pytest.approx(1 / 252) and min_p(2, 2) == pytest.approx(1 / 6)


def test_normal_approximation_takes_over_close_to_the_exact_value() -> None:
    x = [float(i) for i in range(16)]
    y = [v + 4.5 for v in x]
    exact = rank_sum_p(x[:15], y[:15], "less")  # n + m = 30: exact
    approx = rank_sum_p(x, y, "less")  # 32 > EXACT_MAX_N
    assert EXACT_MAX_N == 30 and 0.005 < exact < 0.05 and 0.005 < approx < 0.05


def test_bootstrap_interval_brackets_the_change_and_is_repeatable() -> None:
    ci = bootstrap_change_ci(SLOW, BASE)
    assert ci is not None and ci[0] < -6.2 < ci[1] < 0
    assert bootstrap_change_ci(SLOW, BASE) == ci


# ---- the engine --------------------------------------------------------------------------------------------


def test_a_significant_regression_beyond_the_tolerance_fails_with_its_interval() -> None:
    j = judge("output_throughput", SLOW, BASE, FIVE)
    assert j.status == "regressed" and j.method == "mann-whitney"
    assert j.p_value == pytest.approx(1 / 252) and j.current_n == j.reference_n == 5
    assert j.message.startswith("output_throughput regressed 6.2% (95% CI ")
    assert "; 5 rounds vs 5; p=0.004; catches about 6% at 80% power): 323.3 tok/s vs baseline 344.7 tok/s " \
           "(tolerance 5%" in j.message
    assert j.detectable_pct is not None and 5.0 < j.detectable_pct < 7.0  # the tolerance plus its rounds' noise
    assert j.ci_pct is not None and j.ci_pct[1] < -5.0


def test_beyond_the_tolerance_but_not_significant_is_not_judged_never_passed() -> None:
    noisy_base = [344.0, 300.0, 350.0, 310.0, 340.0]
    j = judge("output_throughput", [320.0, 330.0, 305.0, 345.0, 315.0], noisy_base, FIVE, max_cv_pct=None)
    assert j.status == "not-judged" and not j.failed and j.p_value is not None and j.p_value > 0.05
    assert "-5.9% is past the tolerance but not significant, and the 95% CI of the change" in j.message


def test_significant_but_within_the_tolerance_passes() -> None:
    j = judge("output_throughput", [v * 0.98 for v in BASE], BASE, FIVE)
    assert j.status == "ok" and j.p_value is not None and j.p_value < 0.05 and "within tolerance" in j.message


def test_directions_hold_for_rounds() -> None:
    assert judge("output_throughput", [v * 1.1 for v in BASE], BASE, FIVE).status == "improved"
    assert judge("median_ttft_ms", [44.0, 45.0, 44.5], [40.0, 40.2, 39.9], Tolerance(5.0, True)).status == \
        "regressed"
    assert judge("median_ttft_ms", [36.0, 35.0, 35.5], [40.0, 40.2, 39.9], Tolerance(5.0, True)).status == \
        "improved"


def test_too_noisy_to_judge_is_neither_pass_nor_fail() -> None:
    wild = [250.0, 400.0, 320.0, 200.0, 380.0]
    j = judge("output_throughput", wild, BASE, FIVE, max_cv_pct=10.0)
    assert j.status == "not-judged" and not j.failed
    assert j.message.startswith("output_throughput too noisy to judge: CV 27.4% over this run's 5 rounds "
                                "(limit 10%), and the 95% CI of the change, ")
    assert "reaches both sides of the tolerance's edge; more rounds, or past sessions" in j.message
    looser = judge("output_throughput", wild, BASE, FIVE, max_cv_pct=30.0)  # under the limit, still undecided
    assert looser.status == "not-judged" and "past the tolerance but not significant" in looser.message


def test_too_few_samples_for_significance_say_the_tolerance_decided() -> None:
    one = judge("output_throughput", 323.3, BASE, FIVE)
    assert one.status == "regressed" and one.method == "tolerance"
    assert "(1 round vs 5: judged by the tolerance alone)" in one.message
    two = judge("output_throughput", SLOW[:2], BASE[:2], FIVE)
    assert two.status == "regressed" and "2 rounds vs 2 cannot reach p<=0.05" in two.message


def test_sigma_tolerance_uses_the_baseline_spread() -> None:
    assert Tolerance.parse("output_throughput", "3sigma") == Tolerance(3.0, False, True)
    assert str(Tolerance.parse("output_throughput", "2.5 sigma")) == "2.5sigma"
    sigma = statistics.stdev(BASE)
    tol = Tolerance(3.0, False, True)
    j = judge("output_throughput", [v - 3 * sigma - 2 for v in BASE], BASE, tol)
    assert j.status == "regressed" and j.allowed == pytest.approx(3 * sigma)
    assert judge("output_throughput", [v - 2 for v in BASE], BASE, tol).status == "ok"
    single = judge("output_throughput", SLOW, 344.7, tol)
    assert single.status == "not-judged" and "needs the baseline's spread" in single.message
    with pytest.raises(BaselineError, match="3sigma"):
        Tolerance.parse("x_ms", "threesigma")


def test_margins_compare_the_medians() -> None:
    assert not judge("output_throughput", [110.0, 111.0], [100.0, 90.0], Tolerance(10.0, True), margin=True).failed


# ---- the store and the check ----------------------------------------------------------------------------


def test_rounds_are_recorded_and_judged_against(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "b.json")
    rec = compare(rounds(BASE), {"output_throughput": "5%"}, store=store, profile="p", test_id=T, machine=M,
                  update=True)
    assert "(5 rounds)" in rec.notes[0] and rec.gate == "recorded"
    entry = json.loads(store.path.read_text())["baselines"]["p"][T][M.key]
    assert entry["samples"]["output_throughput"] == BASE
    assert entry["metrics"]["output_throughput"] == sorted(BASE)[2]
    assert entry["spread"]["output_throughput"]["n"] == 5 and entry["spread"]["output_throughput"]["cv_pct"] < 1
    fresh = BaselineStore(store.path)
    comp = compare(rounds(SLOW), {"output_throughput": "5%"}, store=fresh, profile="p", test_id=T, machine=M)
    (check,) = comp.checks
    assert comp.failed and check.status == "regressed" and check.rounds == 5 and check.baseline_rounds == 5
    assert check.p_value == pytest.approx(1 / 252) and comp.gate == "regressed"
    assert check.to_dict()["ci_pct"] is not None
    same = compare(rounds([v + 0.5 for v in BASE]), {"output_throughput": "5%"}, store=fresh, profile="p",
                   test_id=T, machine=M)
    assert not same.failed and same.gate == "passed"


def test_version_1_files_load_as_one_sample_each(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": "pytest-sglang-baselines", "version": 1, "baselines": {"p": {T: {
        M.key: {"machine": M.name, "recorded_at": "2026-11-30T10:00:00+00:00", "commit": "abc1234",
                "metrics": {"output_throughput": 344.7}}}}}}))
    store = BaselineStore(path)
    comp = compare(rounds(SLOW), {"output_throughput": "5%"}, store=store, profile="p", test_id=T, machine=M)
    (check,) = comp.checks
    assert check.status == "regressed" and check.method == "tolerance" and check.baseline_rounds == 1
    assert "5 rounds vs 1: judged by the tolerance alone" in check.message
    store.record("p", T, M, {"median_ttft_ms": [40.0, 41.0, 42.0]})
    data = json.loads(path.read_text())
    assert data["version"] == 3
    entry = data["baselines"]["p"][T][M.key]
    assert entry["metrics"] == {"output_throughput": 344.7, "median_ttft_ms": 41.0}
    assert entry["samples"] == {"median_ttft_ms": [40.0, 41.0, 42.0]}
    assert entry["sessions"] == {"output_throughput": [344.7], "median_ttft_ms": [41.0]}  # the old figure: one


def test_bad_samples_are_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"format": "pytest-sglang-baselines", "version": 2, "baselines": {"p": {"t": {
        "m": {"metrics": {"output_throughput": 1.0}, "samples": {"output_throughput": []}}}}}}))
    with pytest.raises(BaselineError, match=r"samples\.output_throughput is \[\], not a non-empty list"):
        BaselineStore(path).load()


def test_infrastructure_outcomes_are_not_judged(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "b.json")
    store.record("p", T, M, {"output_throughput": BASE})
    bound = rounds(SLOW, client_bound=True, client_busy=0.97)
    comp = compare(bound, {"output_throughput": "5%"}, store=store, profile="p", test_id=T, machine=M)
    (check,) = comp.checks
    assert not comp.failed and check.status == "not-judged" and comp.gate == "not-judged"
    assert check.reason is not None and check.reason.startswith("client-bound: the load generator's event loop "
                                                                "was busy 97% of the time")
    assert comp.warnings == [check.message]
    strict = compare(bound, {"output_throughput": "5%"}, store=store, profile="p", test_id=T, machine=M,
                     strict=True)
    assert strict.failed and "--sglang-baseline-strict" in strict.failure_message()
    failed = rounds(SLOW, failed=1)
    assert gate_of(failed, []) == ("not-judged", "5 of 45 requests failed")


def test_the_gate_of_a_benchmark(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "b.json")
    store.record("p", T, M, {"output_throughput": BASE})

    def check(result: BenchResult, tol: str = "5%", test_id: str = T) -> Comparison:
        return compare(result, {"output_throughput": tol}, store=store, profile="p", test_id=test_id, machine=M)

    assert gate_of(rounds(BASE), []) == (None, None)  # nothing checked
    assert gate_of(rounds(BASE), [check(rounds(BASE))]) == ("passed", None)
    gate, reason = gate_of(rounds(SLOW), [check(rounds(BASE)), check(rounds(SLOW))])
    assert gate == "regressed" and reason is not None and reason.startswith("output_throughput regressed 6.2%")
    assert gate_of(rounds(SLOW), [check(rounds(SLOW), "3sigma")])[0] == "regressed"
    assert gate_of(rounds(SLOW), [check(rounds(SLOW), test_id="other")]) == ("not-judged",
                                                                            "output_throughput: no baseline")


def test_checker_options_warnings_and_sweep_point_keys(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "b.json")
    checker = BaselineChecker(store, commit="abc1234")
    checker._machines[None] = M
    point = replace(rounds(BASE), sweep={"param": "concurrency", "value": 4})
    recorder = BaselineChecker(store, update=True)
    recorder._machines[None] = M
    recorder.check(point, {"output_throughput": "5%"}, profile="p", test_id=T, server=None)
    assert f"{T}@concurrency=4" in json.loads(store.path.read_text())["baselines"]["p"]
    wild = replace(rounds([250.0, 400.0, 320.0, 200.0, 380.0]), sweep=point.sweep)
    with pytest.warns(NotJudgedWarning, match="too noisy to judge: CV 27.4%"):
        comp = checker.check(wild, {"output_throughput": "5%"}, profile="p", test_id=T, server=None)
    assert comp.gate == "not-judged" and not comp.failed
    assert comp.gate_reason is not None and comp.gate_reason.startswith("output_throughput: too noisy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loose = checker.check(wild, {"output_throughput": "50%", "max_cv": "40%", "confidence": "90%"},
                              profile="p", test_id=T, server=None)
    assert loose.gate == "passed" and loose.checks[0].status == "ok"
    with pytest.raises(BaselineError, match="max_cv must be a percentage"):
        checker.check(wild, {"output_throughput": "5%", "max_cv": "lots"}, profile="p", test_id=T, server=None)


def test_session_gate_defaults_sit_under_each_checks_own(tmp_path: Path) -> None:
    """--sglang-max-cv / --sglang-confidence: the default of every check that sets none; a check's own wins."""
    store = BaselineStore(tmp_path / "b.json")
    recorder = BaselineChecker(store, update=True)
    recorder._machines[None] = M
    recorder.check(rounds(BASE), {"output_throughput": "5%"}, profile="p", test_id=T, server=None)
    lenient = BaselineChecker(store, gate_defaults={"max_cv": "40%"})
    lenient._machines[None] = M
    wild = rounds([250.0, 400.0, 320.0, 200.0, 380.0])  # CV 27 %
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        judged = lenient.check(wild, {"output_throughput": "20%"}, profile="p", test_id=T, server=None)
    assert judged.gate == "passed"
    with pytest.warns(NotJudgedWarning, match=r"too noisy to judge: CV 27.4% .*\(limit 10%\)"):
        own = lenient.check(wild, {"output_throughput": "20%", "max_cv": "10%"}, profile="p", test_id=T,
                            server=None)
    assert own.gate == "not-judged"
