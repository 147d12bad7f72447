"""A session against the medians of past recording sessions: the rule of a baseline check once its entry
has SESSIONS_NEEDED of them (store.py, version 3).

It judges how much whole sessions differ, not how much one session's rounds do (on a real host sessions differ
far more, docs/gpu.md). The new session's median regresses when even an unchanged session at the tolerance's
edge would fall that low with chance at most ``1 - confidence``: the one-sided prediction bound of the past
sessions' medians (log scale, Student's t, stats.SessionSpread), shifted by the tolerance. With fewer sessions
rounds.judge applies and the check says that the session noise is not yet known.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pytest_sglang.baseline.directions import Tolerance, direction, fmt_value
from pytest_sglang.baseline.engine.judgement import Judgement, p_text, rounds_text
from pytest_sglang.baseline.engine.power import catch_text, detectable_pct, history_se, log_sd
from pytest_sglang.baseline.engine.verdict import (
    DEFAULT_CONFIDENCE,
    Status,
    beyond_noise,
    change_pct,
    cv_pct,
    gain_of,
    over_limit,
    samples_of,
    settle,
)
from pytest_sglang.stats.inference import SessionSpread

SESSIONS_NEEDED = 5  # past recording sessions before their spread, not the rounds', judges a baseline check


def judge_sessions(
    metric: str,
    current: float | Sequence[float],
    sessions: Sequence[float],
    tolerance: Tolerance,
    *,
    context: str = "",
    confidence: float = DEFAULT_CONFIDENCE,
    max_cv_pct: float | None = None,
) -> Judgement:
    """Judge this session (a figure, or its rounds' median) against past sessions' medians (at least two,
    positive): their geometric mean is the reference, their spread the noise; a ``sigma`` tolerance is in
    standard deviations of the session medians. ``not-judged`` when this session's rounds spread more than
    ``max_cv_pct`` and it is not beyond the noise."""
    d = direction(metric)
    cur = samples_of(current)
    cur_med, n, cur_cv = statistics.median(cur), len(cur), cv_pct(cur)
    spread = SessionSpread.of(sessions)
    ref = spread.center
    pct = change_pct(cur_med, ref)
    bound = tolerance.allowed(ref, statistics.stdev(sessions))
    alpha = 1.0 - confidence
    detectable = detectable_pct(spread.scale, bound / ref * 100.0, d, alpha=alpha)
    history = detectable_pct(history_se(log_sd(sessions)), 0.0, d, alpha=alpha)
    noise = f"session noise: CV {spread.cv_pct:.1f}% over {spread.n} past sessions"

    def made(status: Status, message: str, *, p_value: float | None = None, ci_pct: tuple[float, float] | None = None,
             reason: str | None = None) -> Judgement:
        return Judgement(metric, cur_med, ref, tolerance, d, status, pct, message, n, spread.n, "sessions", p_value,
                         ci_pct, confidence, cur_cv, spread.cv_pct, bound, reason, detectable, history)

    shown = f"{pct:+.1f}%"
    versus = f"{fmt_value(metric, cur_med)} vs baseline {fmt_value(metric, ref)} (sessions' geometric mean)"
    where = f" (tolerance {tolerance}{'; ' + context if context else ''})"
    status, p_worse, p_better = beyond_noise(spread, cur_med, (ref - bound) / ref, (ref + bound) / ref, d,
                                             confidence)
    # the one rule (verdict.settle): beyond the session noise regresses whatever this run's rounds spread
    if settle(status, "beyond" if status == "regressed" else None, over_limit(cur_cv, max_cv_pct)) == "not-judged":
        assert cur_cv is not None and max_cv_pct is not None
        reason = f"too noisy to judge: CV {cur_cv:.1f}% over this run's {rounds_text(n)} (limit {max_cv_pct:g}%)"
        return made("not-judged", f"{metric} {reason}: {versus}, {shown}{where}", reason=reason)
    low, high = spread.bounds(confidence)
    interval = (change_pct(low, ref), change_pct(high, ref))
    p = p_worse if gain_of(cur_med, ref, d) < 0 else p_better
    stats = (f"({noise}; an unchanged session falls within {interval[0]:+.1f} to {interval[1]:+.1f}% at "
             f"{confidence:.0%} each side; {p_text(p)} past the tolerance; {catch_text(detectable, '', history)})")
    head = f"{status} {abs(pct):.1f}% beyond the tolerance and" if status != "ok" else \
        f"{shown} within the tolerance plus"
    message = f"{metric} {head} the session noise {stats}: {versus}{where}"
    return made(status, message, p_value=p, ci_pct=interval)
