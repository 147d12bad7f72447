"""Interleaved A/B rounds (both servers alive, rounds A B B A ...): the paired ratios second/first.

They are judged by the exact Wilcoxon signed-rank test of their logarithms, with the Hodges-Lehmann interval
that goes with it (stats.py); the ratio shown is the median of the paired ratios. Significance is two-sided
at ``confidence`` (the one-sided p-value at most half of ``1 - confidence``, so that a change is significant
exactly when its interval leaves 1 out): on a GPU host whose rounds spread 25 %, a one-sided 5 % test let
identical servers "regress" (benchmarks/RESULTS-ab.md). 6 pairs can reach it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pytest_sglang.baseline.directions import Tolerance, direction
from pytest_sglang.baseline.engine.instance_noise import AA_RUNS_NEEDED
from pytest_sglang.baseline.engine.judgement import ABJudgement, ab_message
from pytest_sglang.baseline.engine.power import detectable_pct, log_sd
from pytest_sglang.baseline.engine.verdict import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_CV_PCT,
    Status,
    ab_bound_pct,
    alternatives,
    cv_pct,
    gain_interval,
    gain_of,
    over_limit,
    placement,
    positive_figures,
    settle,
    status_of,
)
from pytest_sglang.errors import BaselineError
from pytest_sglang.stats.inference import hodges_lehmann_ci, signed_rank_min_p, signed_rank_p


def judge_paired(metric: str, first: Sequence[float], second: Sequence[float], tolerance: Tolerance | None, *,
                 first_label: str = "A", second_label: str = "B", confidence: float = DEFAULT_CONFIDENCE,
                 max_cv_pct: float | None = DEFAULT_MAX_CV_PCT) -> ABJudgement:
    """Interleaved rounds, ``first[i]`` paired with ``second[i]``: the median of the ratios second/first, its
    Hodges-Lehmann interval and the signed-rank p-value. With a ``tolerance`` the status says whether the second
    side is worse than that (and significantly: ``regressed``), better (``improved``) or ``ok``, settled by
    the one rule (verdict.settle): an interval wholly past the tolerance regresses whatever the spread;
    ``not-judged`` with too few pairs for an interval, or an interval across the tolerance's edge from ratios
    spread more than ``max_cv_pct``. Without one it is ``ok``."""
    d = direction(metric)
    if len(first) != len(second):
        raise BaselineError(f"an A/B comparison of {metric} pairs rounds: {len(first)} vs {len(second)}")
    a = positive_figures(metric, first_label, first)
    b = positive_figures(metric, second_label, second)
    ratios = [y / x for x, y in zip(a, b, strict=True)]
    logs = [math.log(r) for r in ratios]
    n = len(ratios)
    ratio = statistics.median(ratios)
    interval = hodges_lehmann_ci(logs, confidence)
    ci = (math.exp(interval[0]), math.exp(interval[2])) if interval else None
    cv = cv_pct(ratios)
    worse, better = alternatives(d)
    p_worse, p_better = signed_rank_p(logs, worse), signed_rank_p(logs, better)
    gain = gain_of(ratio, 1.0, d) * 100.0
    p = p_worse if gain < 0 else p_better
    sample = f"{n} pair{'s' if n != 1 else ''}"
    tail = (1.0 - confidence) / 2  # two-sided: significant exactly when the interval leaves 1 out
    bound = ab_bound_pct(metric, tolerance, statistics.median(a)) if tolerance is not None else 0.0
    sd = log_sd(ratios)
    detectable = detectable_pct(sd / math.sqrt(n) if sd is not None else None, bound, d, alpha=tail)
    message = ab_message(metric, second_label, first_label, ratio, ci, confidence, sample, p, tolerance,
                         f", spread {cv:.1f}%" if cv is not None else "")

    def made(status: Status, reason: str | None = None) -> ABJudgement:
        text = f"{metric} {reason}: {message}" if reason else message
        return ABJudgement(metric, ratio, ci, p, n, status, text, tolerance, d, "signed-rank", confidence, cv,
                           reason=reason, detectable_pct=detectable)

    if tolerance is None:
        return made("ok")
    if ci is None:
        need = next(k for k in range(1, 64) if signed_rank_min_p(k) <= tail)
        return made("not-judged", f"not judged: {sample} cannot reach significance at {confidence:.0%} "
                                  f"(rounds={need} can)")
    where = placement(*gain_interval(((ci[0] - 1.0) * 100.0, (ci[1] - 1.0) * 100.0), d), bound)
    tested = status_of(gain, bound, worse_significant=p_worse <= tail, better_significant=p_better <= tail)
    too_wide = over_limit(cv, max_cv_pct)
    status = settle(tested, where, too_wide, past_edge=gain < -bound)
    if status != "not-judged":
        return made(status)
    edge = 1.0 - bound / 100.0 if d == "higher" else 1.0 + bound / 100.0
    across = (f"their {confidence:.0%} CI {ci[0]:.2f}-{ci[1]:.2f}x reaches both sides of the tolerance's edge "
              f"{edge:.2f}x; {_what_decides(n, ci, ratio, edge)}")
    if too_wide:
        assert cv is not None and max_cv_pct is not None  # over_limit said so
        return made("not-judged", f"too noisy to judge: the paired ratios spread CV {cv:.1f}% over {sample} "
                                  f"(limit {max_cv_pct:g}%), and {across}")
    return made("not-judged", f"not judged: the ratio {ratio:.2f}x is past the tolerance's edge, but {across}")


def _what_decides(n: int, ci: tuple[float, float], ratio: float, edge: float) -> str:
    """How many pairs would narrow the interval to leave ``edge`` out at this ratio (it narrows as 1/sqrt(n))."""
    half = (math.log(ci[1]) - math.log(ci[0])) / 2
    distance = abs(math.log(ratio) - math.log(edge)) if ratio > 0 else 0.0
    hint = f"or {AA_RUNS_NEEDED} recorded A/A runs, which judge by the instance noise instead of the pairs' spread"
    if distance <= 0 or half <= 0:
        return f"the ratio sits on the edge: a looser tolerance decides it, {hint}"
    need = math.ceil(n * (half / distance) ** 2)
    more = f"about rounds={need}" if need <= 500 else "more than 500 pairs"
    return f"{more} would decide a ratio this far from the edge, {hint}"
