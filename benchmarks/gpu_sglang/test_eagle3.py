"""The seeds' comparison on real SGLang: ``--sglang-profile=baseline,eagle3`` (profiles-eagle3.toml).

Per profile: the startup and its phases, a small ``sglang_bench`` (16 requests, concurrency 4), and the greedy
outputs of 3 prompts x 16 tokens; then, after both profiles, ``sglang_results.compare_outputs("eagle3",
"baseline")`` and the two benchmarks side by side with EAGLE-3's accept length. Each figure is also one JSON line
in $FIGURES (run_sglang.sh E), so it survives a failed comparison.
"""

from __future__ import annotations

import json
import os

import pytest

BENCH = dict(num_requests=16, concurrency=4, input_len=128, output_len=64, warmup=4)
PROMPTS = ["The capital city of France is", "def fibonacci(n):", [40, 41, 42, 43, 44]]
MAX_TOKENS = 16


def record(kind: str, **figures) -> None:
    line = json.dumps({"kind": kind, **figures})
    print(line)
    path = os.environ.get("FIGURES")
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")


def test_startup(sglang_server):
    record("startup", profile=sglang_server.profile, startup_seconds=sglang_server.startup_seconds,
           phases=sglang_server.phases)
    assert {"load_weights", "kv_cache", "http_up", "ready"} <= set(sglang_server.phases)


def test_bench(sglang_server, sglang_bench):
    r = sglang_bench(**BENCH)
    print(r.summary())
    record("bench", profile=sglang_server.profile, output_throughput=r.output_throughput,
           median_ttft_ms=r.median_ttft_ms, median_itl_ms=r.median_itl_ms, median_tpot_ms=r.median_tpot_ms,
           accept_length=r.accept_length, accept_length_source=r.accept_length_source,
           server_accept_length=r.server_accept_length, total_output_tokens=r.total_output_tokens,
           server_generation_tokens=r.server_generation_tokens)
    assert r.completed == BENCH["num_requests"] and r.failed == 0
    assert r.total_output_tokens == BENCH["num_requests"] * BENCH["output_len"]
    if sglang_server.profile == "eagle3":
        assert r.accept_length is not None and r.accept_length >= 1.0, r.to_dict()


def test_outputs(sglang_server, sglang_outputs):
    outs = sglang_outputs(PROMPTS, max_tokens=MAX_TOKENS)
    record("outputs", profile=sglang_server.profile,
           outputs=[[o.text, list(o.token_ids) if o.token_ids is not None else None] for o in outs])
    assert all(o.token_ids is not None and len(o.token_ids) == MAX_TOKENS for o in outs)


@pytest.mark.sglang_compare
def test_eagle3_vs_baseline(sglang_results):
    base = sglang_results.get("baseline", "test_bench")
    eagle = sglang_results.get("eagle3", "test_bench")
    record("compare", baseline_tok_s=base.output_throughput, eagle3_tok_s=eagle.output_throughput,
           ratio=eagle.output_throughput / base.output_throughput, eagle3_accept_length=eagle.accept_length,
           eagle3_accept_length_source=eagle.accept_length_source,
           eagle3_server_accept_length=eagle.server_accept_length)
    try:
        cmp = sglang_results.compare_outputs("eagle3", "baseline")
    except pytest.fail.Exception as exc:
        record("outputs_compared", equal=False, message=str(exc))
        raise
    record("outputs_compared", equal=not cmp.differences, compared=cmp.compared, message=cmp.message)
