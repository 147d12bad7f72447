"""The server as a second witness (issue 9 point 2) and accept length where it is current (point 6): the
parser and the histogram median, then the whole path on the simulator in SGLang's and vLLM's names."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_sglang.bench import run_bench
from pytest_sglang.bench.server_metrics import histogram_quantile, parse_prometheus, snapshot, witness
from pytest_sglang.errors import BenchmarkFailedError
from pytest_sglang.sim.metrics import TTFT_BUCKETS

from .simproc import run_sim

SGLANG_TEXT = '''# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m",is_streaming="true"} 120.0
sglang:generation_tokens_total{model_name="m",is_streaming="false"} 8.0
sglang:spec_verify_calls_total{model_name="m"} 40.0
sglang:prompt_tokens_total{model_name="m",is_streaming="true"} 64.0
sglang:time_to_first_token_seconds_bucket{le="0.01",model_name="m"} 0.0
sglang:time_to_first_token_seconds_bucket{le="0.02",model_name="m"} 2.0
sglang:time_to_first_token_seconds_bucket{le="0.04",model_name="m"} 4.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4.0
'''


def test_parse_sum_over_label_sets_and_the_histogram_median() -> None:
    assert parse_prometheus('a_total{x="1",y="q\\"z"} 3\n# c\nbad line\nb 2.5 1700000000\n') == [
        ("a_total", {"x": "1", "y": 'q\\"z'}, 3.0), ("b", {}, 2.5)]
    snap = snapshot(SGLANG_TEXT)
    assert snap is not None and snap.family == "sglang"
    assert snap.counters == {"generation_tokens": 128.0, "spec_verify": 40.0, "prompt_tokens": 64.0}
    assert histogram_quantile(0.5, snap.histograms["ttft"]) == pytest.approx(0.02)
    assert histogram_quantile(0.75, snap.histograms["ttft"]) == pytest.approx(0.03)
    assert histogram_quantile(0.5, {1.0: 0.0, float("inf"): 0.0}) is None
    empty = snapshot("sglang:generation_tokens_total 0\n")
    assert empty is not None
    w = witness(empty, snap)
    assert (w.generation_tokens, w.prompt_tokens, w.accept_length) == (128, 64, 3.2)
    assert w.median_ttft_ms == pytest.approx(20.0)
    assert snapshot("other_metric 1\n") is None


def test_vllm_names_and_its_accept_length() -> None:
    before = snapshot("vllm:generation_tokens_total{engine=\"0\"} 10\nvllm:spec_decode_num_drafts_total 5\n"
                      "vllm:spec_decode_num_accepted_tokens_total 5\n")
    after = snapshot("vllm:generation_tokens_total{engine=\"0\"} 70\nvllm:spec_decode_num_drafts_total 25\n"
                     "vllm:spec_decode_num_accepted_tokens_total 45\n")
    assert before is not None and after is not None
    w = witness(before, after)
    assert w.family == "vllm" and w.generation_tokens == 60 and w.accept_length == pytest.approx(3.0)


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_the_servers_counts_equal_ours_every_round(tmp_path: Path, fmt: str) -> None:
    args = ("--enable-metrics",) if fmt == "sglang" else ()
    # a TTFT of 150 ms, inside the (100, 250] ms bucket: a loaded client reads it up to 100 ms late and still there
    with run_sim(tmp_path, {"decode_tok_s": 200, "ttft_ms": 150, "metrics_format": fmt}, *args) as sim:
        r = run_bench(sim, num_requests=8, concurrency=4, input_len=16, output_len=20, warmup=2, rounds=2)
        assert r.server_metrics == fmt
        assert r.server_generation_tokens == r.total_output_tokens == 8 * 20  # warmup excluded on both sides
        assert r.server_prompt_tokens == r.total_input_tokens == 8 * 16
        assert all(rnd.server_generation_tokens == 160 for rnd in r.rounds)
        # A histogram knows its bucket, no finer: the server's median lies in the bucket that holds ours.
        lo, hi = next((a, b) for a, b in zip((0.0, *TTFT_BUCKETS), TTFT_BUCKETS, strict=False)
                      if r.median_ttft_ms / 1000 <= b)
        assert r.server_median_ttft_ms is not None and lo * 1000 <= r.server_median_ttft_ms <= hi * 1000, r.to_dict()
        assert r.server_median_itl_ms is not None and r.server_disagreement is None
        assert r.to_dict()["server_generation_tokens"] == 160


def test_a_server_without_metrics_leaves_the_witness_empty(tmp_path: Path) -> None:
    with run_sim(tmp_path, {"decode_tok_s": 500, "ttft_ms": 5}) as sim:  # SGLang without --enable-metrics
        r = run_bench(sim, num_requests=4, input_len=8, output_len=4, warmup=1)
        assert r.server_metrics is None and r.server_generation_tokens is None


def test_a_miscounting_server_fails_the_run_naming_both_counts(tmp_path: Path) -> None:
    with run_sim(tmp_path, {"decode_tok_s": 500, "ttft_ms": 5, "metrics_skew": 1}, "--enable-metrics") as sim:
        with pytest.raises(BenchmarkFailedError) as info:
            run_bench(sim, num_requests=4, concurrency=2, input_len=8, output_len=5, warmup=1)
        assert "the server's /metrics (sglang) counted 24 generation tokens where the 4 responses carried 20" \
            in str(info.value)
        assert info.value.result is not None and info.value.result.server_generation_tokens == 24
        assert run_bench(sim, num_requests=2, input_len=8, output_len=5, warmup=0, server_metrics=False).ok


@pytest.mark.parametrize("api", ["completions", "chat", "generate"])
def test_accept_length_from_the_measured_requests(tmp_path: Path, api: str) -> None:
    """Per request (meta_info on /generate, SGLang's return_spec_tokens_details on the OpenAI APIs), not the
    /server_info figure: the simulator's server_info says 3.2 while its requests verify 2 tokens a step."""
    knobs = {"decode_tok_s": 400, "ttft_ms": 5, "accept_length": 2.0}
    with run_sim(tmp_path, knobs, "--speculative-algorithm", "EAGLE3", "--enable-metrics") as sim:
        r = run_bench(sim, api=api, num_requests=4, concurrency=4, input_len=8, output_len=20, warmup=1)  # type: ignore[arg-type]
        assert r.accept_length == pytest.approx(2.0) and r.accept_length_source == "requests", r.to_dict()
        assert r.server_accept_length == pytest.approx(2.0)


def test_accept_length_from_vllms_spec_counters(tmp_path: Path) -> None:
    knobs = {"decode_tok_s": 400, "ttft_ms": 5, "accept_length": 2.5, "metrics_format": "vllm"}
    with run_sim(tmp_path, knobs, "--speculative-algorithm", "EAGLE3") as sim:
        sim.kind = "vllm"  # the OpenAI stream carries no verify counts: /metrics is the only current figure
        r = run_bench(sim, num_requests=4, concurrency=4, input_len=8, output_len=20, warmup=1)
        assert r.accept_length_source == "server_metrics"
        assert r.accept_length == pytest.approx(20 / 8) == r.server_accept_length  # 8 steps carry 20 tokens
