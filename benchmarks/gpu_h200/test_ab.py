"""Interleaved A/B with real SGLang on one H200 (run_h200.sh AB): A vs A passes, A vs --max-running-requests 12 at
concurrency 16 fails as regressed, and the rounds of a few round lengths for ab_study.py (how the paired spread
falls with pairs and round length). Each A/B's rounds are one JSON line in $FIGURES, whatever its verdict.

Knobs from the environment: AB_ROUNDS (pairs of the gated comparisons, default 10), AB_TOLERANCE (default 10%),
AB_STUDY ("requests x pairs" of the study runs, default "16x12"; empty: none). Letters before one mark it: "u"
(e.g. "u16x20") runs it with every thread of both servers and of pytest let onto all CPUs, then put back (the
unpinned control of a session whose profiles set `cpus`, run AB2); "n" runs it without the telemetry sampler
(its cost, beside the same study with it). The regression's pair runs first, then A vs A and the study on
the other pair (three server startups in all, one pair alive at a time), so a run cut short by the device's limit
loses the study first.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

import psutil
import pytest

from pytest_sglang.launch.process import OWNER_ENV

GATE = dict(num_requests=64, concurrency=16, input_len=128, output_len=128)
ROUNDS = int(os.environ.get("AB_ROUNDS", "10"))
TOLERANCE = os.environ.get("AB_TOLERANCE", "10%")
STUDY = [(s.rstrip("0123456789x"), *(int(x) for x in s.lstrip("un").split("x")))
         for s in os.environ.get("AB_STUDY", "16x12").split()]


def server_trees() -> list[psutil.Process]:
    """Every live process of the servers this pytest launched (each carries the owner token)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if OWNER_ENV in proc.environ():
                found.append(proc)
    return found


def affinity() -> dict[str, list[int]]:
    """pytest's CPUs and each server root's (its main thread's mask), by pid."""
    out = {"pytest": sorted(os.sched_getaffinity(0))}
    for proc in server_trees():
        with contextlib.suppress(psutil.Error):
            if proc.ppid() == os.getpid():
                out[f"server {proc.pid}"] = sorted(proc.cpu_affinity())
    return out


@contextlib.contextmanager
def unpinned() -> Iterator[None]:
    """Every thread of pytest and of the server trees on all CPUs for the block, then back on its own: the
    kernel keeps a mask per thread, so a process's mask alone would move only its main thread."""
    everything = set(range(os.cpu_count() or 1))
    saved: dict[int, set[int]] = {}
    for proc in (psutil.Process(), *server_trees()):
        with contextlib.suppress(psutil.Error, OSError):
            for thread in proc.threads():
                saved[thread.id] = os.sched_getaffinity(thread.id)
                os.sched_setaffinity(thread.id, everything)
    try:
        yield
    finally:
        for tid, cpus in saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)


def record(name: str, r, outcome=None, **extra) -> None:
    line = json.dumps({"kind": "ab", "name": name, "first": r.first, "second": r.second, "pairs": r.pairs,
                       "order": r.order, "ratio": r.ratio, "ci": r.ci, "p_value": r.p_value,
                       "rounds": {p: [x.output_throughput for x in rs] for p, rs in r.rounds.items()},
                       "itl": {p: [x.median_itl_ms for x in rs] for p, rs in r.rounds.items()},
                       "started_at": {p: [x.started_at for x in rs] for p, rs in r.rounds.items()},
                       "duration": {p: [x.duration for x in rs] for p, rs in r.rounds.items()},
                       "affinity": affinity(), "unpinned": False, "telemetry": True, **extra,
                       "num_requests": r.rounds[r.first][0].completed,
                       "gate": outcome.gate if outcome else None,
                       "message": outcome.gate_reason if outcome else None})
    print(line)
    path = os.environ.get("FIGURES")
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")


@pytest.mark.sglang_ab("ab-main", "ab-mrr12")
def test_max_running_requests_12_regresses(sglang_ab):
    r = sglang_ab(**GATE, rounds=ROUNDS, warmup=16)
    outcome = r.judge(output_throughput=TOLERANCE, max_cv="off")
    record("a-vs-mrr12", r, outcome)
    with pytest.raises(pytest.fail.Exception, match="regressed"):  # the report's gate says regressed, as it must
        r.check(output_throughput=TOLERANCE, max_cv="off")


@pytest.mark.sglang_ab("ab-main", "ab-same")
def test_a_vs_a_passes(sglang_ab):
    r = sglang_ab(**GATE, rounds=ROUNDS, warmup=16)
    outcome = r.judge(output_throughput=TOLERANCE, max_cv="off")
    record("a-vs-a", r, outcome)
    r.check(output_throughput=TOLERANCE, max_cv="off")


@pytest.mark.sglang_ab("ab-main", "ab-same")
@pytest.mark.parametrize(("flags", "num_requests", "pairs"), STUDY, ids=[f"{f}{n}x{p}" for f, n, p in STUDY])
def test_study_round_length(sglang_ab, flags, num_requests, pairs):
    free, telemetry = "u" in flags, "n" not in flags
    with unpinned() if free else contextlib.nullcontext():
        r = sglang_ab(**{**GATE, "num_requests": num_requests}, rounds=pairs, warmup=16, telemetry=telemetry)
        during = affinity()
    record(f"study-{flags}{num_requests}x{pairs}", r, unpinned=free, telemetry=telemetry, affinity=during)
