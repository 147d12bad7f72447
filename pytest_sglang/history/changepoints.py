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
sample always runs to the segment's end (kappa = e): one scan of a segment is then O(n log n) (within-sample
distance sums by prefix, through a Fenwick tree over the values' ranks; the cross sum is the total less both),
where a free kappa costs O(n^2) per scan and per shuffle; splitting again still finds two steps
(tests/history/test_changepoints.py). Within-sample means are the paper's unbiased ones (over C(m,2) pairs),
where MongoDB's divide by m^2, which lowers a small segment's spread and so favours splits near the ends.

No library: MongoDB's signal-processing-algorithms 2.1.6 installs on Python 3.11 only and pins numpy<2 with
scipy, gevent and structlog; apache-otava 0.8.0 is a CLI application pinning numpy==2.2.0.* with scipy,
google-cloud-bigquery, pg8000 and slack-sdk; ruptures needs numpy and scipy and has no significance test, so no
p-value. The method is a page of code, so the core carries it.

Defaults, chosen on the simulator's evidence (benchmarks/history_sim.py, benchmarks/RESULTS-history.md: 35
sessions, session drift CV 0.02-0.08, steps of 2-10 % at run 21, each series' values lognormal as the simulator
draws them):

- ``significance`` 0.05: the issue's budget is at most 1 false step in 10 unchanged series; 0.05 keeps to it
  (about 5 % of unchanged 35-run series show a step) and finds a 5 % step on drift 0.04 in about 79 % of series
  (at run 21 +- 2 in 59 %) where 0.01 finds it in about 50 % (40 %); on drift 0.02 a 3 % step 89 % against 67 %.
  No method reaches 9 in 10 at run 21 +- 2 on drift 0.04: even the best single split of the Gaussian likelihood,
  told there is exactly one step, lands within +-2 runs in only about 74 % of series (RESULTS-history.md).
  Each step carries its p-value, so a message can say how sure it is; a caller wanting fewer false steps passes
  0.01.
- ``permutations`` 199: the smallest p it can give is 0.005, a tenth of the significance, so a clear step is
  never refused for want of shuffles; the p-value's own sampling error at p=0.05 is about +-0.015. Time grows
  linearly with it (below).
- ``min_segment`` 4: a step is reported once 4 runs sit after it (and 4 before). 3, 4 and 5 found and placed
  steps alike on the simulator (within 2 points); fewer than 4 after a step and two slow runs at the end of a
  series would be a step of their own, more delays every verdict. A short series cannot give a small p: 8
  values split 4 | 4 have 70 orders, 2 of which score as high as a perfect split, so p is about 0.03 at best.

Speed on the project's 2-core shared VM (Python 3.11, defaults, a series with one clear step): 35 values in about
0.02 s, 100 in 0.07 s, 300 in 0.25 s, 500 in 0.5 s. Longer series are cut to their most recent ``window`` values
(default 500) before the search: indices still refer to the values given, and nothing before the window is
reported.

The caller drops runs without a figure (None, NaN) before calling, so a gap in the runs is simply a shorter
series; any non-finite value left in is a :class:`SeriesError`.
"""

from __future__ import annotations

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
                       permutations: int = PERMUTATIONS, min_segment: int = MIN_SEGMENT, seed: int = 0,
                       window: int = WINDOW) -> list[ChangePoint]:
    """The steps in ``values`` (oldest first), sorted by index; [] when there are fewer than 2 * min_segment."""
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
        p_value = _permutation_p(series, bounds, top.score, permutations, min_segment, rng)
        if p_value > significance:
            break
        found.append(ChangePoint(index=top.index + offset, p_value=p_value))
        del best[(top.start, top.end)]
        bounds = sorted([*bounds, top.index])
        for lo, hi in ((top.start, top.index), (top.index, top.end)):
            best[(lo, hi)] = _best_split(series, lo, hi, min_segment)
    return sorted(found, key=lambda c: c.index)


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
                   rng: random.Random) -> float:
    segments = [series[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    at_least = 0
    for _ in range(permutations):
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
    """sums[t] = sum of |v_i - v_j| over i < j < t, for t = 0..n, in O(n log n) through a Fenwick tree on ranks."""
    n = len(values)
    order = sorted(range(n), key=values.__getitem__)
    rank = [0] * n
    for r, i in enumerate(order):
        rank[i] = r + 1
    counts = [0] * (n + 1)
    sums = [0.0] * (n + 1)
    out = [0.0] * (n + 1)
    running, seen = 0.0, 0.0
    for t, v in enumerate(values):
        below_n, below_s = 0, 0.0
        r = rank[t]
        while r > 0:
            below_n += counts[r]
            below_s += sums[r]
            r -= r & -r
        # |v - w| summed over the t earlier values: those at or below v, then those above it
        running += (below_n * v - below_s) + ((seen - below_s) - (t - below_n) * v)
        out[t + 1] = running
        seen += v
        r = rank[t]
        while r <= n:
            counts[r] += 1
            sums[r] += v
            r += r & -r
    return out
