"""The metrics math, on hand-made request records: bench_serving's definitions, failures never hidden; payloads and
bad arguments."""

from __future__ import annotations

import math

import pytest

from pytest_sglang.bench import (
    BenchResult,
    RequestRecord,
    compute_metrics,
    expected_throughput,
    make_prompts,
    percentile,
    record_from_stream,
    run_bench,
)
from pytest_sglang.bench.payloads import build_payload
from pytest_sglang.bench.stream import ConnectionPool, StreamResult
from pytest_sglang.errors import BenchmarkError


def rec(start: float, ttft: float, gaps: list[float], out: int, *, ok: bool = True, inp: int = 10,
        chunks: int | None = None, **kw: object) -> RequestRecord:
    latency = ttft + sum(gaps)
    return RequestRecord(ok=ok, start=start, latency=latency, ttft=ttft, itls=gaps, input_tokens=inp,
                         output_tokens=out if ok else 0, chunks=chunks if chunks is not None else len(gaps) + 1,
                         server_counted=True, **kw)  # type: ignore[arg-type]


def test_percentile_matches_numpy_linear() -> None:
    data = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(data, 50) == 3.0
    assert percentile(data, 90) == pytest.approx(7.6)  # numpy.percentile(data, 90)
    assert percentile(data, 99) == pytest.approx(9.76)
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) == 0.0


def test_throughput_is_tokens_over_first_send_to_last_done() -> None:
    records = [rec(0.0, 0.1, [0.1] * 9, 10), rec(0.5, 0.1, [0.1] * 9, 10)]  # ends at 1.0 and 1.5
    r = compute_metrics(records)
    assert r.duration == pytest.approx(1.5)
    assert r.total_output_tokens == 20
    assert r.output_throughput == pytest.approx(20 / 1.5)
    assert r.input_throughput == pytest.approx(20 / 1.5)
    assert r.request_throughput == pytest.approx(2 / 1.5)
    assert r.total_throughput == pytest.approx(40 / 1.5)
    assert r.median_ttft_ms == pytest.approx(100)
    assert r.median_itl_ms == pytest.approx(100)
    assert r.mean_tpot_ms == pytest.approx(100)  # (1.0 - 0.1) / (10 - 1)
    assert r.median_e2e_latency_ms == pytest.approx(1000)
    assert r.concurrency == pytest.approx(2.0 / 1.5)
    assert r.completed == 2 and r.failed == 0 and r.first_failure is None and r.ok


def test_failures_are_counted_and_named_never_hidden() -> None:
    bad = rec(0.2, 0.0, [], 0, ok=False, status=503, error='{"error": "overloaded"}')
    r = compute_metrics([rec(0.0, 0.1, [0.1], 2), bad, rec(0.0, 0.1, [0.1], 2)])
    assert r.completed == 2 and r.failed == 1 and not r.ok
    assert r.first_failure == {"index": 1, "status": 503, "error": '{"error": "overloaded"}'}
    assert r.total_output_tokens == 4  # failed requests add nothing
    assert "1 of 3 requests failed" in r.summary()
    assert "HTTP 503" in r.summary()


def test_server_token_count_wins_over_the_chunks_of_several_tokens() -> None:
    s = StreamResult(ok=True, status=200, start=0.0, end=1.0, chunk_times=[0.1, 0.5, 1.0], completion_tokens=9,
                     prompt_tokens=7)
    r = record_from_stream(s, prompt_tokens=99)
    assert r.output_tokens == 9 and r.input_tokens == 7 and r.chunks == 3
    assert r.itls == pytest.approx([0.4, 0.5])
    res = compute_metrics([r])
    assert res.chunk_count_mismatches == 0  # 3 events carrying 9 tokens: normal, speculative or not
    assert res.server_token_counts_missing == 0


def test_a_mismatch_is_more_output_events_than_the_server_counted_tokens() -> None:
    """Each output-bearing event carries at least one new token: more events than tokens is a server whose counts
    (and so the throughputs) are short; fewer is several tokens an event, which SGLang streams without
    speculative decoding too (coalesced outputs under load, held-back partial UTF-8, --stream-interval)."""
    short = record_from_stream(StreamResult(ok=True, status=200, start=0.0, end=1.0,
                                            chunk_times=[0.1, 0.2, 0.3, 0.4], completion_tokens=3), prompt_tokens=5)
    exact = record_from_stream(StreamResult(ok=True, status=200, start=0.0, end=1.0,
                                            chunk_times=[0.1, 0.2, 0.3], completion_tokens=3), prompt_tokens=5)
    fewer = record_from_stream(StreamResult(ok=True, status=200, start=0.0, end=1.0,
                                            chunk_times=[0.1, 0.9], completion_tokens=3), prompt_tokens=5)
    assert compute_metrics([short, exact, fewer]).chunk_count_mismatches == 1


