"""A figure or the samples of rounds against a reference: the rule of baseline checks (a tolerance) and of
profile comparisons (a margin).

Either side is one figure or the samples of several rounds (``sglang_bench(rounds=N)``, a baseline recorded
from them). With at least two samples a side, a baseline check fails only when the change of the medians is
beyond the tolerance AND significant in the metric's bad direction: the one-sided Mann-Whitney U test at
``1 - confidence`` (exact for small samples, stats.py), with the bootstrap interval of the change in the
message. With one sample on either side, or too few rounds for the test to reach significance (2 vs 2), the
tolerance alone decides, and the message says so. The one rule settles it (verdict.settle): a bootstrap
interval of the change wholly past the tolerance is ``regressed`` whatever the spread; a side whose rounds
spread more than ``max_cv_pct`` (CV, in percent) makes an interval across the tolerance's edge (or a
comparison with no interval) ``not-judged``: "too noisy to judge". A ``3sigma`` tolerance is three standard
deviations of the reference's samples; with one reference sample it cannot be judged either. Profile
comparisons (margins) compare the medians; with rounds on both sides the message gives the ratio of the
medians with its bootstrap interval and the rank-sum p-value ("eagle3 is 0.54x baseline (95% CI 0.52-0.56,
5 rounds vs 5, p=0.004)"), while the margin alone still decides.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_sglang.baseline.directions import Direction, Tolerance, direction, fmt_value
from pytest_sglang.baseline.engine.judgement import Judgement, p_text, rounds_text
from pytest_sglang.baseline.engine.power import catch_text, detectable_pct, log_sd
from pytest_sglang.baseline.engine.verdict import (
    DEFAULT_CONFIDENCE,
    Method,
    Status,
    alternatives,
    change_pct,
    cv_pct,
    gain_interval,
    gain_of,
    over_limit,
    placement,
    samples_of,
    settle,
    status_of,
)
from pytest_sglang.stats.inference import BOOTSTRAP_RESAMPLES, Alternative, bootstrap_change_ci, min_p, rank_sum_p


@dataclass(frozen=True)
class _Sides:
    """The two sides of one judgement and how the message shows them."""

    metric: str
    tolerance: Tolerance
    confidence: float
    d: Direction
    cur: list[float]
    ref: list[float]
    cur_med: float
    ref_med: float
    cur_cv: float | None
    ref_cv: float | None
    pct: float
    versus: str
    where: str

    @property
    def n(self) -> int:
        return len(self.cur)

    @property
    def m(self) -> int:
        return len(self.ref)

    @property
    def shown(self) -> str:
        return f"{self.pct:+.1f}%"

    @property
    def size(self) -> str:
        return f"{abs(self.pct):.1f}%" if math.isfinite(self.pct) else "from 0"

    @property
    def gain(self) -> float:
        return gain_of(self.cur_med, self.ref_med, self.d)

    def made(self, status: Status, message: str, *, method: Method = "tolerance", p_value: float | None = None,
             ci_pct: tuple[float, float] | None = None, allowed: float | None = None, reason: str | None = None,
             detectable: float | None = None, unconfirmed: bool = False) -> Judgement:
        return Judgement(self.metric, self.cur_med, self.ref_med, self.tolerance, self.d, status, self.pct, message,
                         self.n, self.m, method, p_value, ci_pct, self.confidence, self.cur_cv, self.ref_cv, allowed,
                         reason, detectable, unconfirmed=unconfirmed)


def judge(
    metric: str,
    current: float | Sequence[float],
    reference: float | Sequence[float],
    tolerance: Tolerance,
    *,
    margin: bool = False,
    current_label: str = "",
    reference_label: str = "baseline",
    context: str = "",
    confidence: float = DEFAULT_CONFIDENCE,
    max_cv_pct: float | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Judgement:
    """Judge ``current`` against ``reference`` for ``metric`` (BaselineError if its direction is unknown).

    Each side is a figure or the samples of rounds. ``margin=False``: ``tolerance`` is how much worse than the
    reference the candidate may be; past it (and, with rounds on both sides, significantly worse at
    ``confidence``) the status is ``regressed``, better by more than it (and significantly) ``improved``,
    else ``ok``; ``not-judged`` when a side's CV exceeds ``max_cv_pct`` or a ``sigma`` tolerance has no
    reference spread. ``margin=True``: ``tolerance`` is how much better the median must be ("0%": at least as
    good); short of that it is ``regressed``, else ``ok``. ``current_label`` and ``reference_label`` name the
    two figures in the message (``eagle3`` vs ``base``, or the figure vs ``baseline``); ``context`` says where
    the reference comes from. ``resamples``: bootstrap resamples for the interval (0: no interval, so a
    spread over ``max_cv_pct`` is never overruled by it).
    """
    d = direction(metric)
    cur, ref = samples_of(current), samples_of(reference)
    cur_med, ref_med = statistics.median(cur), statistics.median(ref)
    versus = (f"{current_label + ' ' if current_label else ''}{fmt_value(metric, cur_med)} vs {reference_label} "
              f"{fmt_value(metric, ref_med)}")
    s = _Sides(metric, tolerance, confidence, d, cur, ref, cur_med, ref_med, cv_pct(cur), cv_pct(ref),
               change_pct(cur_med, ref_med), versus, f" (tolerance {tolerance}{'; ' + context if context else ''})")
    if tolerance.sigma and s.m < 2:
        reason = (f"not judged: a {tolerance} tolerance needs the baseline's spread, and it has {rounds_text(s.m)}; "
                  "record it with sglang_bench(rounds=N), N >= 2")
        return s.made("not-judged", f"{metric} {reason}: {versus}, {s.shown}{s.where}", reason=reason)
    bound = tolerance.allowed(ref_med, statistics.stdev(ref) if s.m > 1 else None)
    if margin:
        return _by_margin(s, bound, current_label, reference_label, resamples)
    alpha = 1.0 - confidence
    noisy = [(cv, side, k) for cv, side, k in ((s.cur_cv, "this run", s.n), (s.ref_cv, "the baseline", s.m))
             if over_limit(cv, max_cv_pct)]
    if s.n >= 2 and s.m >= 2 and min_p(s.n, s.m) <= alpha:
        return _by_ranks(s, bound, noisy, max_cv_pct, resamples)
    if noisy:
        cv, side, k = max(noisy)
        assert max_cv_pct is not None
        reason = f"too noisy to judge: CV {cv:.1f}% over {side}'s {rounds_text(k)} (limit {max_cv_pct:g}%)"
        return s.made("not-judged", f"{metric} {reason}: {versus}, {s.shown}{s.where}", allowed=bound, reason=reason)
    return _by_tolerance(s, bound, alpha)


def _by_margin(s: _Sides, bound: float, current_label: str, reference_label: str, resamples: int) -> Judgement:
    """A profile comparison: the margin decides; with rounds on both sides the ratio's interval and its
    significance stand beside it."""
    status: Status = "regressed" if s.gain < bound else "ok"
    message = f"{s.metric}: {s.versus} ({s.shown}, {s.d} is better)"
    p_margin: float | None = None
    ci_margin: tuple[float, float] | None = None
    if s.n >= 2 and s.m >= 2:
        observed: Alternative = "less" if s.cur_med < s.ref_med else "greater"
        p_margin = rank_sum_p(s.cur, s.ref, observed)
        ci_margin = bootstrap_change_ci(s.cur, s.ref, s.confidence, resamples=resamples) if resamples > 0 else None
        interval = (f"{s.confidence:.0%} CI {1 + ci_margin[0] / 100:.2f}-{1 + ci_margin[1] / 100:.2f}, "
                    if ci_margin else "")
        ratio = s.cur_med / s.ref_med if s.ref_med else math.inf
        message = (f"{s.metric}: {current_label or 'this'} is {ratio:.2f}x {reference_label} ({interval}"
                   f"{rounds_text(s.n)} vs {s.m}, {p_text(p_margin)}): {s.versus} ({s.shown}, {s.d} is better)")
    if status == "regressed":
        message += f"; needed a margin of {s.tolerance}"
    return s.made(status, message, method="mann-whitney" if p_margin is not None else "tolerance",
                  p_value=p_margin, ci_pct=ci_margin, allowed=bound)


def _by_ranks(s: _Sides, bound: float, noisy: list[tuple[float | None, str, int]], max_cv_pct: float | None,
              resamples: int) -> Judgement:
    """Rounds enough on both sides for the rank test: past the tolerance and significant, or the interval
    wholly past it (verdict.settle)."""
    alpha = 1.0 - s.confidence
    bound_pct = bound / abs(s.ref_med) * 100.0 if s.ref_med else math.inf
    detectable = detectable_pct(_rounds_se(s.cur, s.ref), bound_pct, s.d, alpha=alpha) \
        if math.isfinite(bound_pct) else None
    gain = s.gain
    worse, better = alternatives(s.d)
    p_worse, p_better = rank_sum_p(s.cur, s.ref, worse), rank_sum_p(s.cur, s.ref, better)
    ci = bootstrap_change_ci(s.cur, s.ref, s.confidence, resamples=resamples) if resamples > 0 else None
    tested = status_of(gain, bound, worse_significant=p_worse <= alpha, better_significant=p_better <= alpha)
    interval_place = placement(*gain_interval(ci, s.d), bound_pct) if ci else None
    status = settle(tested, interval_place, bool(noisy), past_edge=gain < -bound)
    p = p_worse if gain < 0 else p_better
    if status == "not-judged":
        across = (f"the {s.confidence:.0%} CI of the change, {ci[0]:+.1f} to {ci[1]:+.1f}%, reaches both sides of "
                  "the tolerance's edge" if ci else "")
        decide = "more rounds, or past sessions (--sglang-update-baseline), would decide"
        if noisy:
            cv, side, k = max(noisy)
            assert max_cv_pct is not None
            reason = (f"too noisy to judge: CV {cv:.1f}% over {side}'s {rounds_text(k)} (limit {max_cv_pct:g}%)"
                      f"{', and ' + across if across else ''}; {decide}")
        else:
            reason = f"not judged: {s.shown} is past the tolerance but not significant, and {across}; {decide}"
        return s.made("not-judged", f"{s.metric} {reason}: {s.versus}, {s.shown}{s.where}", method="mann-whitney",
                      p_value=p, ci_pct=ci, allowed=bound, reason=reason, detectable=detectable)
    catch = catch_text(detectable)
    stats = f"({_interval(s, status, ci)}{rounds_text(s.n)} vs {s.m}; {p_text(p)}{'; ' + catch if catch else ''})"
    if status != "ok":
        message = f"{s.metric} {status} {s.size} {stats}: {s.versus}{s.where}"
    elif abs(gain) > bound:
        message = f"{s.metric} {s.shown} is past the tolerance but not significant {stats}: {s.versus}{s.where}"
    else:
        message = f"{s.metric} {s.shown} within tolerance {stats}: {s.versus}{s.where}"
    return s.made(status, message, method="mann-whitney", p_value=p, ci_pct=ci, allowed=bound,
                  detectable=detectable, unconfirmed=status == "ok" and abs(gain) > bound)


def _interval(s: _Sides, status: Status, ci: tuple[float, float] | None) -> str:
    if ci is None:
        return ""
    if status == "ok":
        return f"{s.confidence:.0%} CI {ci[0]:+.1f} to {ci[1]:+.1f}%; "
    lo, hi = sorted(abs(v) if (v < 0) == (s.pct < 0) else -abs(v) for v in ci)  # the size's, in the word's way
    return f"{s.confidence:.0%} CI {lo:.1f} to {hi:.1f}%; "


def _by_tolerance(s: _Sides, bound: float, alpha: float) -> Judgement:
    """Too few rounds for the rank test: the tolerance alone decides, and the message says why."""
    n, m = s.n, s.m
    if n == m == 1:
        reason = "one sample a side: judged by the tolerance alone"
    elif n < 2 or m < 2:
        reason = f"{rounds_text(n)} vs {m}: judged by the tolerance alone"
    else:
        reason = (f"{rounds_text(n)} vs {m} cannot reach p<={alpha:g}: judged by the tolerance alone "
                  "(3 rounds a side can)")
    status = status_of(s.gain, bound)
    head = f"{s.metric} {s.shown if math.isfinite(s.pct) else s.size} within tolerance" if status == "ok" else \
        f"{s.metric} {status} {s.size}"
    return s.made(status, f"{head} ({reason}): {s.versus}{s.where}", allowed=bound, reason=reason)


def _rounds_se(current: Sequence[float], reference: Sequence[float]) -> float | None:
    """The standard error of the log-ratio of two sides' medians from their rounds (None: a side has one)."""
    sd_cur, sd_ref = log_sd(current), log_sd(reference)
    if sd_cur is None or sd_ref is None:
        return None
    return math.sqrt(sd_cur ** 2 / len(current) + sd_ref ** 2 / len(reference))
