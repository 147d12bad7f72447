"""Series and their steps: a store's rows grouped by profile, test, machine, workload and metric, each series
searched for change points (changepoints.py), each change point told as a Step.

A series holds one point per run that measured the metric, in run order: a run that lacked it leaves no point
(no gap is filled in), so a step's ``index`` counts the runs of its series. A benchmark whose workload or
machine changed is another series: its figures are never compared with the old ones. Where one run measured a
series twice (the same test id run twice), its point is the median of the two.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pytest_sglang.baseline.directions import direction
from pytest_sglang.baseline.engine import change_pct
from pytest_sglang.history.records import Row

# The figures searched for steps by default: the headline throughputs and latencies. Every tracked figure is
# stored; ask for others with ``metrics=``.
DEFAULT_METRICS = ("output_throughput", "request_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms",
                   "median_e2e_latency_ms")


@dataclass(frozen=True)
class Point:
    run_id: int
    commit: str | None
    time: float
    value: float  # the run's median of the metric


@dataclass(frozen=True)
class Series:
    profile: str
    test: str
    machine: str
    workload: str
    metric: str
    points: tuple[Point, ...]

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.profile, self.test, self.machine, self.workload, self.metric)

    @property
    def values(self) -> list[float]:
        return [p.value for p in self.points]

    def to_dict(self, *, points: bool = False) -> dict[str, Any]:
        """Its identity and number of runs (the JSON report's ``history.series``); ``points``: each run's
        ``run_id``, ``commit``, ``time`` and ``value`` too (what a plot of the series needs)."""
        out = {"profile": self.profile, "test": self.test, "machine": self.machine, "workload": self.workload,
               "metric": self.metric, "runs": len(self.points),
               "first_run": self.points[0].run_id if self.points else None,
               "last_run": self.points[-1].run_id if self.points else None}
        if points:
            out["points"] = [asdict(p) for p in self.points]
        return out


@dataclass(frozen=True)
class Step:
    profile: str
    test: str
    machine: str
    workload: str
    metric: str
    index: int  # 1-based number, within its series, of the first run after the step ("at run 21")
    run_id: int
    commit: str | None
    time: float
    before: float  # the median of the segment before
    after: float  # the median of the segment after
    change_pct: float  # (after - before) / |before| * 100
    p_value: float
    status: str  # "regressed" or "improved", from the metric's direction

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """``output_throughput stepped down 4.1 % at run 37 (commit abc1234, p=0.003)``."""
        way = "up" if self.after > self.before else "down"
        commit = f"commit {self.commit}" if self.commit else "no commit"
        return (f"{self.metric} stepped {way} {abs(self.change_pct):.1f} % at run {self.index} ({commit}, "
                f"p={self.p_value:.3g}): {self.status}")


Detector = Callable[[Sequence[float]], Sequence[Any]]  # values -> change points (``index``, ``p_value``)


def series_of(rows: Iterable[Row], metrics: Sequence[str] | None = DEFAULT_METRICS) -> list[Series]:
    """The rows grouped into series, in the order each series first appears; ``metrics=None``: every metric."""
    wanted = None if metrics is None else set(metrics)
    grouped: dict[tuple[str, str, str, str, str], dict[int, list[Row]]] = {}
    for row in rows:
        if wanted is not None and row.metric not in wanted:
            continue
        key = (row.profile, row.test, row.machine, row.workload, row.metric)
        grouped.setdefault(key, {}).setdefault(row.run_id, []).append(row)
    out = []
    for key, runs in grouped.items():
        points = tuple(Point(run_id, found[0].commit, found[0].time, statistics.median(r.median for r in found))
                       for run_id, found in sorted(runs.items()))
        out.append(Series(*key, points=points))
    return out


def steps_in(series: Series, detector: Detector | None = None, *, window: int | None = None) -> list[Step]:
    """The steps of one series: each change point, with the medians of the segments on either side of it.
    ``window``: search only the series' most recent that many runs (default: changepoints.WINDOW)."""
    if detector is None:
        from pytest_sglang.stats.changepoints import find_change_points

        detector = find_change_points if window is None else functools.partial(find_change_points, window=window)
    values = series.values
    found = sorted(detector(values), key=lambda cp: cp.index)
    bounds = [0, *(cp.index for cp in found), len(values)]
    steps = []
    for i, cp in enumerate(found):
        before = statistics.median(values[bounds[i]:bounds[i + 1]])
        after = statistics.median(values[bounds[i + 1]:bounds[i + 2]])
        point = series.points[cp.index]
        worse = after < before if direction(series.metric) == "higher" else after > before
        steps.append(Step(series.profile, series.test, series.machine, series.workload, series.metric,
                          index=cp.index + 1, run_id=point.run_id, commit=point.commit, time=point.time,
                          before=before, after=after, change_pct=change_pct(after, before),
                          p_value=float(cp.p_value), status="regressed" if worse else "improved"))
    return steps


def find_steps(rows: Iterable[Row], metrics: Sequence[str] | None = DEFAULT_METRICS,
               detector: Detector | None = None, *, window: int | None = None) -> tuple[list[Series], list[Step]]:
    """Every series of ``rows`` and every step found in them (in each one's last ``window`` runs, if given)."""
    series = series_of(rows, metrics)
    return series, [step for s in series for step in steps_in(s, detector, window=window)]
