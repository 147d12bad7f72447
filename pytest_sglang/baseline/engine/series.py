"""A run against the history of its series (``--sglang-history``): the rule of a check whose series has past runs.

One job cannot see a 3 % change on a host whose instances differ by 10-30 %; a series of runs on one runner can
(issue 24). This run's figure is appended to the past runs' medians and the series is searched for steps
(E-divisive means with a permutation test, stats/changepoints.py). The run regresses when it sits after a
significant step (p at most ``1 - confidence``) in the bad direction whose size, the change of the medians of
the segments on either side, is beyond the tolerance: "output_throughput stepped down 4.1% at run 37 (commit
abc1234, p=0.003)". A step that came before the check's baseline was last recorded was accepted by whoever
recorded it, and is said, not failed. No step, or a step inside the tolerance: ``ok``, with what the history could
have seen (power.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_sglang.baseline.directions import Tolerance, direction, fmt_value
from pytest_sglang.baseline.engine.judgement import Judgement
from pytest_sglang.baseline.engine.power import detectable_pct, history_se
from pytest_sglang.baseline.engine.verdict import DEFAULT_CONFIDENCE, Status, change_pct, gain_of


@dataclass(frozen=True)
class PastRun:
    """One earlier run of the series: its median of the metric, its commit, when it ran (epoch seconds)."""

    value: float
    commit: str | None
    time: float


def judge_series(metric: str, past: Sequence[PastRun], current: float, tolerance: Tolerance, *,
                 accepted_until: float | None = None, confidence: float = DEFAULT_CONFIDENCE) -> Judgement | None:
    """This run's ``current`` figure after the ``past`` runs of its series (oldest first); None when there is
    no past run. ``accepted_until``: when the check's baseline was last recorded (steps before it are accepted)."""
    from pytest_sglang.stats.changepoints import find_change_points, format_p_value

    if not past or not math.isfinite(current):
        return None
    d = direction(metric)
    values = [p.value for p in past] + [current]
    runs = len(values)
    found = find_change_points(values, significance=1.0 - confidence)
    start = found[-1].index if found else 0
    previous = found[-2].index if len(found) > 1 else 0
    after = statistics.median(values[start:])
    before = statistics.median(values[previous:start]) if found else after
    bound = tolerance.allowed(before, statistics.stdev(values[previous:start]) if start - previous > 1 else None)
    alpha = 1.0 - confidence
    noise = _within_segments_sd(values, [0, *(c.index for c in found), runs])
    history = detectable_pct(history_se(noise, runs), 0.0, d, alpha=alpha)
    seen = (f"{runs} runs of history; a step of about {history:.1f}% is found at 80% power" if history is not None
            else f"{runs} runs of history")

    def made(status: Status, message: str, pct: float, reason: str | None = None) -> Judgement:
        return Judgement(metric, current, before, tolerance, d, status, pct, message, 1, runs - 1, "history",
                         found[-1].p_value if found else None, None, confidence, None, None, bound, reason,
                         history_detectable_pct=history)

    if not found:
        return made("ok", f"{metric}: no step in {seen} (tolerance {tolerance})", change_pct(current, after))
    step = found[-1]
    first = step.index  # the first run after the step (0-based; the current run is the last)
    pct = change_pct(after, before)
    way = "up" if after > before else "down"
    at = past[first] if first < len(past) else PastRun(current, None, math.inf)
    commit = f"commit {at.commit}" if at.commit else "no commit"
    where = f"at run {first + 1} ({commit}, {format_p_value(step.p_value)})"
    head = (f"{metric} stepped {way} {abs(pct):.1f}% {where}: {fmt_value(metric, before)} before, "
            f"{fmt_value(metric, after)} since, this run {fmt_value(metric, current)}")
    tail = f"(tolerance {tolerance}; {seen})"
    if abs(after - before) <= bound:
        return made("ok", f"{head}: within the tolerance {tail}", pct)
    if gain_of(after, before, d) > 0:
        return made("improved", f"{head} {tail}", pct)
    if accepted_until is not None and at.time <= accepted_until:
        reason = "the step came before the baseline was last recorded (--sglang-update-baseline accepted it)"
        return made("ok", f"{head}: {reason} {tail}", pct, reason)
    return made("regressed", f"{head} {tail}", pct)


def _within_segments_sd(values: Sequence[float], bounds: Sequence[int]) -> float | None:
    """The runs' spread around their own segment's mean (log scale): the run-to-run noise, steps left out."""
    residuals: list[float] = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        logs = [math.log(v) for v in values[lo:hi] if v > 0]
        if len(logs) > 1:
            mean = statistics.fmean(logs)
            residuals.extend(x - mean for x in logs)
    if len(residuals) < 3:
        return None
    dof = len(residuals) - (len(bounds) - 1)
    return math.sqrt(sum(r * r for r in residuals) / max(dof, 1))
