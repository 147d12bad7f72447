"""What a baseline check found: a :class:`Check` per metric and the :class:`Comparison` of one ``check()`` call,
with its gate (baseline/gate.py); checks.py makes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_sglang.baseline.directions import Direction, Tolerance
from pytest_sglang.baseline.gate import STATUS_GATE, Gate
from pytest_sglang.baseline.store import Entry
from pytest_sglang.machine.facts import Machine

CheckStatus = Literal["ok", "regressed", "improved", "not-judged", "no-baseline", "missing"]


@dataclass
class Check:
    """One metric compared with its baseline."""

    metric: str
    current: float | None  # the median of this run's rounds
    baseline: float | None  # the median of the baseline's rounds
    tolerance: Tolerance
    direction: Direction
    status: CheckStatus
    change_pct: float | None = None  # the figure's own change vs the baseline in % (a slower startup: +)
    message: str = ""
    rounds: int = 1  # this run's samples of the metric
    baseline_rounds: int = 0  # the baseline's (0: none); its sessions with method "sessions"
    method: str | None = None  # "sessions" (past sessions' spread), "mann-whitney" (rounds on both sides) or
    # "tolerance" (the tolerance alone)
    sessions: int = 0  # the baseline's recording sessions of the metric (older files: 1)
    p_value: float | None = None
    ci_pct: tuple[float, float] | None = None
    cv_pct: float | None = None
    baseline_cv_pct: float | None = None
    reason: str | None = None  # why it was not judged, or why the tolerance alone decided
    detectable_pct: float | None = None  # the smallest change in the bad direction caught at 80 % (power.py)
    history: str | None = None  # what the run history said of this metric (--sglang-history), where it did not fail
    unconfirmed: bool = False  # ok, though past the tolerance and not significant: told as a note

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "current": self.current, "baseline": self.baseline,
                "tolerance": str(self.tolerance), "direction": self.direction, "status": self.status,
                "change_pct": self.change_pct, "message": self.message, "rounds": self.rounds,
                "baseline_rounds": self.baseline_rounds, "method": self.method, "p_value": self.p_value,
                "ci_pct": list(self.ci_pct) if self.ci_pct else None, "cv_pct": self.cv_pct,
                "baseline_cv_pct": self.baseline_cv_pct, "reason": self.reason, "sessions": self.sessions,
                "detectable_pct": self.detectable_pct, "history": self.history}


@dataclass
class Comparison:
    """All checks of one ``check()`` call, and what the test should make of them."""

    profile: str
    test_id: str
    machine: Machine
    entry: Entry | None
    checks: list[Check] = field(default_factory=list)
    recorded: bool = False
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # failures other than regressions (strict, no baseline)
    warnings: list[str] = field(default_factory=list)  # checks that could not be judged, and why

    @property
    def regressions(self) -> list[Check]:
        return [c for c in self.checks if STATUS_GATE[c.status] == "regressed"]

    @property
    def not_judged(self) -> list[Check]:
        return [c for c in self.checks if STATUS_GATE[c.status] == "not-judged"]

    @property
    def failed(self) -> bool:
        return bool(self.regressions or self.errors)

    def failure_message(self) -> str:
        return "\n".join([c.message for c in self.regressions] + self.errors)

    @property
    def gate(self) -> Gate:
        if self.recorded:
            return "recorded"
        if self.regressions:
            return "regressed"
        return "not-judged" if self.not_judged or self.errors else "passed"

    @property
    def gate_reason(self) -> str | None:
        if self.gate == "regressed":
            return "; ".join(c.message for c in self.regressions)
        if self.gate == "not-judged":
            return "; ".join(f"{c.metric}: {c.reason or c.status}" for c in self.not_judged) or "; ".join(
                self.errors)
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "test_id": self.test_id, "machine": self.machine.key,
                "recorded": self.recorded,
                "baseline_recorded_at": self.entry.recorded_at if self.entry else None,
                "baseline_commit": self.entry.commit if self.entry else None,
                "checks": [c.to_dict() for c in self.checks], "notes": list(self.notes),
                "errors": list(self.errors), "gate": self.gate, "gate_reason": self.gate_reason}
