"""What the run history holds, as values: a run and its benchmarks to append (RunRecord, BenchRecord), and what
reading a store gives back (StoredRun, one Row per metric of a benchmark)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BenchRecord:
    """One benchmark of a run: where it ran, what it ran, and each metric's every round."""

    profile: str
    test: str  # the test id (a sweep point's own: ``t.py::test_curve@concurrency=4``)
    machine: str  # the machine key the baseline check uses (GPUs, driver, server version)
    workload: str  # baseline/store.workload_key of the benchmark's arguments
    rounds: Mapping[str, Sequence[float]]  # metric -> every round's value
    server_version: str | None = None
    outcome: str | None = None  # the test's outcome: passed, failed, ...
    gate: str | None = None  # its gate: passed, regressed, not-judged, recorded, or None


@dataclass(frozen=True)
class RunRecord:
    """One pytest run: its commit, when, how it ended, and its benchmarks."""

    commit: str | None
    time: float  # seconds since the epoch
    exit_status: int | None = None  # pytest's exit status
    gate: str | None = None  # the report's gate status
    benchmarks: tuple[BenchRecord, ...] = ()


@dataclass(frozen=True)
class Row:
    """One metric of one benchmark of one stored run: what series and steps are built from."""

    run_id: int
    time: float
    commit: str | None
    profile: str
    test: str
    machine: str
    workload: str
    server_version: str | None
    metric: str
    median: float
    rounds: tuple[float, ...] = field(default=())


@dataclass(frozen=True)
class StoredRun:
    id: int
    time: float
    created: str
    commit: str | None
    exit_status: int | None
    gate: str | None
