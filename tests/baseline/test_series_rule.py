"""The history rule of a check (baseline/engine/series.py): this run after the past runs of its series fails
when it sits after a significant step in the bad direction beyond the tolerance, names the run and commit the
step began at, accepts a step the baseline was re-recorded after, and says what the history could have seen."""

from __future__ import annotations

import random

from pytest_sglang.baseline.directions import Tolerance
from pytest_sglang.baseline.engine.series import PastRun, judge_series

FIVE = Tolerance.parse("output_throughput", "5%")


def series(values: list[float]) -> list[PastRun]:
    return [PastRun(v, f"c{i + 1:04d}", 1000.0 + i) for i, v in enumerate(values)]


def noisy(n: int, level: float, cv: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [level * rng.lognormvariate(0.0, cv) for _ in range(n)]


def test_a_run_after_a_step_down_beyond_the_tolerance_regresses_naming_where_it_began() -> None:
    values = noisy(20, 100.0, 0.01, 1) + noisy(5, 90.0, 0.01, 2)
    j = judge_series("output_throughput", series(values[:-1]), values[-1], FIVE)
    assert j is not None and j.status == "regressed" and j.method == "history"
    assert j.message.startswith("output_throughput stepped down ")
    assert "at run 21 (commit c0021, p=" in j.message and "(tolerance 5%; 25 runs of history" in j.message
    assert -12.0 < j.change_pct < -8.0


def test_a_step_within_the_tolerance_or_up_does_not_fail() -> None:
    small = noisy(20, 100.0, 0.005, 3) + noisy(6, 97.0, 0.005, 4)
    j = judge_series("output_throughput", series(small[:-1]), small[-1], FIVE)
    assert j is not None and j.status == "ok" and "within the tolerance" in j.message
    up = noisy(20, 100.0, 0.01, 5) + noisy(6, 120.0, 0.01, 6)
    k = judge_series("output_throughput", series(up[:-1]), up[-1], FIVE)
    assert k is not None and k.status == "improved" and "stepped up" in k.message


def test_a_latency_steps_the_other_way() -> None:
    values = noisy(20, 40.0, 0.01, 7) + noisy(6, 48.0, 0.01, 8)
    j = judge_series("median_ttft_ms", series(values[:-1]), values[-1], Tolerance.parse("median_ttft_ms", "5%"))
    assert j is not None and j.status == "regressed" and "median_ttft_ms stepped up " in j.message


def test_a_step_the_baseline_was_recorded_after_is_accepted() -> None:
    values = noisy(20, 100.0, 0.01, 9) + noisy(6, 80.0, 0.01, 10)
    past = series(values[:-1])
    j = judge_series("output_throughput", past, values[-1], FIVE, accepted_until=past[22].time)
    assert j is not None and j.status == "ok" and j.reason is not None and "accepted it" in j.reason


def test_no_step_says_what_the_history_could_have_seen() -> None:
    values = noisy(30, 100.0, 0.02, 11)
    j = judge_series("output_throughput", series(values[:-1]), values[-1], FIVE)
    assert j is not None and j.status == "ok" and j.message.startswith("output_throughput: no step in 30 runs")
    assert j.history_detectable_pct is not None and 1.0 < j.history_detectable_pct < 5.0
    assert "a step of about " in j.message
    assert judge_series("output_throughput", [], 100.0, FIVE) is None
