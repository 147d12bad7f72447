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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from pytest_sglang.baseline.engine.judgement import ABJudgement, noted, p_text
from pytest_sglang.baseline.engine.verdict import ab_bound_pct, beyond_noise
from pytest_sglang.baseline.stats import SessionSpread
from pytest_sglang.errors import BaselineError

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
    clause = (f"instance noise: CV {spread.cv_pct:.1f}% over {spread.n} A/A runs, an unchanged pair "
              f"{low:.2f}-{high:.2f}x, {p_text(p)} past the tolerance")
    return replace(paired, status=status, p_value=p, method="instance-noise", message=noted(paired, clause),
                   aa_runs=spread.n, instance_noise_cv_pct=spread.cv_pct)
