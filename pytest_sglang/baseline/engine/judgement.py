"""The records the rules return (:class:`Judgement` against a reference, :class:`ABJudgement` of an A/B
comparison) and the wording their messages share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pytest_sglang.baseline.directions import Direction, Tolerance
from pytest_sglang.baseline.engine.verdict import DEFAULT_CONFIDENCE, Method, Status


@dataclass(frozen=True)
class Judgement:
    """One candidate judged against a reference (each one figure or the samples of rounds)."""

    metric: str
    current: float  # the median of the candidate's samples
    reference: float  # the median of the reference's samples
    tolerance: Tolerance
    direction: Direction
    status: Status  # regressed: worse than allowed (and significant, with rounds); not-judged: too noisy
    change_pct: float  # the figure's own change: (current - reference) / |reference| * 100
    message: str
    current_n: int = 1
    reference_n: int = 1
    method: Method = "tolerance"  # mann-whitney: rounds on both sides, significance tested
    p_value: float | None = None  # one-sided, in the direction of the observed change
    ci_pct: tuple[float, float] | None = None  # bootstrap interval of change_pct, at ``confidence``
    confidence: float = DEFAULT_CONFIDENCE
    current_cv_pct: float | None = None
    reference_cv_pct: float | None = None
    allowed: float | None = None  # the tolerance in the metric's unit (None: could not be computed)
    reason: str | None = None  # why not judged, or why the tolerance alone decided
    detectable_pct: float | None = None  # the smallest change in the bad direction caught at 80 % (power.py)
    history_detectable_pct: float | None = None  # the step a history of HISTORY_RUNS such runs finds
    unconfirmed: bool = False  # ok, though past the tolerance: the rounds could not show it was significant

    @property
    def failed(self) -> bool:
        return self.status == "regressed"

    @property
    def gain_pct(self) -> float:
        """``change_pct`` signed so that positive is better (a throughput up, a latency down)."""
        return self.change_pct if self.direction == "higher" else -self.change_pct


@dataclass(frozen=True)
class ABJudgement:
    """One metric of an A/B comparison: the second profile against the first."""

    metric: str
    ratio: float  # interleaved: the median of the paired ratios second/first; bracketed: of the medians
    #               NaN where neither side has the figure (a telemetry figure not measured)
    ci: tuple[float, float] | None  # the ratio's interval at ``confidence``
    p_value: float | None  # one-sided, in the direction of the observed change
    pairs: int  # interleaved: pairs of rounds; bracketed: the second side's rounds
    status: Status
    message: str
    tolerance: Tolerance | None = None
    direction: Direction = "higher"
    method: Method = "signed-rank"
    confidence: float = DEFAULT_CONFIDENCE
    spread_cv_pct: float | None = None  # of the paired ratios (interleaved)
    drift_pct: float | None = None  # bracketed: the first side's change from its run before to its run after
    reason: str | None = None  # why not judged
    aa_runs: int = 0  # recorded A/A runs of this workload and machine (their noise judges at AA_RUNS_NEEDED)
    instance_noise_cv_pct: float | None = None  # CV of those A/A runs' ratios, where they judged
    detectable_pct: float | None = None  # the smallest change in the bad direction caught at 80 % (power.py)
    history_detectable_pct: float | None = None  # the step a history of HISTORY_RUNS such runs finds

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "ratio": None if math.isnan(self.ratio) else self.ratio,
                "ci": list(self.ci) if self.ci else None,
                "p_value": self.p_value, "pairs": self.pairs, "status": self.status, "method": self.method,
                "tolerance": str(self.tolerance) if self.tolerance else None, "direction": self.direction,
                "confidence": self.confidence, "spread_cv_pct": self.spread_cv_pct, "drift_pct": self.drift_pct,
                "message": self.message, "reason": self.reason, "aa_runs": self.aa_runs,
                "instance_noise_cv_pct": self.instance_noise_cv_pct, "detectable_pct": self.detectable_pct,
                "history_detectable_pct": self.history_detectable_pct}


def ab_message(metric: str, second: str, first: str, ratio: float, ci: tuple[float, float] | None,
               confidence: float, sample: str, p: float | None, tolerance: Tolerance | None,
               extra: str = "") -> str:
    interval = f"{confidence:.0%} CI {ci[0]:.2f}-{ci[1]:.2f}, " if ci else ""
    stats = f"{interval}{sample}" + (f", {p_text(p)}" if p is not None else "")
    tol = f"; tolerance {tolerance}" if tolerance else ""
    return f"{second} {metric} {ratio:.2f}x {first} ({stats}{extra}{tol})"


def noted(judged: ABJudgement, clause: str) -> str:
    """The message with ``clause`` beside the statistics, before the tolerance that closes them."""
    head, sep, tail = judged.message.rpartition("; tolerance ")
    return f"{head}; {clause}{sep}{tail}" if sep else f"{judged.message} ({clause})"


def rounds_text(n: int) -> str:
    return f"{n} round{'s' if n != 1 else ''}"


def p_text(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"
