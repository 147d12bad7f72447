"""What a user writes against real SGLang on a GPU runner, run by run_sglang.sh on the lent H200.

Every test runs once per profile (--sglang-profile=default,nograph). Knobs from the driver's environment:
GATE_ROUNDS (rounds of the gated benchmark), NOISE_REPEATS (repeats of it on one server, unchecked, for the
noise calibration; default profile only), SWEEP (0 skips the concurrency sweep).
"""

from __future__ import annotations

import json
import os

import pytest
import requests

GATE = dict(num_requests=64, concurrency=16, input_len=128, output_len=128, warmup=16)
ROUNDS = int(os.environ.get("GATE_ROUNDS", "5"))
NOISE_REPEATS = int(os.environ.get("NOISE_REPEATS", "0"))
SWEEP_LEVELS = [1, 4, 8, 16]
# Tolerances a GPU user starts from; docs/gpu.md says what this run's noise suggests instead.
GATE_TOLERANCES = dict(output_throughput="10%", median_itl_ms="15%", median_ttft_ms="50%")
MAX_CV = "30%"


def test_completion(sglang_server):
    resp = requests.post(sglang_server.url("/v1/completions"), timeout=120,
                         json={"model": sglang_server.model, "prompt": "The server is", "max_tokens": 8,
                               "temperature": 0, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    print(json.dumps(body))
    assert body["usage"]["completion_tokens"] == 8


def test_startup(sglang_server, sglang_baseline):
    print(json.dumps({"profile": sglang_server.profile, "startup_seconds": sglang_server.startup_seconds,
                      "phases": sglang_server.phases}))
    phases = sglang_server.phases
    assert {"load_weights", "kv_cache", "http_up", "ready"} <= set(phases), sorted(phases)
    if sglang_server.profile == "default":
        assert "cuda_graph" in phases
    sglang_baseline.check(sglang_server, startup_seconds="30%")


def test_warm(sglang_server):
    """Compile Triton's kernels for every batch shape the measured tests use, before any of them is timed
    (the first request at a new batch size compiles; run_bench directly, so the report holds only real figures)."""
    from pytest_sglang.bench import run_bench

    for c in (1, 4, 8, 16, 32):
        r = run_bench(sglang_server, num_requests=max(c, 4), concurrency=c, input_len=128, output_len=32,
                      warmup=0)
        assert r.failed == 0


def test_gate(sglang_bench, sglang_baseline):
    r = sglang_bench(**GATE, rounds=ROUNDS)
    print(r.summary())
    assert r.completed == GATE["num_requests"] and r.failed == 0
    assert r.total_output_tokens == GATE["num_requests"] * GATE["output_len"]
    sglang_baseline.check(r, **GATE_TOLERANCES, max_cv=MAX_CV)


@pytest.mark.parametrize("repeat", range(max(NOISE_REPEATS, 1)))
def test_noise(sglang_server, sglang_bench, repeat):
    """The gated benchmark again and again on one server, unchecked: calibration input (summarize.py)."""
    if not NOISE_REPEATS or sglang_server.profile != "default":
        pytest.skip("noise repeats only on the default profile, when NOISE_REPEATS is set")
    r = sglang_bench(**GATE, rounds=ROUNDS)
    assert r.failed == 0


def test_sweep(sglang_server, sglang_bench, sglang_baseline):
    if os.environ.get("SWEEP", "1") == "0" or sglang_server.profile != "default":
        pytest.skip("sweep on the default profile only (SWEEP=0 skips it)")
    curve = sglang_bench.sweep(concurrency=SWEEP_LEVELS, num_requests=32, input_len=128, output_len=128, warmup=4)
    for point in curve:
        print(point.summary())
        assert point.failed == 0
        sglang_baseline.check(point, output_throughput="15%")
    knee = curve.knee()
    print("knee:", knee.sweep if knee is not None else None)
