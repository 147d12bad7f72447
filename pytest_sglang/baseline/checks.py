"""The baseline check: this run's figures against the stored baseline of its profile, test and machine.

:func:`compare` judges each metric of a result with its tolerance through the one comparison engine
(engine.py) and returns a :class:`Comparison` (one :class:`Check` per metric, notes, and whether the test
fails), or records the figures instead under ``update``. :class:`BaselineChecker` is the session-level
check the ``sglang_baseline`` fixture calls: one store, one mode, one machine per server version.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_sglang.baseline.directions import Direction, Tolerance, direction, fmt_value
from pytest_sglang.baseline.engine import judge, metric_value
from pytest_sglang.baseline.machine import Machine, detect_machine
from pytest_sglang.baseline.store import BaselineStore, Entry
from pytest_sglang.errors import BaselineError


@dataclass
class Check:
    """One metric compared with its baseline."""

    metric: str
    current: float | None
    baseline: float | None
    tolerance: Tolerance
    direction: Direction
    status: Literal["ok", "regressed", "improved", "no-baseline", "missing"]
    change_pct: float | None = None  # the figure's own change vs the baseline in % (a slower startup: +)
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "current": self.current, "baseline": self.baseline,
                "tolerance": str(self.tolerance), "direction": self.direction, "status": self.status,
                "change_pct": self.change_pct, "message": self.message}


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

    @property
    def regressions(self) -> list[Check]:
        return [c for c in self.checks if c.status in ("regressed", "missing")]

    @property
    def failed(self) -> bool:
        return bool(self.regressions or self.errors)

    def failure_message(self) -> str:
        return "\n".join([c.message for c in self.regressions] + self.errors)

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "test_id": self.test_id, "machine": self.machine.key,
                "recorded": self.recorded,
                "baseline_recorded_at": self.entry.recorded_at if self.entry else None,
                "baseline_commit": self.entry.commit if self.entry else None,
                "checks": [c.to_dict() for c in self.checks], "notes": list(self.notes),
                "errors": list(self.errors)}


def _context(profile: str, entry: Entry) -> str:
    when = entry.recorded_at[:10] if entry.recorded_at else "at an unknown date"
    at = f" at {entry.commit}" if entry.commit else ""
    return f"profile {profile}, {entry.machine}, recorded {when}{at}"


def compare_one(metric: str, current: float | None, baseline: float | None, tolerance: Tolerance, *,
                profile: str, entry: Entry | None) -> Check:
    """One metric against its baseline: ``no-baseline`` and ``missing`` here, the rest by the engine."""
    d = direction(metric)
    if baseline is None or entry is None:
        measured = fmt_value(metric, current) if current is not None else "n/a"
        return Check(metric, current, None, tolerance, d, "no-baseline",
                     message=f"{metric}: no baseline yet ({measured} measured)")
    if current is None or (isinstance(current, float) and math.isnan(current)):
        return Check(metric, None, baseline, tolerance, d, "missing",
                     message=f"{metric} regressed: this run has no value for it vs baseline "
                             f"{fmt_value(metric, baseline)} ({_context(profile, entry)})")
    j = judge(metric, current, baseline, tolerance, context=_context(profile, entry))
    hint = "; record it with --sglang-update-baseline" if j.status == "improved" else ""
    return Check(metric, current, baseline, tolerance, d, j.status, j.change_pct, j.message + hint)


def compare(
    result: Any,
    tolerances: Mapping[str, str | float | int],
    *,
    store: BaselineStore,
    profile: str,
    test_id: str,
    machine: Machine,
    update: bool = False,
    strict: bool = False,
    commit: str | None = None,
    also_record: Iterable[str] = (),
) -> Comparison:
    """Compare ``result``'s figures with the stored baseline (or record them, with ``update``)."""
    parsed = {m: Tolerance.parse(m, t) for m, t in tolerances.items()}
    for metric in parsed:
        direction(metric)
    values = {m: metric_value(result, m) for m in parsed}
    if update:
        to_record = dict(values)
        for extra in also_record:
            if extra not in to_record:
                to_record[extra] = metric_value(result, extra)
        recorded = store.record(profile, test_id, machine,
                                {k: v for k, v in to_record.items() if v is not None}, commit=commit)
        comp = Comparison(profile, test_id, machine, recorded, recorded=True)
        shown = ", ".join(f"{k}={fmt_value(k, v)}" for k, v in to_record.items() if v is not None)
        comp.notes.append(f"recorded baseline for {profile} / {test_id} on {machine.key}: {shown}")
        return comp
    entry = store.lookup(profile, test_id, machine)
    comp = Comparison(profile, test_id, machine, entry)
    for metric, tol in parsed.items():
        baseline = entry.metrics.get(metric) if entry else None
        check = compare_one(metric, values[metric], baseline, tol, profile=profile, entry=entry)
        comp.checks.append(check)
        if check.status == "improved":
            comp.notes.append(check.message)
    missing = [c for c in comp.checks if c.status == "no-baseline"]
    if missing:
        where = f"{profile} / {test_id} on {machine.key}"
        others = [k for k in store.other_keys(profile, test_id) if k != machine.key]
        hint = f" (the file has this test on: {'; '.join(others)})" if others else ""
        names = ", ".join(c.metric for c in missing)
        text = (f"no baseline for {names} of {where} in {store.path}{hint}; "
                "run with --sglang-update-baseline to record one")
        if strict:
            comp.errors.append(f"{text} (--sglang-baseline-strict makes this a failure)")
        else:
            comp.notes.append(text)
    return comp


# --------------------------------------------------------------------------------------------------------
# Session-level checker (what the sglang_baseline fixture calls)


class BaselineChecker:
    """One per session: the store, the mode (compare, update, strict) and the machine per server version."""

    def __init__(self, store: BaselineStore, *, update: bool = False, strict: bool = False,
                 commit: str | None = None) -> None:
        self.store = store
        self.update = update
        self.strict = strict
        self.commit = commit
        self._machines: dict[str | None, Machine] = {}

    def machine(self, server: str | None) -> Machine:
        if server not in self._machines:
            self._machines[server] = detect_machine(server)
        return self._machines[server]

    def check(self, result: Any, tolerances: Mapping[str, str | float | int], *, profile: str, test_id: str,
              server: str | None) -> Comparison:
        """Compare (or record) ``result``. With no tolerances: ``output_throughput="5%"`` for a benchmark
        result, ``startup_seconds="20%"`` for a server handle."""
        if not tolerances:
            if metric_value(result, "output_throughput") is not None:
                tolerances = {"output_throughput": "5%"}
            elif metric_value(result, "startup_seconds") is not None:
                tolerances = {"startup_seconds": "20%"}
            else:
                raise BaselineError("check() needs tolerances, e.g. check(r, output_throughput='5%')")
        also = ["output_throughput"] if metric_value(result, "output_throughput") is not None else []
        return compare(result, tolerances, store=self.store, profile=profile, test_id=test_id,
                       machine=self.machine(server), update=self.update, strict=self.strict,
                       commit=self.commit, also_record=also)
