"""Sweeps: one benchmark per load level, the throughput-latency curve they draw, its knee, and the highest load
that meets an SLO. Knows nothing about pytest: ``bench`` is any callable that runs one benchmark and returns
a BenchResult (``sglang_bench``, or ``functools.partial(run_bench, server)``).

* :func:`sweep` runs ``bench(concurrency=c, ...)`` for each ``c`` (or ``request_rate=r``) and returns a
  :class:`Sweep`: the points in load order, each tagged ``result.sweep == {"param", "value"}`` (the report
  draws the curve from that tag, and a baseline check keys each point apart: ``test_id@concurrency=4``);
* :meth:`Sweep.knee`: the point where more load stops buying throughput and starts costing latency (the
  Kneedle rule: the largest gap between normalised throughput and normalised latency, :func:`knee_index`);
* :meth:`Sweep.highest_meeting` and :func:`search_slo`: the highest concurrency or rate whose requests meet
  per-request limits (TTFT, TPOT, e2e latency, as ``vllm bench serve --goodput`` counts them) at a given
  attainment; the search bisects a sorted list of candidates, assuming more load never helps latency (what
  ``vllm bench sweep serve_sla`` does from the command line).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pytest_sglang.bench.metrics import BenchResult
from pytest_sglang.bench.slo import check_slo, meets_slo
from pytest_sglang.errors import BenchmarkError

Param = Literal["concurrency", "request_rate"]
BenchFn = Callable[..., BenchResult]
DEFAULT_ATTAINMENT = 0.99  # the share of requests that must meet every limit
CURVE_X = "median_e2e_latency_ms"
CURVE_Y = "output_throughput"


def _load(concurrency: Sequence[int] | None, request_rate: Sequence[float] | None) -> tuple[Param, list[float]]:
    if (concurrency is None) == (request_rate is None):
        raise BenchmarkError("give one of concurrency=[...] or request_rate=[...] to sweep")
    param: Param = "concurrency" if concurrency is not None else "request_rate"
    values = list(concurrency if concurrency is not None else request_rate or [])
    if not values:
        raise BenchmarkError(f"{param}=[...] needs at least one value")
    if len(set(values)) != len(values):
        raise BenchmarkError(f"{param} values repeat: {values}")
    return param, values


def attainment(result: BenchResult, slo: Mapping[str, float]) -> float:
    """The share of ``result``'s measured requests (every round's) that meet every limit of ``slo``."""
    if not result.requests:
        return 0.0
    return sum(1 for r in result.requests if meets_slo(r, slo)) / len(result.requests)


def knee_index(xs: Sequence[float], ys: Sequence[float]) -> int | None:
    """The knee of a rising, flattening curve (throughput ``ys`` against latency ``xs``), by Kneedle: the
    point farthest above the chord once both axes are scaled to [0, 1]. None with fewer than 3 points or a
    curve with no bend."""
    if len(xs) < 3 or len(xs) != len(ys):
        return None
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0 or y1 == y0:
        return None
    gaps = [(y - y0) / (y1 - y0) - (x - x0) / (x1 - x0) for x, y in zip(xs, ys, strict=True)]
    best = max(range(len(gaps)), key=lambda i: gaps[i])
    return best if gaps[best] > 0 else None


@dataclass
class Sweep:
    """The points of a sweep, in the order of their load."""

    param: Param
    points: list[BenchResult] = field(default_factory=list)

    @property
    def values(self) -> list[float]:
        return [p.sweep["value"] for p in self.points if p.sweep]

    def __iter__(self) -> Iterator[BenchResult]:
        return iter(self.points)

    def __len__(self) -> int:
        return len(self.points)

    def __getitem__(self, i: int) -> BenchResult:
        return self.points[i]

    def at(self, value: float) -> BenchResult:
        """The point measured at load ``value``."""
        for p in self.points:
            if p.sweep and p.sweep["value"] == value:
                return p
        raise KeyError(f"no point at {self.param}={value} (measured: {self.values})")

    def knee(self, x: str = CURVE_X, y: str = CURVE_Y) -> BenchResult | None:
        """The point past which more load costs latency more than it buys throughput (None: no bend)."""
        i = knee_index([float(getattr(p, x)) for p in self.points], [float(getattr(p, y)) for p in self.points])
        return None if i is None else self.points[i]

    def highest_meeting(self, *, ttft_ms: float | None = None, tpot_ms: float | None = None,
                        e2el_ms: float | None = None, attainment_min: float = DEFAULT_ATTAINMENT
                        ) -> BenchResult | None:
        """The highest point, climbing from the lowest load, before the first one whose requests miss the SLO
        (every given limit, at ``attainment_min``); None if even the lowest misses it."""
        slo = check_slo({k: v for k, v in (("ttft_ms", ttft_ms), ("tpot_ms", tpot_ms), ("e2el_ms", e2el_ms))
                         if v is not None})
        best = None
        for p in sorted(self.points, key=lambda p: p.sweep["value"] if p.sweep else 0):
            if attainment(p, slo) < attainment_min:
                break
            best = p
        return best

    def to_dict(self) -> dict[str, Any]:
        knee = self.knee()
        return {"param": self.param, "values": self.values,
                "knee": knee.sweep["value"] if knee is not None and knee.sweep else None,
                "points": [p.to_dict() for p in self.points]}


def sweep(bench: BenchFn, *, concurrency: Sequence[int] | None = None,
          request_rate: Sequence[float] | None = None, **kwargs: Any) -> Sweep:
    """One ``bench(**kwargs)`` per load level, lowest first; see the module doc."""
    param, values = _load(concurrency, request_rate)
    curve = Sweep(param)
    for value in sorted(values):
        tag = {"param": param, "value": value}
        curve.points.append(_tagged(bench(**{param: value}, sweep=tag, **kwargs), tag))
    return curve


def _tagged(result: BenchResult, tag: dict[str, Any]) -> BenchResult:
    """``result`` as a point of the sweep: run_bench makes it so (``sweep=``); a bench function that does not
    gets a tagged copy."""
    if result.sweep == tag and all(r.sweep == tag for r in result.rounds):
        return result
    return replace(result, sweep=tag, rounds=[replace(r, sweep=tag) for r in result.rounds])


@dataclass
class SloSearch:
    """What :func:`search_slo` found: the highest load meeting the SLO (None: not even the lowest), its
    result, and every probe in the order it ran."""

    param: Param
    slo: dict[str, float]
    attainment_min: float
    best: float | None = None
    result: BenchResult | None = None
    probes: list[BenchResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"param": self.param, "slo": dict(self.slo), "attainment_min": self.attainment_min,
                "best": self.best, "probes": [{"value": p.sweep["value"] if p.sweep else None,
                                               "slo_attainment": p.slo_attainment, "goodput": p.goodput}
                                              for p in self.probes]}


def search_slo(bench: BenchFn, *, slo: Mapping[str, float], concurrency: Sequence[int] | None = None,
               request_rate: Sequence[float] | None = None, attainment_min: float = DEFAULT_ATTAINMENT,
               **kwargs: Any) -> SloSearch:
    """The highest of the candidate loads whose requests meet ``slo`` (ms limits, e.g. ``{"ttft_ms": 200,
    "tpot_ms": 50}``) at ``attainment_min``, by bisection: about log2(len) benchmarks instead of one per
    candidate. Each probe runs with ``slo`` set, so it reports ``goodput``."""
    param, values = _load(concurrency, request_rate)
    limits = check_slo(slo)
    if not 0 < attainment_min <= 1:
        raise BenchmarkError(f"attainment_min must be in (0, 1], got {attainment_min!r}")
    found = SloSearch(param, limits, attainment_min)
    ordered = sorted(values)
    lo, hi = -1, len(ordered)  # ordered[lo] meets the SLO, ordered[hi] does not (sentinels outside)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        tag = {"param": param, "value": ordered[mid]}
        result = _tagged(bench(**{param: ordered[mid]}, slo=limits, sweep=tag, **kwargs), tag)
        found.probes.append(result)
        if attainment(result, limits) >= attainment_min:
            lo, found.best, found.result = mid, ordered[mid], result
        else:
            hi = mid
    return found


class BenchFixture:
    """The ``sglang_bench`` fixture's value: call it for one benchmark; ``.sweep(concurrency=[1, 4, 16])``
    for a curve; ``.search_slo(slo={...}, concurrency=[...])`` for the highest load meeting an SLO."""

    def __init__(self, run: BenchFn) -> None:
        self._run = run

    def __call__(self, **kwargs: Any) -> BenchResult:
        return self._run(**kwargs)

    def sweep(self, *, concurrency: Sequence[int] | None = None, request_rate: Sequence[float] | None = None,
              **kwargs: Any) -> Sweep:
        return sweep(self._run, concurrency=concurrency, request_rate=request_rate, **kwargs)

    def search_slo(self, *, slo: Mapping[str, float], concurrency: Sequence[int] | None = None,
                   request_rate: Sequence[float] | None = None, attainment_min: float = DEFAULT_ATTAINMENT,
                   **kwargs: Any) -> SloSearch:
        return search_slo(self._run, slo=slo, concurrency=concurrency, request_rate=request_rate,
                          attainment_min=attainment_min, **kwargs)
