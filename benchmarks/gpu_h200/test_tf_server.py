"""What a user writes against a real GPU inference server: `transformers serve` on one H200 (profiles-tf.toml),
launched, watched and benchmarked by pytest-sglang's stock fixtures. run_h200.sh T runs it."""

from __future__ import annotations

import json

import pytest
import requests

# The same load on every profile, so sglang_results.compare can set them side by side.
BENCH = dict(num_requests=16, concurrency=4, input_len=128, output_len=64, warmup=2)


def test_health_and_completion(sglang_server):
    health = requests.get(sglang_server.url("/health"), timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    resp = requests.post(
        sglang_server.url("/v1/completions"),
        json={"model": sglang_server.model, "prompt": "The server is", "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    print(json.dumps(body))
    assert body["usage"]["completion_tokens"] == 8
    assert body["choices"][0]["finish_reason"] == "length"


def test_startup_phases(sglang_server):
    print(json.dumps({"profile": sglang_server.profile, "startup_seconds": sglang_server.startup_seconds,
                      "phases": sglang_server.phases, "log": str(sglang_server.log_path)}))
    assert 0 < sglang_server.startup_seconds < 300
    phases = sglang_server.phases
    assert "http_up" in phases and "ready" in phases, sorted(phases)
    assert phases["http_up"] <= phases["ready"] <= sglang_server.startup_seconds + 0.01


def test_startup_baselined(sglang_server, sglang_baseline):
    sglang_baseline.check(sglang_server, startup_seconds="50%")


def test_bench_stock_payload_is_rejected(sglang_server, text_prompts):
    """The stock load generator, unshimmed: its OpenAI bodies always carry `ignore_eos` (True or False), and
    transformers serve answers 422. Called through run_bench directly so the report holds only real figures."""
    from pytest_sglang.bench import BenchmarkFailedError, run_bench

    with pytest.raises(BenchmarkFailedError) as info:
        run_bench(sglang_server, num_requests=2, concurrency=1, input_len=16, output_len=8, warmup=0,
                  ignore_eos=False, prompts=text_prompts(2, 16))
    print(info.value)
    assert "422" in str(info.value) and "ignore_eos" in str(info.value)


def test_bench(sglang_bench, sglang_baseline, openai_strict, text_prompts):
    result = sglang_bench(**BENCH, api="completions",
                          prompts=text_prompts(BENCH["num_requests"], BENCH["input_len"]))
    print(result.summary())
    assert result.completed == BENCH["num_requests"] and result.failed == 0
    assert result.total_output_tokens == BENCH["num_requests"] * BENCH["output_len"]
    sglang_baseline.check(result, output_throughput="5%")


def test_bench_concurrency_32(sglang_server, sglang_bench, sglang_baseline, openai_strict, text_prompts):
    if sglang_server.profile != "tf-serve-cb":
        pytest.skip("without continuous batching one inference thread serves requests one at a time")
    result = sglang_bench(num_requests=64, concurrency=32, input_len=128, output_len=128, warmup=4,
                          api="completions", prompts=text_prompts(64, 128, seed=1))
    print(result.summary())
    assert result.completed == 64 and result.failed == 0
    assert result.total_output_tokens == 64 * 128
    sglang_baseline.check(result, output_throughput="5%")


@pytest.mark.sglang_compare
def test_continuous_batching_vs_one_thread(sglang_results):
    if not {"tf-serve", "tf-serve-cb"} <= set(sglang_results.profiles):
        pytest.skip(f"needs both profiles in one run (this run: {', '.join(sglang_results.profiles) or 'none'})")
    changes = sglang_results.compare("tf-serve-cb", "tf-serve", "test_bench", output_throughput="0%")
    print(json.dumps(changes))
