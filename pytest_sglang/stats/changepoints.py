"""Where a series of runs stepped: E-divisive means (Matteson & James 2014) with a permutation test.

The method MongoDB runs over its nightly performance series and Apache Otava (formerly DataStax's Hunter) ships:

1. For a segment z[s:e], every split t scores the energy statistic between X = z[s:t] and Y = z[t:e]
   (m and k values):  Q = m*k/(m+k) * (2/(m*k) * sum|x - y| - sum_{i<j}|x_i - x_j| / C(m,2)
   - sum_{i<j}|y_i - y_j| / C(k,2)), distances to the power 1. It compares whole distributions, not only
   means, so one slow outlier weighs what a value weighs, and it is scale-free (a tok/s and a latency series
   behave alike).
2. The best split over all current segments is the candidate. Permutation test: shuffle the values within each
   segment ``permutations`` times, take each shuffle's best score over all segments; p = (number of shuffles
   scoring at least the candidate + 1) / (permutations + 1), the exact permutation p-value, never 0.
3. If p <= ``significance`` the split is kept and the search repeats over the finer segments; the first split
   that is not significant ends it.

Like MongoDB's own implementation (signal-processing-algorithms) and unlike the paper and Otava, the second
sample always runs to the segment's end (kappa = e): one scan of a segment then takes O(n) Python steps (the
within-sample distance sums by prefix, each new value against the sorted earlier ones; the cross sum is the
total less both), where a free kappa costs O(n^2) per scan and per shuffle; splitting again still finds two steps
(tests/stats/test_changepoints.py). Within-sample means are the paper's unbiased ones (over C(m,2) pairs),
where MongoDB's divide by m^2, which lowers a small segment's spread and so favours splits near the ends.

No library: MongoDB's signal-processing-algorithms 2.1.6 installs on Python 3.11 only and pins numpy<2 with
scipy, gevent and structlog; apache-otava 0.8.0 is a CLI application pinning numpy==2.2.0.* with scipy,
google-cloud-bigquery, pg8000 and slack-sdk; ruptures needs numpy and scipy and has no significance test, so no
p-value. The method is a page of code, so the core carries it.

Defaults, chosen on the simulator's evidence (benchmarks/history_sim.py, benchmarks/RESULTS-history.md: series
of 35 sessions, the simulator's lognormal session drift of CV 0.02-0.08 times the per-session noise measured in
350 real simulator sessions on this VM, steps of 2-10 % from run 21; 1000 series a cell, 500 for the comparisons):

- ``significance`` 0.05: the issue allows 1 false step in 10 unchanged series; 0.05 shows a step in 4.9 % of
  unchanged series on drift 0.04 and finds a 5 % step there in 68 % (at run 21 +- 2 in 46 %). On the first 500
  of those series 0.01 shows a step in 1.6 % of unchanged ones (0.05: 5.6 %) but finds the 5 % step in only 42 %
  (28 % at 21 +- 2; 0.05: 66 %, 42 %). On drift 0.02 a 5 % step is found in 97 % (83 % at 21 +- 2). Neither
  reaches 9 in 10 at 21 +- 2 on drift 0.04; the step is too small for that noise: even the maximum-likelihood
  split for Gaussian noise, told there is one step, lands within +-2 runs in only 61 % of those series (69 %
  with the drift alone, where this search places it in 56 %). Each step carries its p-value, so a message says
  how sure it is; a caller that would rather miss steps than see false ones passes 0.01.
- ``permutations`` 199: the smallest p it can give is 0.005, a tenth of the significance, so a clear step is
  never refused for want of shuffles; the p-value's own sampling error at p=0.05 is about +-0.015. Time grows
  linearly with it; a split that cannot reach the significance stops shuffling early. Left to the default, a
  stricter significance gets more shuffles, enough for a smallest p of half of it (0.001: 1999).
- ``min_segment`` 4: a step is reported once 4 runs sit after it (and 4 before). On drift 0.04 with a 5 % step
  (500 series) 3 found 63 % (40 % at 21 +- 2), 4 66 % (42 %), 5 66 % (42 %): 3 is worse, 5 no better and a run
  later. A short series cannot give a small p: 8 values split 4 | 4 have 70 orders, 2 of which score as high
  as a perfect split, so p is about 0.03 at best.

MongoDB's signal-processing-algorithms 2.1.6 (installed in a throwaway Python 3.11 environment, p 0.05, 100
permutations) on the same series found the 5 % step on drift 0.04 in 63 % (40 % at 21 +- 2) of 300 series, and a
step in 6.3 % of unchanged ones: no better than this module.

Speed (CPU seconds of one search with the defaults, a series with one step, this VM): 35 values 0.009 s, 100
0.03 s, 300 0.13 s, 500 0.33 s. Longer series are cut to their most recent ``window`` values (default 500)
before the search: indices still refer to the values given, and nothing before the window is reported.

The caller drops runs without a figure (None, NaN) before calling, so a gap in the runs is simply a shorter
series; any non-finite value left in is a :class:`SeriesError`.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_sglang.errors import SeriesError

SIGNIFICANCE = 0.05
PERMUTATIONS = 199
MIN_SEGMENT = 4
WINDOW = 500


@dataclass(frozen=True)
class ChangePoint:
    index: int  # 0-based position, in the values given, of the first value after the step
    p_value: float  # of the permutation test that accepted it

    @property
    def p_text(self) -> str:
        """The p-value as a message shows it: ``p=0.003``."""
        return format_p_value(self.p_value)


def format_p_value(p: float) -> str:
    if p < 0.001:
        return "p<0.001"
    return f"p={p:.3f}" if p < 0.1 else f"p={p:.2f}"


@dataclass(frozen=True)
class _Split:
    start: int  # of the segment, absolute
    end: int
    index: int  # absolute index of the first value after the split
    score: float


def find_change_points(values: Sequence[float], *, significance: float = SIGNIFICANCE,
                       permutations: int | None = None, min_segment: int = MIN_SEGMENT, seed: int = 0,
                       window: int = WINDOW) -> list[ChangePoint]:
    """The steps in ``values`` (oldest first), sorted by index; [] when there are fewer than 2 * min_segment."""
    if permutations is None:
        permutations = default_permutations(significance)
    _check(values, significance, permutations, min_segment, window)
    offset = max(0, len(values) - window)
    series = [float(v) for v in values[offset:]]
    rng = random.Random(seed)
    bounds = [0, len(series)]
    found: list[ChangePoint] = []
    best = {(0, len(series)): _best_split(series, 0, len(series), min_segment)}
    while True:
        candidates = [s for s in best.values() if s is not None and s.score > 0.0]
        if not candidates:
            break
        top = max(candidates, key=lambda s: s.score)
        p_value = _permutation_p(series, bounds, top.score, permutations, min_segment, significance, rng)
        if p_value > significance:
            break
        found.append(ChangePoint(index=top.index + offset, p_value=p_value))
        del best[(top.start, top.end)]
        bounds = sorted([*bounds, top.index])
        for lo, hi in ((top.start, top.index), (top.index, top.end)):
            best[(lo, hi)] = _best_split(series, lo, hi, min_segment)
    return sorted(found, key=lambda c: c.index)


def default_permutations(significance: float) -> int:
    """PERMUTATIONS, or more for a stricter significance: enough that the smallest p is at most half of it."""
    if not 0.0 < significance < 1.0:
        return PERMUTATIONS  # _check says what is wrong
    return max(PERMUTATIONS, math.ceil(2.0 / significance) - 1)


def _check(values: Sequence[float], significance: float, permutations: int, min_segment: int, window: int) -> None:
    bad = [i for i, v in enumerate(values) if not isinstance(v, (int, float)) or not math.isfinite(v)]
    if bad:
        raise SeriesError(f"change-point series has {len(bad)} value(s) that are not finite numbers (first at "
                          f"position {bad[0]}: {values[bad[0]]!r}); drop runs without a figure before the search")
    if not 0.0 < significance < 1.0:
        raise SeriesError(f"significance must lie between 0 and 1 (e.g. 0.01), got {significance!r}")
    if permutations < 1 or (1.0 / (permutations + 1)) > significance:
        raise SeriesError(f"{permutations} permutations cannot reach p <= {significance}: the smallest p they give "
                          f"is 1/(permutations+1); use at least {math.ceil(1 / significance) - 1}")
    if min_segment < 2:
        raise SeriesError(f"min_segment must be at least 2 (a segment needs two values to have a spread), "
                          f"got {min_segment}")
    if window < 2 * min_segment:
        raise SeriesError(f"window {window} is shorter than two segments of {min_segment}")


def _permutation_p(series: list[float], bounds: list[int], observed: float, permutations: int, min_segment: int,
                   significance: float, rng: random.Random) -> float:
    """The permutation p-value of the best split; once so many shuffles scored as high that it cannot reach
    ``significance`` the shuffling stops, and what comes back (above ``significance``) is only a lower bound."""
    segments = [series[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    hopeless = math.floor(significance * (permutations + 1) + 1e-9)  # this many shuffles at least as high: p > it
    at_least = 0
    for _ in range(permutations):
        if at_least >= hopeless:
            break
        top = 0.0
        for segment in segments:
            shuffled = segment[:]
            rng.shuffle(shuffled)
            split = _best_split(shuffled, 0, len(shuffled), min_segment)
            if split is not None and split.score > top:
                top = split.score
        at_least += top >= observed
    return (at_least + 1) / (permutations + 1)


def _best_split(series: list[float], start: int, end: int, min_segment: int) -> _Split | None:
    """The split of series[start:end] with the largest energy statistic, or None if it is too short to split."""
    n = end - start
    if n < 2 * min_segment:
        return None
    segment = series[start:end]
    left = _within_sums(segment)  # left[t]: sum of |z_i - z_j| over i < j < t
    right = _within_sums(segment[::-1])[::-1]  # right[t]: the same over t <= i < j
    total = left[n]
    best: _Split | None = None
    for t in range(min_segment, n - min_segment + 1):
        m, k = t, n - t
        cross = total - left[t] - right[t]
        energy = 2.0 * cross / (m * k) - 2.0 * left[t] / (m * (m - 1)) - 2.0 * right[t] / (k * (k - 1))
        score = m * k / (m + k) * energy
        if best is None or score > best.score:
            best = _Split(start, end, start + t, score)
    return best


def _within_sums(values: list[float]) -> list[float]:
    """sums[t] = sum of |v_i - v_j| over i < j < t, for t = 0..n.

    Each new value's distances to the earlier ones come from their sorted list: (values below it) and (above
    it) in one bisect and one slice sum. That is O(n^2) element additions, but done by C's sum and list insert:
    faster here than a Fenwick tree's O(n log n) Python steps up to a few thousand values."""
    earlier: list[float] = []
    out = [0.0]
    running = total = 0.0
    for count, v in enumerate(values):
        i = bisect.bisect_left(earlier, v)
        below = sum(earlier[:i])
        running += (i * v - below) + ((total - below) - (count - i) * v)
        out.append(running)
        earlier.insert(i, v)
        total += v
    return out
