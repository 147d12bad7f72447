"""The JSON report: built from the session ledger, with each benchmark's gate; written atomically."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_sglang.baseline import Comparison, Machine, gate_of
from pytest_sglang.baseline.gate import worst
from pytest_sglang.bench.sweep import CURVE_X, CURVE_Y, knee_index
from pytest_sglang.session import SessionLedger

SCHEMA = "pytest-sglang-report"
SCHEMA_VERSION = 1
_CHECK_DETAIL = ("rounds", "baseline_rounds", "method", "p_value", "ci_pct", "cv_pct", "baseline_cv_pct", "reason",
                 "sessions", "detectable_pct", "history")


def _baseline_view(comps: Iterable[Comparison]) -> dict[str, Any]:
    view: dict[str, Any] = {}
    for comp in comps:
        for check in comp.checks:
            detail = check.to_dict()
            view[check.metric] = {"baseline": check.baseline, "current": check.current,
                                  "change_pct": check.change_pct, "tolerance": str(check.tolerance),
                                  "status": check.status, **{k: detail[k] for k in _CHECK_DETAIL}}
        if comp.recorded and comp.entry:
            for metric, value in comp.entry.metrics.items():
                n = len(comp.entry.samples.get(metric, [value]))
                view.setdefault(metric, {"baseline": value, "current": value, "change_pct": 0.0,
                                         "tolerance": None, "status": "recorded", "rounds": n,
                                         "baseline_rounds": n, "sessions": len(comp.entry.sessions_of(metric))})
    return view


def _profile_gate(record: Any, server_checks: Sequence[Comparison]) -> tuple[str | None, str | None]:
    if record is not None and not record.ready:
        return "not-judged", f"the server could not start: {record.reason}"
    return gate_of(None, server_checks)


def _sweeps(benches: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The curves of this profile: benchmarks of one test tagged by a sweep, in load order, with the knee."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for b in benches:
        point = b["result"].get("sweep")
        if point:
            groups.setdefault((b["test_id"], point["param"]), []).append(b)
    out = []
    for (test_id, param), items in groups.items():
        items.sort(key=lambda b: b["result"]["sweep"]["value"])
        points = [{"value": b["result"]["sweep"]["value"], CURVE_Y: b["result"][CURVE_Y],
                   CURVE_X: b["result"][CURVE_X], "median_ttft_ms": b["result"]["median_ttft_ms"],
                   "median_tpot_ms": b["result"]["median_tpot_ms"], "goodput": b["result"].get("goodput"),
                   "gate": b.get("gate")} for b in items]
        i = knee_index([p[CURVE_X] for p in points], [p[CURVE_Y] for p in points])
        out.append({"test_id": test_id, "param": param, "x": CURVE_X, "y": CURVE_Y, "points": points,
                    "knee": points[i]["value"] if i is not None else None})
    return out


def _bench_key(bench: dict[str, Any]) -> str:
    """The test id, and a sweep point's load: ``t.py::test_curve@concurrency=4`` (its baseline key)."""
    point = bench["result"].get("sweep")
    return f"{bench['test_id']}@{point['param']}={point['value']:g}" if point else bench["test_id"]


def _gate_summary(profiles: dict[str, Any], ab_runs: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    summary: dict[str, Any] = {"status": None, "passed": 0, "recorded": 0, "unchecked": 0, "regressed": [],
                               "not_judged": []}
    for name, prof in profiles.items():
        items = [(_bench_key(b), b["nodeid"], b.get("gate"), b.get("gate_reason")) for b in prof["benchmarks"]]
        if prof.get("gate"):
            items.append(("(server)", None, prof["gate"], prof["gate_reason"]))
        for test_id, nodeid, gate, reason in items:
            if gate in ("regressed", "not-judged"):
                key = "regressed" if gate == "regressed" else "not_judged"
                summary[key].append({"profile": name, "test_id": test_id, "nodeid": nodeid, "reason": reason})
            else:
                summary["unchecked" if gate is None else gate] += 1
    for ab in ab_runs:
        pair = f"{ab['second']} vs {ab['first']}"
        test_id = ab["nodeid"]
        if ab.get("gate") in ("regressed", "not-judged"):
            key = "regressed" if ab["gate"] == "regressed" else "not_judged"
            summary[key].append({"profile": pair, "test_id": test_id, "nodeid": test_id, "reason": ab["gate_reason"]})
        else:
            summary["unchecked" if ab.get("gate") is None else ab["gate"]] += 1
    # the run's status sums what was judged: a run that only recorded baselines has none
    judged = [("regressed", bool(summary["regressed"])), ("not-judged", bool(summary["not_judged"])),
              ("passed", bool(summary["passed"]))]
    summary["status"] = worst(gate for gate, seen in judged if seen)  # type: ignore[misc]
    return summary


def build_report(ledger: SessionLedger, *, machine: Machine | None = None, commit: str | None = None,
                 baseline_path: str | None = None, created: datetime | None = None) -> dict[str, Any]:
    profiles: dict[str, Any] = {}
    for name in ledger.profiles:
        record = ledger.startups.get(name)
        server_checks = [c for c in ledger.startup_checks if c.profile == name]
        benches = []
        for b in ledger.benches:
            if b.profile != name:
                continue
            gate, reason = gate_of(b.result, b.comparisons)
            died = record.died if record is not None and b.result.failed else None
            if died:  # its failed requests are the death, not a measurement: no figure of it is shown
                reason = f"the server died during this benchmark: {died}"
            benches.append({
                "test_id": b.test_id,
                "nodeid": b.nodeid,
                "outcome": b.outcome,
                "machine_key": b.machine_key,
                "gate": gate,
                "gate_reason": reason,
                "server_died": died,
                "result": b.result.to_dict(),
                "telemetry": b.result.telemetry,
                "baseline": _baseline_view(b.comparisons),
                "notes": ([b.result.cache_note] if b.result.cache_note else []) + [n for c in b.comparisons
                                                                                   for n in c.notes],
                "warnings": [w for c in b.comparisons for w in c.warnings],
            })
        server_gate, server_reason = _profile_gate(record, server_checks)
        profiles[name] = {
            "kind": record.kind if record else None,
            "model": record.model if record else None,
            "server_version": ledger.server_versions.get(name),
            "origin": record.origin if record else None,
            "outcome": record.outcome if record else None,
            "startup_seconds": record.startup_seconds if record else None,
            "phases": dict(record.phases) if record else {},
            "log_path": str(record.log_path) if record and record.log_path else None,
            "error": record.error if record and not record.ready else None,
            "died": record.died if record else None,
            "gate": server_gate,
            "gate_reason": server_reason,
            "startup_baseline": _baseline_view(server_checks).get("startup_seconds"),
            "benchmarks": benches,
            "sweeps": [],
        }
    return summarize({
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": (created or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "machine": machine.name if machine else None,
        "machine_key": machine.key if machine else None,
        "commit": commit,
        "baseline_file": baseline_path,
        "gate": None,
        "profiles": profiles,
        "ab": [{"nodeid": a.nodeid, "outcome": a.outcome, **a.result.to_dict()} for a in ledger.ab],
    })


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """(Re)compute what a report derives from its benchmarks: each profile's ``sweeps`` and the top-level
    ``gate``; call it again after folding other reports' benchmarks in (pytest-xdist workers')."""
    for prof in report["profiles"].values():
        prof["sweeps"] = _sweeps(prof["benchmarks"])
    report["gate"] = _gate_summary(report["profiles"], report.get("ab", ()))
    return report


def write_json(path: str | Path, report: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


