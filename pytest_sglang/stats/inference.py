"""The statistics behind the gate, in pure Python (no scipy): a rank test and an interval of the change.

* :func:`rank_sum_p`: the one-sided p-value of the Mann-Whitney U (Wilcoxon rank-sum) test. Exact for small
  samples (``n + m <= EXACT_MAX_N``): the permutation distribution of the rank sum, counted by dynamic
  programming over doubled mid-ranks, so ties are exact too (the conditional distribution given the ties).
  Larger samples use the normal approximation with the tie correction and a continuity correction.
* :func:`min_p`: the smallest p-value that ``n`` vs ``m`` rounds can reach (``1 / C(n+m, n)``): 3 vs 3 can
  reach 0.05, 2 vs 2 only 0.167, so too few rounds for significance are known before testing.
* :func:`bootstrap_change_ci`: the percentile-bootstrap interval of the change of the median,
  ``median(current) / median(reference) - 1`` in percent; seeded, so a check gives the same figures twice.
* :func:`signed_rank_p`: the one-sided p-value of the Wilcoxon signed-rank test of paired differences (an A/B
  comparison's log ratios). Exact up to ``SIGNED_RANK_EXACT_MAX_N`` pairs: the distribution of the positive
  rank sum over all 2^n sign patterns, counted by dynamic programming over doubled mid-ranks (ties exact, zero
  differences dropped as Wilcoxon did); the normal approximation with the tie correction above.
* :func:`hodges_lehmann_ci`: the distribution-free interval that goes with that test: the order statistics of
  the Walsh averages ``(d_i + d_j) / 2`` at the signed-rank test's exact critical value (untied), around their
  median (the Hodges-Lehmann estimate). No resampling, so nothing to seed; it excludes 0 where the two-sided
  test rejects at that level.

* :class:`SessionSpread`: the prediction interval of one new session among past sessions' medians (log
  scale, Student's t with n - 1 degrees of freedom; :func:`t_cdf` and :func:`t_quantile` through the
  regularized incomplete beta function), for baselines that keep their recording sessions.

Scipy, where installed, gives the same exact p-values (``scipy.stats.mannwhitneyu(..., method="exact")`` for
untied samples); the test suite checks a few against tabulated values instead of depending on it.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

SIGNED_RANK_EXACT_MAX_N = 60  # pairs up to this: the exact signed-rank distribution
EXACT_MAX_N = 30  # n + m up to this: the exact distribution; above it the normal approximation
BOOTSTRAP_RESAMPLES = 2000

Alternative = Literal["less", "greater"]


def midranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def min_p(n: int, m: int) -> float:
    """The smallest one-sided p-value of the rank test with ``n`` and ``m`` samples (no ties)."""
    if n < 1 or m < 1:
        return 1.0
    return 1.0 / math.comb(n + m, n)


def _subset_sums(weights: Sequence[int], k: int) -> dict[int, int]:
    """How many ``k``-element subsets of ``weights`` have each sum."""
    dp: list[dict[int, int]] = [{} for _ in range(k + 1)]
    dp[0][0] = 1
    for i, w in enumerate(weights):
        for size in range(min(i + 1, k), 0, -1):
            below, here = dp[size - 1], dp[size]
            for s, c in below.items():
                here[s + w] = here.get(s + w, 0) + c
    return dp[k]


def _exact_tail(counts: dict[int, int], observed: int, alternative: Alternative, outcomes: int) -> float:
    """The one-sided p-value of ``observed`` under the exact null distribution ``counts`` (statistic -> how many
    of the ``outcomes`` equally likely arrangements give it)."""
    hits = sum(c for s, c in counts.items() if (s <= observed if alternative == "less" else s >= observed))
    return min(1.0, hits / outcomes)


def _normal_tail(observed: float, mean: float, var: float, alternative: Alternative) -> float:
    """The one-sided p-value of a doubled rank statistic by its normal approximation: doubled, it moves in
    steps of 2, so the continuity correction is 1."""
    delta = observed - mean
    z = (delta + 1) / math.sqrt(var) if alternative == "less" else (delta - 1) / math.sqrt(var)
    cdf = 0.5 * math.erfc(-z / math.sqrt(2))
    return min(1.0, cdf if alternative == "less" else 1.0 - cdf)


def rank_sum_p(x: Sequence[float], y: Sequence[float], alternative: Alternative) -> float:
    """One-sided p-value that ``x`` is stochastically smaller (``"less"``) or greater (``"greater"``) than
    ``y``, by the Mann-Whitney U test. 1.0 when either sample is empty."""
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        return 1.0
    ranks = midranks([*x, *y])
    doubled = [round(2 * r) for r in ranks]  # mid-ranks are multiples of 0.5: integers when doubled
    observed = sum(doubled[:n])
    total = n + m
    if total <= EXACT_MAX_N:
        dist = _subset_sums(doubled, n)
        return _exact_tail(dist, observed, alternative, math.comb(total, n))
    mean = n * (total + 1)  # of the doubled rank sum
    ties: dict[int, int] = {}
    for r in doubled:
        ties[r] = ties.get(r, 0) + 1
    tie_term = sum(t ** 3 - t for t in ties.values()) / (total * (total - 1))
    var = 4 * n * m / 12.0 * ((total + 1) - tie_term)  # doubled: 4x the variance of the rank sum
    if var <= 0:
        return 1.0
    return _normal_tail(observed, mean, var, alternative)


def bootstrap_change_ci(current: Sequence[float], reference: Sequence[float], confidence: float = 0.95, *,
                        resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float] | None:
    """Percentile-bootstrap interval, in percent, of ``median(current) / median(reference) - 1``; None when a
    resampled reference median can be 0."""
    if not current or not reference or min(abs(v) for v in reference) == 0:
        return None
    rng = random.Random(seed)
    changes = []
    for _ in range(resamples):
        cur = statistics.median(rng.choices(current, k=len(current)))
        ref = statistics.median(rng.choices(reference, k=len(reference)))
        changes.append((cur - ref) / abs(ref) * 100.0)
    changes.sort()
    alpha = 1.0 - confidence
    lo = changes[max(0, int(math.floor(alpha / 2 * resamples)))]
    hi = changes[min(resamples - 1, int(math.ceil((1 - alpha / 2) * resamples)) - 1)]
    return lo, hi


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-14
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for aa in (m * (b - m) * x / ((a - 1.0 + 2 * m) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1.0 + 2 * m))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def beta_inc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    t2 = t * t
    # Near 0, df / (df + t^2) rounds to 1: take the complement's own argument there.
    tail = 0.5 * (beta_inc(df / 2.0, 0.5, df / (df + t2)) if t2 > df else 1.0 - beta_inc(0.5, df / 2.0, t2 / (df + t2)))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on :func:`t_cdf`; 0 < p < 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, abs(mid)):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class SessionSpread:
    """Where a new session's figure falls among past sessions' medians, on log scale (speeds multiply).

    ``center`` is their geometric mean; ``scale`` the standard deviation of their logs times sqrt(1 + 1/n),
    the spread of one new session around that mean; a new session's log, minus the mean, over ``scale``
    follows Student's t with n - 1 degrees of freedom.
    """

    n: int
    center: float
    scale: float
    cv_pct: float  # of the session medians themselves

    @classmethod
    def of(cls, medians: Sequence[float]) -> SessionSpread:
        if len(medians) < 2 or min(medians) <= 0:
            raise ValueError("a session spread needs at least two positive session medians")
        logs = [math.log(v) for v in medians]
        n = len(logs)
        return cls(n=n, center=math.exp(statistics.fmean(logs)),
                   scale=statistics.stdev(logs) * math.sqrt(1.0 + 1.0 / n),
                   cv_pct=statistics.stdev(medians) / statistics.fmean(medians) * 100.0)

    def bounds(self, confidence: float) -> tuple[float, float]:
        """The one-sided ``confidence`` prediction bounds of a new session: below the low one (or above the
        high one) an unchanged session falls with chance 1 - confidence each."""
        reach = t_quantile(confidence, self.n - 1) * self.scale
        return self.center * math.exp(-reach), self.center * math.exp(reach)

    def p_below(self, value: float, edge: float = 1.0) -> float:
        """The chance that an unchanged session at ``edge`` times the center is at or below ``value``."""
        return self._cdf(value, edge)

    def p_above(self, value: float, edge: float = 1.0) -> float:
        return 1.0 - self._cdf(value, edge)

    def _cdf(self, value: float, edge: float) -> float:
        if value <= 0 or edge <= 0:
            return 0.0 if value <= 0 < edge else 1.0
        if self.scale == 0:
            return 1.0 if value >= self.center * edge else 0.0
        return t_cdf((math.log(value) - math.log(self.center * edge)) / self.scale, self.n - 1)


def _signed_rank_counts(weights: Sequence[int]) -> dict[int, int]:
    """How many of the 2^n sign patterns give each sum of the positive ``weights``."""
    counts: dict[int, int] = {0: 1}
    for w in weights:
        step = dict(counts)
        for s, c in counts.items():
            step[s + w] = step.get(s + w, 0) + c
        counts = step
    return counts


def signed_rank_p(differences: Sequence[float], alternative: Alternative) -> float:
    """One-sided p-value that the paired ``differences`` are centred below 0 (``"less"``) or above it
    (``"greater"``), by the Wilcoxon signed-rank test; 1.0 with no non-zero difference."""
    nonzero = [d for d in differences if d != 0]
    n = len(nonzero)
    if n == 0:
        return 1.0
    doubled = [round(2 * r) for r in midranks([abs(d) for d in nonzero])]
    observed = sum(w for w, d in zip(doubled, nonzero, strict=True) if d > 0)
    if n <= SIGNED_RANK_EXACT_MAX_N:
        counts = _signed_rank_counts(doubled)
        return _exact_tail(counts, observed, alternative, 2 ** n)
    mean = sum(doubled) / 2
    var = sum(w * w for w in doubled) / 4  # of the doubled positive rank sum; ties are in the weights
    return _normal_tail(observed, mean, var, alternative)


def signed_rank_min_p(n: int) -> float:
    """The smallest one-sided p-value ``n`` pairs can reach: 2^-n (5 pairs: 0.031, 6 pairs: 0.016)."""
    return 1.0 if n < 1 else 0.5 ** n


def _signed_rank_critical(n: int, tail: float) -> int:
    """The largest ``k`` with P(W+ < k) <= ``tail`` for ``n`` untied pairs (0: none)."""
    counts = _signed_rank_counts([2 * (i + 1) for i in range(n)])
    total, below, k = 2 ** n, 0, 0
    for s in range(0, n * (n + 1) + 1, 2):  # doubled sums, so W+ = s / 2
        below += counts.get(s, 0)
        if below / total > tail:
            break
        k = s // 2 + 1
    return k


def hodges_lehmann_ci(differences: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float] | None:
    """The Hodges-Lehmann estimate of the paired differences' centre and its ``confidence`` interval:
    ``(low, estimate, high)``; None when ``n`` pairs are too few for the interval (2^-n > the tail)."""
    n = len(differences)
    if n == 0:
        return None
    walsh = sorted((differences[i] + differences[j]) / 2 for i in range(n) for j in range(i, n))
    estimate = statistics.median(walsh)
    tail = (1.0 - confidence) / 2
    if n > SIGNED_RANK_EXACT_MAX_N:
        z = statistics.NormalDist().inv_cdf(1 - tail)
        k = int(math.floor(n * (n + 1) / 4 - z * math.sqrt(n * (n + 1) * (2 * n + 1) / 24)))
    else:
        k = _signed_rank_critical(n, tail)
    if k < 1:
        return None
    return walsh[k - 1], estimate, walsh[len(walsh) - k]
