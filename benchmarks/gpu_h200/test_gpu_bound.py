"""The GPU-bound regime on one H200 (run_h200.sh GB): A/A instance noise and a controlled slowdown of known size,
through sglang_ab as a user writes it. Two sessions on the same two live servers (--sglang-reuse keeps them):

- ``-k test_aa --sglang-update-baseline``: GB_AA_JOBS A/A jobs (g-main vs g-twin, the same server twice), each
  recorded into the baseline file's instance noise and checked as the README's A/A test is;
- ``-k test_slowdown`` (no update): for each size in GB_SIZES, the twin's every forward pass made that many per
  cent longer on the GPU (pypath/sglprobe_slowdown.py, a file per port, set before the job and cleared after),
  judged with the README's default check, ``r.check(output_throughput="5%")`` (a regressed verdict recorded, not
  raised: the verdict of each size is the measurement), against the stored A/A runs.

Every job's rounds go to $FIGURES as one JSON line (ab_figures.py, with the slowdown patch's counters of both
servers over the job), so the figures can be judged again offline. Knobs: GB_PAIR ("g-main,g-twin"), GB_REQUESTS (32),
GB_CONCURRENCY (32), GB_INPUT (2048), GB_OUTPUT (64), GB_ROUNDS (6 pairs), GB_WARMUP (32), GB_AA_JOBS (5),
GB_SIZES ("12 20 7 4 12 7": per cent of each forward's GPU time; 0 is an unrecorded A/A control), GB_TOLERANCE
("5%"), GB_DEADLINE (epoch seconds: a job that would end past it is skipped, so the device call ends in time).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from ab_figures import finished, guard, ran, record

from pytest_sglang.plugin import plugin_of

PAIR = tuple(os.environ.get("GB_PAIR", "g-main,g-twin").split(","))
WORKLOAD = dict(num_requests=int(os.environ.get("GB_REQUESTS", "32")),
                concurrency=int(os.environ.get("GB_CONCURRENCY", "32")),
                input_len=int(os.environ.get("GB_INPUT", "2048")),
                output_len=int(os.environ.get("GB_OUTPUT", "64")))
ROUNDS = int(os.environ.get("GB_ROUNDS", "6"))
WARMUP = int(os.environ.get("GB_WARMUP", "32"))
AA_JOBS = int(os.environ.get("GB_AA_JOBS", "5"))
SIZES = [float(x) for x in os.environ.get("GB_SIZES", "12 20 7 4 12 7").split()]
TOLERANCE = os.environ.get("GB_TOLERANCE", "5%")
SLOW_DIR = Path(os.environ.get("GPU_WORK", "/tmp/gpu-sglang")) / "slowdown"


@pytest.fixture(autouse=True)
def _guard(request):
    guard(request.node.nodeid)


def patch_stats(port: int) -> dict[str, Any] | None:
    try:
        return json.loads((SLOW_DIR / f"{port}.stats").read_text())
    except (OSError, ValueError):
        return None


def set_slowdown(port: int, pct: float) -> None:
    SLOW_DIR.mkdir(parents=True, exist_ok=True)
    tmp = SLOW_DIR / f"{port}.tmp"
    tmp.write_text(f"{pct}\n")
    tmp.replace(SLOW_DIR / str(port))


def counters(before: dict | None, after: dict | None) -> dict[str, Any] | None:
    """The patch's counters over the job (after minus before), where both were read."""
    if not before or not after:
        return None
    return {"forwards": after["forwards"] - before["forwards"], "slowed": after["slowed"] - before["slowed"],
            "measured_ms": round(after["measured_ms"] - before["measured_ms"], 3),
            "injected_ms": round(after["injected_ms"] - before["injected_ms"], 3),
            "pct": after.get("pct"), "prefill_ms_per_token": after.get("prefill_ms_per_token"),
            "decode_ms": after.get("decode_ms"), "cycles_per_ms": after.get("cycles_per_ms"),
            "error": after.get("error")}


def ports(request: pytest.FixtureRequest) -> tuple[int, int]:
    """The pair's live servers (sglang_ab's setup has them up; acquiring the same pair again launches nothing)."""
    first, second = plugin_of(request.config).harness.pool.acquire(list(PAIR))
    return first.port, second.port


@pytest.mark.sglang_ab(*PAIR)
@pytest.mark.parametrize("job", range(AA_JOBS))
def test_aa(sglang_ab, request, job):
    """An A/A job as the README's calibration test, recorded under --sglang-update-baseline."""
    t0 = ran()
    a, b = ports(request)
    for port in (a, b):
        set_slowdown(port, 0.0)
    before = {p: patch_stats(p) for p in (a, b)}
    r = sglang_ab(**WORKLOAD, rounds=ROUNDS, warmup=WARMUP)
    seconds = finished(t0)
    time.sleep(0.6)  # the patch writes its counters at most every 0.5 s
    stats = {r.first: counters(before[a], patch_stats(a)), r.second: counters(before[b], patch_stats(b))}
    record(f"aa-{job}", r, r.judge(output_throughput=TOLERANCE), slowdown_pct=0.0, patch=stats,
           job_seconds=seconds, workload=WORKLOAD, warmup=WARMUP)
    r.check(output_throughput=TOLERANCE)


@pytest.mark.sglang_ab(*PAIR)
@pytest.mark.parametrize("pct", SIZES, ids=[f"{i}-{p:g}pct" for i, p in enumerate(SIZES)])
def test_slowdown(sglang_ab, request, pct):
    """The twin's forward passes made ``pct`` per cent longer on the GPU for one A/B job, judged by the
    README's default check against the stored A/A runs; recorded whatever the verdict."""
    t0 = ran()
    a, b = ports(request)
    set_slowdown(a, 0.0)
    before = {p: patch_stats(p) for p in (a, b)}
    set_slowdown(b, pct)
    try:
        r = sglang_ab(**WORKLOAD, rounds=ROUNDS, warmup=WARMUP)
    finally:
        set_slowdown(b, 0.0)
    seconds = finished(t0)
    time.sleep(0.6)
    stats = {r.first: counters(before[a], patch_stats(a)), r.second: counters(before[b], patch_stats(b))}
    try:  # check, not judge: the report and the summary carry each job's verdict as a user sees it
        outcome = r.check(output_throughput=TOLERANCE)
    except pytest.fail.Exception:
        outcome = r.comparisons[-1]
    record(f"slow-{pct:g}", r, outcome, slowdown_pct=pct, patch=stats, job_seconds=seconds, workload=WORKLOAD,
           warmup=WARMUP)
    assert stats[r.second] is None or stats[r.second]["slowed"] > 0 or pct == 0, \
        f"the slowdown patch slowed no forward pass of {r.second}: {stats[r.second]}"
