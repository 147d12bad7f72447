"""An A/B ratio against the instance noise of the machine: the rule of an A/B check given the log ratios of
at least AA_RUNS_NEEDED recorded A/A runs (store.py ``instance_noise``: two profiles of one server, same
workload, same machine).

Two instances of one server on one host need not run at one speed (on the H200 one held 4650 tok/s for a whole
job while its twin jumped 4700-6800, docs/gpu.md), and that difference persists for tens of seconds, so the
paired test, which assumes independent pairs, calls it a change. As sessions.judge_sessions does for sessions,
the ratio regresses when even an unchanged pair of instances at the tolerance's edge would give a ratio that
low with chance at most ``1 - confidence``: the one-sided prediction bound of the A/A ratios
(stats.SessionSpread), shifted by the tolerance. With fewer the paired rule stays and the message says what to
record.

This rule, not the pairs' spread, decides once the A/A runs exist, whatever the paired test said (even "not
judged"): the pairs' interval leaves out the instances' difference, the A/A runs measure it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from pytest_sglang.baseline.engine.judgement import ABJudgement, noted, p_text
from pytest_sglang.baseline.engine.power import catch_text, detectable_pct, history_se, log_sd
from pytest_sglang.baseline.engine.verdict import ab_bound_pct, beyond_noise
from pytest_sglang.errors import BaselineError
from pytest_sglang.stats.inference import SessionSpread

AA_RUNS_NEEDED = 5  # recorded A/A runs before their spread, not the pairs', judges an A/B check


def judge_instance_noise(paired: ABJudgement, noise: Sequence[float], first_median: float) -> ABJudgement:
    """``paired`` (a judged A/B metric) judged again by the instance noise: ``noise`` is the log ratios of
    recorded A/A runs (at least two); the A/B's ratio regresses when an unchanged pair of instances at the
    tolerance's edge falls that low with chance at most ``1 - confidence`` (improved likewise)."""
    if paired.tolerance is None:
        raise BaselineError(f"judging {paired.metric} by the instance noise needs a tolerance")
    spread = SessionSpread.of([math.exp(v) for v in noise])
    bound = ab_bound_pct(paired.metric, paired.tolerance, first_median) / 100.0
    status, p_worse, p_better = beyond_noise(spread, paired.ratio, 1.0 - bound, 1.0 + bound, paired.direction,
                                             paired.confidence)
    low, high = spread.bounds(paired.confidence)
    p = p_worse if (paired.ratio < 1.0) == (paired.direction == "higher") else p_better
    alpha = 1.0 - paired.confidence
    detectable = detectable_pct(spread.scale, bound * 100.0, paired.direction, alpha=alpha)
    history = detectable_pct(history_se(log_sd([math.exp(v) for v in noise])), 0.0, paired.direction, alpha=alpha)
    catch = catch_text(detectable, f"{spread.n} A/A runs", history)
    clause = (f"instance noise: CV {spread.cv_pct:.1f}% over {spread.n} A/A runs, an unchanged pair "
              f"{low:.2f}-{high:.2f}x, {p_text(p)} past the tolerance; {catch}")
    message = noted(replace(paired, message=_without_reason(paired)), clause)
    return replace(paired, status=status, p_value=p, method="instance-noise", message=message, reason=None,
                   aa_runs=spread.n, instance_noise_cv_pct=spread.cv_pct, detectable_pct=detectable,
                   history_detectable_pct=history)


def _without_reason(paired: ABJudgement) -> str:
    """The paired message without its "not judged: ..." head: the instance noise decides instead."""
    head = f"{paired.metric} {paired.reason}: "
    return paired.message[len(head):] if paired.reason and paired.message.startswith(head) else paired.message
