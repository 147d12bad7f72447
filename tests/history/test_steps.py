"""Series and steps over a real store: a step found where the figures moved, told in the metric's direction;
a run that lacked a metric is no point of its series; a changed workload is another series, never a step."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from pytest_sglang.history.steps import find_steps, series_of
from pytest_sglang.history.store import BenchRecord, HistoryStore, Row, RunRecord

WORKLOAD = "input_len=64 max_concurrency=8 num_requests=32 output_len=64 rounds=3"


def noisy(level: float, rng: random.Random, cv: float = 0.01) -> list[float]:
    """Three rounds around ``level``."""
    return [level * rng.gauss(1.0, cv) for _ in range(3)]


def append_runs(path: Path, runs: Sequence[Mapping[str, list[float]]], *, workloads: Sequence[str] | None = None,
                test: str = "t.py::test_perf") -> list[Row]:
    with HistoryStore.open(path) as store:
        for i, rounds in enumerate(runs):
            bench = BenchRecord(profile="p", test=test, machine="ci-h200 | sglang 0.5.23",
                                workload=workloads[i] if workloads else WORKLOAD, rounds=rounds)
            store.append(RunRecord(commit=f"c{i + 1:03d}", time=1_800_000_000.0 + 3600 * i, benchmarks=(bench,)))
        return store.rows()


def step_series(n: int, at: int, factor: float) -> list[float]:
    """``n`` run levels of 100, times ``factor`` from the 1-based run ``at`` on."""
    return [100.0 * (factor if i + 1 >= at else 1.0) for i in range(n)]


def test_a_throughput_step_down_is_found_at_its_run_and_is_a_regression(tmp_path: Path) -> None:
    rng = random.Random(3)
    levels = step_series(30, at=21, factor=0.95)
    rows = append_runs(tmp_path / "h.sqlite", [{"output_throughput": noisy(v, rng),
                                                "median_ttft_ms": noisy(50.0, rng)} for v in levels])
    series, steps = find_steps(rows)
    assert {s.metric: len(s.points) for s in series} == {"output_throughput": 30, "median_ttft_ms": 30}
    (step,) = steps
    assert (step.metric, step.index, step.run_id, step.commit, step.status) == ("output_throughput", 21, 21, "c021",
                                                                               "regressed")
    assert step.before == pytest.approx(100.0, rel=0.01) and step.after == pytest.approx(95.0, rel=0.01)
    assert step.change_pct == pytest.approx((step.after - step.before) / step.before * 100)
    assert 0 < step.p_value <= 0.01
    assert step.describe().startswith(f"output_throughput stepped down {abs(step.change_pct):.1f} % at run 21 "
                                      "(commit c021, p=")
    assert set(step.to_dict()) >= {"profile", "test", "machine", "metric", "index", "commit", "before", "after",
                                   "change_pct", "p_value"}


@pytest.mark.parametrize(("metric", "factor", "status"), [("median_ttft_ms", 1.2, "regressed"),
                                                          ("median_ttft_ms", 0.8, "improved"),
                                                          ("output_throughput", 1.1, "improved")])
def test_a_step_is_judged_by_the_metric_s_direction(tmp_path: Path, metric: str, factor: float, status: str) -> None:
    rng = random.Random(5)
    rows = append_runs(tmp_path / "h.sqlite", [{metric: noisy(v, rng)} for v in step_series(16, 9, factor)])
    (step,) = find_steps(rows)[1]
    assert (step.metric, step.index, step.status) == (metric, 9, status)


def test_runs_that_lacked_the_metric_leave_no_point_and_the_step_names_the_right_run(tmp_path: Path) -> None:
    rng = random.Random(7)
    levels = step_series(30, at=21, factor=0.9)
    runs = [{"output_throughput": noisy(v, rng), "median_ttft_ms": noisy(50.0, rng)} for v in levels]
    for gap in (4, 11, 24):  # runs 5, 12 and 25 measured the latency only
        del runs[gap]["output_throughput"]
    rows = append_runs(tmp_path / "h.sqlite", runs)
    series = {s.metric: s for s in series_of(rows)}
    assert [p.run_id for p in series["output_throughput"].points] == [i for i in range(1, 31) if i not in (5, 12, 25)]
    (step,) = find_steps(rows)[1]
    # Run 21 of the store is the 19th point of its series: two gaps come before it.
    assert (step.metric, step.index, step.run_id, step.commit) == ("output_throughput", 19, 21, "c021")


def test_a_changed_workload_starts_another_series_and_is_no_step(tmp_path: Path) -> None:
    rng = random.Random(11)
    bigger = WORKLOAD.replace("output_len=64", "output_len=256")
    workloads = [WORKLOAD] * 15 + [bigger] * 15
    rows = append_runs(tmp_path / "h.sqlite", [{"output_throughput": noisy(100.0 if i < 15 else 140.0, rng)}
                                               for i in range(30)], workloads=workloads)
    series, steps = find_steps(rows)
    assert [(s.workload, len(s.points)) for s in series] == [(WORKLOAD, 15), (bigger, 15)]
    assert steps == []
    # One series of both would have shown it as a step.
    merged = [Row(**{**r.__dict__, "workload": WORKLOAD}) for r in rows]
    assert [s.index for s in find_steps(merged)[1]] == [16]


def test_a_series_too_short_or_unchanged_has_no_step(tmp_path: Path) -> None:
    rng = random.Random(13)
    rows = append_runs(tmp_path / "h.sqlite", [{"output_throughput": noisy(100.0, rng),
                                                "request_throughput": [2.0, 2.0, 2.0]} for _ in range(25)])
    assert find_steps(rows)[1] == []
    short = [r for r in rows if r.run_id <= 7]
    assert find_steps(short)[1] == []


def test_a_test_measured_twice_in_one_run_is_one_point_its_median(tmp_path: Path) -> None:
    with HistoryStore.open(tmp_path / "h.sqlite") as store:
        benches = tuple(BenchRecord(profile="p", test="t.py::test_perf", machine="m", workload=WORKLOAD,
                                    rounds={"output_throughput": [v]}) for v in (90.0, 110.0))
        store.append(RunRecord(commit=None, time=0.0, benchmarks=benches))
        (series,) = series_of(store.rows())
    assert [(p.run_id, p.value, p.commit) for p in series.points] == [(1, 100.0, None)]


def test_every_stored_metric_can_be_searched(tmp_path: Path) -> None:
    rng = random.Random(17)
    rows = append_runs(tmp_path / "h.sqlite", [{"output_throughput": noisy(100.0, rng),
                                                "gpu_power_mean_w": noisy(v, rng)} for v in step_series(16, 9, 1.3)])
    assert find_steps(rows)[1] == []  # not among the default metrics
    (step,) = find_steps(rows, metrics=None)[1]
    assert (step.metric, step.index, step.status) == ("gpu_power_mean_w", 9, "regressed")


def test_a_window_searches_only_the_most_recent_runs(tmp_path: Path) -> None:
    rng = random.Random(19)
    rows = append_runs(tmp_path / "h.sqlite", [{"output_throughput": noisy(v, rng)}
                                               for v in step_series(60, at=11, factor=0.8)])
    (step,) = find_steps(rows)[1]
    assert (step.index, step.run_id) == (11, 11)
    assert find_steps(rows, window=40)[1] == []  # runs 21-60: no step among them
