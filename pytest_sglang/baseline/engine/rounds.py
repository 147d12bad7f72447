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

from pytest_sglang.baseline.directions import Tolerance, direction, fmt_value
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
    n, m = len(cur), len(ref)
    cur_cv, ref_cv = cv_pct(cur), cv_pct(ref)
    pct = change_pct(cur_med, ref_med)

    def made(status: Status, message: str, *, method: Method = "tolerance", p_value: float | None = None,
             ci_pct: tuple[float, float] | None = None, allowed: float | None = None,
             reason: str | None = None, detectable: float | None = None, unconfirmed: bool = False) -> Judgement:
        return Judgement(metric, cur_med, ref_med, tolerance, d, status, pct, message, n, m, method, p_value,
                         ci_pct, confidence, cur_cv, ref_cv, allowed, reason, detectable, unconfirmed=unconfirmed)

    shown = f"{pct:+.1f}%"
    size = f"{abs(pct):.1f}%" if math.isfinite(pct) else "from 0"
    versus = (f"{current_label + ' ' if current_label else ''}{fmt_value(metric, cur_med)} vs {reference_label} "
              f"{fmt_value(metric, ref_med)}")
    where = f" (tolerance {tolerance}{'; ' + context if context else ''})"
    gain = gain_of(cur_med, ref_med, d)

    if tolerance.sigma and m < 2:
        reason = (f"not judged: a {tolerance} tolerance needs the baseline's spread, and it has {rounds_text(m)}; "
                  "record it with sglang_bench(rounds=N), N >= 2")
        return made("not-judged", f"{metric} {reason}: {versus}, {shown}{where}", reason=reason)
    bound = tolerance.allowed(ref_med, statistics.stdev(ref) if m > 1 else None)

    if margin:
        status: Status = "regressed" if gain < bound else "ok"
        message = f"{metric}: {versus} ({shown}, {d} is better)"
        p_margin: float | None = None
        ci_margin: tuple[float, float] | None = None
        if n >= 2 and m >= 2:  # rounds on both sides: the ratio's interval and its significance beside it
            observed: Alternative = "less" if cur_med < ref_med else "greater"
            p_margin = rank_sum_p(cur, ref, observed)
            ci_margin = bootstrap_change_ci(cur, ref, confidence, resamples=resamples) if resamples > 0 else None
            interval = (f"{confidence:.0%} CI {1 + ci_margin[0] / 100:.2f}-{1 + ci_margin[1] / 100:.2f}, "
                        if ci_margin else "")
            ratio = cur_med / ref_med if ref_med else math.inf
            message = (f"{metric}: {current_label or 'this'} is {ratio:.2f}x {reference_label} ({interval}"
                       f"{rounds_text(n)} vs {m}, {p_text(p_margin)}): {versus} ({shown}, {d} is better)")
        if status == "regressed":
            message += f"; needed a margin of {tolerance}"
        return made(status, message, method="mann-whitney" if p_margin is not None else "tolerance",
                    p_value=p_margin, ci_pct=ci_margin, allowed=bound)

    alpha = 1.0 - confidence
    noisy = [(cv, side, k) for cv, side, k in ((cur_cv, "this run", n), (ref_cv, "the baseline", m))
             if over_limit(cv, max_cv_pct)]
    bound_pct = bound / abs(ref_med) * 100.0 if ref_med else math.inf
    se = _rounds_se(cur, ref)
    detectable = detectable_pct(se, bound_pct, d, alpha=alpha) if math.isfinite(bound_pct) else None
    catch = catch_text(detectable)
    if n >= 2 and m >= 2 and min_p(n, m) <= alpha:
        worse, better = alternatives(d)
        p_worse, p_better = rank_sum_p(cur, ref, worse), rank_sum_p(cur, ref, better)
        ci = bootstrap_change_ci(cur, ref, confidence, resamples=resamples) if resamples > 0 else None
        tested = status_of(gain, bound, worse_significant=p_worse <= alpha, better_significant=p_better <= alpha)
        interval_place = placement(*gain_interval(ci, d), bound_pct) if ci else None
        status = settle(tested, interval_place, bool(noisy), past_edge=gain < -bound)
        p = p_worse if gain < 0 else p_better
        if status == "not-judged":
            across = (f"the {confidence:.0%} CI of the change, {ci[0]:+.1f} to {ci[1]:+.1f}%, reaches both sides of "
                      "the tolerance's edge" if ci else "")
            decide = "more rounds, or past sessions (--sglang-update-baseline), would decide"
            if noisy:
                cv, side, k = max(noisy)
                assert max_cv_pct is not None
                reason = (f"too noisy to judge: CV {cv:.1f}% over {side}'s {rounds_text(k)} (limit {max_cv_pct:g}%)"
                          f"{', and ' + across if across else ''}; {decide}")
            else:
                reason = f"not judged: {shown} is past the tolerance but not significant, and {across}; {decide}"
            return made("not-judged", f"{metric} {reason}: {versus}, {shown}{where}", method="mann-whitney",
                        p_value=p, ci_pct=ci, allowed=bound, reason=reason, detectable=detectable)
        if ci is None:
            interval = ""
        elif status == "ok":
            interval = f"{confidence:.0%} CI {ci[0]:+.1f} to {ci[1]:+.1f}%; "
        else:  # the interval of the size, in the word's direction
            lo, hi = sorted(abs(v) if (v < 0) == (pct < 0) else -abs(v) for v in ci)
            interval = f"{confidence:.0%} CI {lo:.1f} to {hi:.1f}%; "
        stats = f"({interval}{rounds_text(n)} vs {m}; {p_text(p)}{'; ' + catch if catch else ''})"
        if status != "ok":
            message = f"{metric} {status} {size} {stats}: {versus}{where}"
        elif abs(gain) > bound:
            message = f"{metric} {shown} is past the tolerance but not significant {stats}: {versus}{where}"
        else:
            message = f"{metric} {shown} within tolerance {stats}: {versus}{where}"
        return made(status, message, method="mann-whitney", p_value=p, ci_pct=ci, allowed=bound,
                    detectable=detectable, unconfirmed=status == "ok" and abs(gain) > bound)

    if noisy:
        cv, side, k = max(noisy)
        assert max_cv_pct is not None
        reason = f"too noisy to judge: CV {cv:.1f}% over {side}'s {rounds_text(k)} (limit {max_cv_pct:g}%)"
        return made("not-judged", f"{metric} {reason}: {versus}, {shown}{where}", allowed=bound, reason=reason)

    if n == m == 1:
        reason = "one sample a side: judged by the tolerance alone"
    elif n < 2 or m < 2:
        reason = f"{rounds_text(n)} vs {m}: judged by the tolerance alone"
    else:
        reason = (f"{rounds_text(n)} vs {m} cannot reach p<={alpha:g}: judged by the tolerance alone "
                  "(3 rounds a side can)")
    status = status_of(gain, bound)
    head = f"{metric} {shown if math.isfinite(pct) else size} within tolerance" if status == "ok" else \
        f"{metric} {status} {size}"
    message = f"{head} ({reason}): {versus}{where}"
    return made(status, message, allowed=bound, reason=reason)


def _rounds_se(current: Sequence[float], reference: Sequence[float]) -> float | None:
    """The standard error of the log-ratio of two sides' medians from their rounds (None: a side has one)."""
    sd_cur, sd_ref = log_sd(current), log_sd(reference)
    if sd_cur is None or sd_ref is None:
        return None
    return math.sqrt(sd_cur ** 2 / len(current) + sd_ref ** 2 / len(reference))