def test_chunk_count_is_the_fallback_when_the_server_gives_none() -> None:
    s = StreamResult(ok=True, status=200, start=0.0, end=1.0, chunk_times=[0.1, 0.5, 1.0])
    r = record_from_stream(s, prompt_tokens=5)
    assert r.output_tokens == 3 and r.input_tokens == 5 and not r.server_counted
    assert compute_metrics([r]).server_token_counts_missing == 1


def test_native_spec_verify_gives_accept_length() -> None:
    records = [rec(0.0, 0.1, [0.1] * 3, 12, spec_verify_ct=4, chunks=4),
               rec(0.0, 0.1, [0.1] * 5, 18, spec_verify_ct=6, chunks=6)]
    assert compute_metrics(records).accept_length == pytest.approx(3.0)
    assert compute_metrics([rec(0.0, 0.1, [0.1], 2)]).accept_length is None


def test_to_dict_is_json_ready_with_bench_serving_names() -> None:
    import json

    r = compute_metrics([rec(0.0, 0.1, [0.1], 2)], request_rate=math.inf, profile="p")
    d = r.to_dict()
    json.dumps(d)
    assert d["request_rate"] == "inf"
    for key in ("output_throughput", "input_throughput", "request_throughput", "completed",
                "total_output_tokens", "duration", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
                "median_e2e_latency_ms", "accept_length", "p90_tpot_ms", "first_failure",
                "chunk_count_mismatches"):
        assert key in d
    assert "requests" not in d and "requests" in r.to_dict(include_requests=True)
    assert isinstance(r, BenchResult)


def test_prompts_are_exact_token_ids_and_seeded() -> None:
    a, kind = make_prompts(3, 17, seed=1, want_ids=True)
    b, _ = make_prompts(3, 17, seed=1, want_ids=True)
    c, _ = make_prompts(3, 17, seed=2, want_ids=True)
    assert kind == "token_ids" and a == b and a != c
    assert all(isinstance(p, list) and len(p) == 17 for p in a)
    texts, kind = make_prompts(2, 8, seed=1, want_ids=False)
    assert kind == "approx_text" and all(isinstance(t, str) and len(t.split()) == 8 for t in texts)


def test_payloads_per_api() -> None:
    path, body = build_payload("generate", prompt=[1, 2, 3], output_len=5)
    assert path == "/generate" and body["input_ids"] == [1, 2, 3]
    assert body["sampling_params"] == {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True}
    path, body = build_payload("completions", prompt=[1, 2], output_len=5, model="m")
    assert path == "/v1/completions" and body["prompt"] == [1, 2] and body["model"] == "m"
    assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    path, body = build_payload("chat", prompt="hi", output_len=5, extra={"stream_options": {"x": 1}})
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["stream_options"] == {"include_usage": True, "x": 1}


def test_bad_arguments_are_benchmark_errors() -> None:
    with pytest.raises(BenchmarkError, match="the chat API takes a text prompt"):
        build_payload("chat", prompt=[1], output_len=1)
    with pytest.raises(BenchmarkError, match="unknown api 'grpc'"):
        build_payload("grpc", prompt="hi", output_len=1)  # type: ignore[arg-type]
    with pytest.raises(BenchmarkError, match="base_url must be http:// or https://"):
        ConnectionPool("ftp://127.0.0.1:1")
    with pytest.raises(BenchmarkError, match="base_url must be http:// or https://"):
        run_bench("127.0.0.1:30000", num_requests=1, input_len=1, output_len=1, warmup=0)


def test_connection_errors_are_counted_for_the_caller_and_kept_out_of_the_report() -> None:
    broken = rec(0.0, 0.0, [], 0, ok=False, error="ConnectionResetError: reset", connection_error=True)
    answered = rec(0.0, 0.0, [], 0, ok=False, status=500, error="boom")
    r = compute_metrics([rec(0.0, 0.1, [0.1], 2), broken, answered])
    assert r.connection_errors == 1 and r.failed == 2
    assert "connection_errors" not in r.to_dict()  # docs/report-schema.md lists every field of "result"
    assert r.to_dict(include_requests=True)["requests"][1]["connection_error"] is True


def test_expected_throughput_of_an_exact_pacer() -> None:
    # 8 requests, 4 at a time: two waves of 0.02 + 49/100 s each, 400 tokens.
    assert expected_throughput(num_requests=8, concurrency=4, output_len=50, ttft_s=0.02,
                               decode_tok_s=100) == pytest.approx(400 / (2 * 0.51))
