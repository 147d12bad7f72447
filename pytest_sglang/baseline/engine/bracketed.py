"""Bracketed A/B runs (one server alive at a time: first, second, first again): the second side's rounds
against both first-side runs by the rank-sum test (rounds.judge), the drift between the two first-side runs
beside it; a drift past the tolerance is not judged."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pytest_sglang.baseline.directions import Tolerance, direction
from pytest_sglang.baseline.engine.judgement import ABJudgement, ab_message
from pytest_sglang.baseline.engine.rounds import judge
from pytest_sglang.baseline.engine.verdict import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_CV_PCT,
    Status,
    ab_bound_pct,
    change_pct,
    gain_interval,
    placement,
    positive_figures,
)
from pytest_sglang.stats.inference import BOOTSTRAP_RESAMPLES


def judge_bracketed(metric: str, before: Sequence[float], second: Sequence[float], after: Sequence[float],
                    tolerance: Tolerance | None, *, first_label: str = "A", second_label: str = "B",
                    confidence: float = DEFAULT_CONFIDENCE, max_cv_pct: float | None = DEFAULT_MAX_CV_PCT,
                    resamples: int = BOOTSTRAP_RESAMPLES) -> ABJudgement:
    """First side, second side, first side again (one server alive at a time): the second side's rounds against
    both first-side runs (the rank-sum test and the bootstrap interval of the change of the medians, as
    :func:`judge`), and the drift of the first side between its two runs; a drift beyond the tolerance is
    ``not-judged``: the machine changed under the comparison."""
    d = direction(metric)
    ref = positive_figures(metric, first_label, [*before, *after])
    cur = positive_figures(metric, second_label, second)
    drift = change_pct(statistics.median(after), statistics.median(before))
    j = judge(metric, cur, ref, tolerance or Tolerance(0.0, True), current_label=second_label,
              reference_label=first_label, confidence=confidence, max_cv_pct=max_cv_pct, resamples=resamples)
    ratio = j.current / j.reference
    ci = (1 + j.ci_pct[0] / 100.0, 1 + j.ci_pct[1] / 100.0) if j.ci_pct else None
    sample = f"{len(cur)} vs {len(before)}+{len(after)} rounds"
    message = ab_message(metric, second_label, first_label, ratio, ci, confidence, sample, j.p_value, tolerance,
                         f"; {first_label} drifted {drift:+.1f}% from before to after")

    def made(status: Status, reason: str | None = None) -> ABJudgement:
        text = f"{metric} {reason}: {message}" if reason else message
        return ABJudgement(metric, ratio, ci, j.p_value, len(cur), status, text, tolerance, d, j.method,
                           confidence, drift_pct=drift, reason=reason, detectable_pct=j.detectable_pct)

    if tolerance is None:
        return made("ok")
    bound = ab_bound_pct(metric, tolerance, statistics.median(ref))
    if j.status == "regressed" and j.ci_pct and placement(*gain_interval(j.ci_pct, d), bound) == "beyond":
        return made("regressed")  # the one rule: wholly past the tolerance, whatever the drift
    if abs(drift) > bound:
        return made("not-judged", f"not judged: the machine drifted {abs(drift):.1f}% during the comparison "
                                  f"({first_label} before vs after; tolerance {tolerance})")
    if j.status == "not-judged":
        return made("not-judged", j.reason)
    if j.method == "tolerance":
        return made("not-judged", f"not judged: {j.reason}")
    return made(j.status)
