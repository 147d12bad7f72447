"""A session's JSON report (report/build.py, every pytest-xdist worker's benchmarks folded in) as the run the
history appends: one BenchRecord per benchmark, keyed as the baseline check keys it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from pytest_sglang.baseline.checks import infrastructure_problem
from pytest_sglang.baseline.directions import direction
from pytest_sglang.baseline.store import workload_key
from pytest_sglang.errors import BaselineError
from pytest_sglang.history.records import BenchRecord, RunRecord

if TYPE_CHECKING:
    from pytest_sglang.session import ABEntry

# What a benchmark was asked to do (BenchResult's fields): a change of any of them starts a new series.
WORKLOAD_FIELDS = ("api", "num_requests", "max_concurrency", "request_rate", "input_len", "output_len", "warmup",
                   "seed", "prompt_kind", "num_rounds", "slo")
# Figures with a direction that describe the run's bookkeeping or the client, not the server's speed.
NOT_TRACKED = frozenset({"completed", "failed", "chunk_count_mismatches", "client_cpu_seconds"})


def workload_of(result: Mapping[str, Any]) -> str:
    """The benchmark's arguments as baseline/store.workload_key writes them (``num_rounds`` as ``rounds``)."""
    asked = {("rounds" if k == "num_rounds" else k): result.get(k) for k in WORKLOAD_FIELDS}
    return workload_key({k: v for k, v in asked.items() if v is not None})


def tracked(metric: str, value: Any) -> bool:
    """A figure the history keeps: a finite number with a known better direction."""
    if metric in NOT_TRACKED or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if not math.isfinite(value):
        return False
    try:
        direction(metric)
    except BaselineError:
        return False
    return True


def rounds_of(result: Mapping[str, Any]) -> dict[str, list[float]]:
    """metric -> every round's value (the one figure of a run without rounds); a metric that a round lacks keeps
    the result's own figure, as BenchResult.samples does."""
    rounds = result.get("rounds") or []
    out: dict[str, list[float]] = {}
    for metric, value in result.items():
        if not tracked(metric, value):
            continue
        per_round = [r.get(metric) for r in rounds]
        if per_round and all(tracked(metric, v) for v in per_round):
            out[metric] = [float(v) for v in per_round]
        else:
            out[metric] = [float(value)]
    return out


def bench_key(bench: Mapping[str, Any]) -> str:
    """The test id, and a sweep point's load (its own series, as it is its own baseline)."""
    point = bench["result"].get("sweep")
    return f"{bench['test_id']}@{point['param']}={point['value']:g}" if point else str(bench["test_id"])


def ab_benches(entries: Sequence[ABEntry], machine_of: Callable[[str | None], str],
               versions: Mapping[str, str | None]) -> tuple[list[BenchRecord], list[dict[str, str]]]:
    """Each side of each ``sglang_ab`` run as a benchmark of its profile under the A/B test's node id, keyed by
    the A/B workload (as its instance noise is): the candidate's and the reference's own series."""
    benches: list[BenchRecord] = []
    skipped: list[dict[str, str]] = []
    for entry in entries:
        ab = entry.result
        gate = ab.to_dict()["gate"]
        for side in dict.fromkeys((ab.first, ab.second)):
            results = ab.rounds.get(side) or []
            problem = next((p for r in results if (p := infrastructure_problem(r))), None)
            dicts = [r.to_dict() for r in results]
            rounds = {m: [float(d[m]) for d in dicts] for m in (dicts[0] if dicts else {})
                      if all(tracked(m, d.get(m)) for d in dicts)}
            if problem or not rounds or entry.workload is None:
                skipped.append({"profile": side, "test": entry.nodeid,
                                "reason": problem or "no figure with a known direction"})
                continue
            benches.append(BenchRecord(
                profile=side, test=entry.nodeid, machine=entry.machine_keys.get(side) or machine_of(versions.get(side)),
                workload=entry.workload, rounds=rounds, server_version=versions.get(side), outcome=entry.outcome,
                gate=gate))
    return benches, skipped


def run_of(report: Mapping[str, Any], *, commit: str | None, time: float, exit_status: int | None,
           machine_of: Callable[[str | None], str], ab: Sequence[ABEntry] = (),
           versions: Mapping[str, str | None] | None = None) -> tuple[RunRecord, list[dict[str, str]]]:
    """The run to append, and the benchmarks left out of it with why: those whose figures say nothing about the
    server (failed requests, a client-bound run: the gate's own rule), which would otherwise read as steps.
    ``machine_of(server_version)``: the machine key of a benchmark whose report entry has none (this machine,
    with that server version). ``ab``: the session's A/B runs (``versions``: each profile's server version).
    """
    benches: list[BenchRecord] = []
    skipped: list[dict[str, str]] = []
    for profile, prof in report.get("profiles", {}).items():
        version = prof.get("server_version")
        for bench in prof.get("benchmarks", []):
            problem = infrastructure_problem(SimpleNamespace(**bench["result"]))
            rounds = rounds_of(bench["result"])
            if problem or not rounds:
                skipped.append({"profile": profile, "test": bench_key(bench),
                                "reason": problem or "no figure with a known direction"})
                continue
            benches.append(BenchRecord(
                profile=profile, test=bench_key(bench), machine=bench.get("machine_key") or machine_of(version),
                workload=workload_of(bench["result"]), rounds=rounds, server_version=version,
                outcome=bench.get("outcome"), gate=bench.get("gate")))
    ab_found, ab_skipped = ab_benches(ab, machine_of, versions or {})
    benches += ab_found
    skipped += ab_skipped
    gate = (report.get("gate") or {}).get("status")
    run = RunRecord(commit=commit, time=time, exit_status=exit_status, gate=gate, benchmarks=tuple(benches))
    return run, skipped
