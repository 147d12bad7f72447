"""Fidelity on the simulator: known pacing in, the same figures out (tok/s within 10 %, TTFT within 15 ms)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_sglang.bench import expected_throughput, run_bench
from pytest_sglang.bench.client import Client
from pytest_sglang.errors import BenchmarkError, BenchmarkFailedError, ServerRequestError

from .simproc import SimServer, run_sim

DECODE_TOK_S = 100.0
TTFT_MS = 30.0


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    with run_sim(tmp_path_factory.mktemp("sim"), {"decode_tok_s": DECODE_TOK_S, "ttft_ms": TTFT_MS,
                                                   "max_batch": 64}) as server:
        yield server


@pytest.mark.parametrize("api", ["completions", "generate", "chat"])
def test_measured_matches_pacing(sim: SimServer, api: str) -> None:
    n, c, out = 16, 8, 100
    r = run_bench(sim, api=api, num_requests=n, concurrency=c, input_len=64, output_len=out, warmup=2)  # type: ignore[arg-type]
    expected = expected_throughput(num_requests=n, concurrency=c, output_len=out, ttft_s=TTFT_MS / 1000,
                                   decode_tok_s=DECODE_TOK_S)
    assert r.completed == n and r.failed == 0
    assert r.total_output_tokens == n * out
    # Bounds wide enough for a loaded 2-core CI machine (a median TTFT of 35.4 ms was seen there); the
    # measured agreement itself is in benchmarks/client_ceiling.py and RESULTS-vs-peer.md, not asserted here.
    assert r.output_throughput == pytest.approx(expected, rel=0.10), r.summary()
    assert r.median_ttft_ms == pytest.approx(TTFT_MS, abs=15), r.summary()
    assert r.median_itl_ms == pytest.approx(1000 / DECODE_TOK_S, abs=3), r.summary()
    assert r.median_tpot_ms == pytest.approx(1000 / DECODE_TOK_S, abs=3), r.summary()
    assert r.chunk_count_mismatches == 0 and r.server_token_counts_missing == 0
    assert r.accept_length is None
    if api != "chat":
        assert r.total_input_tokens == n * 64 and r.prompt_kind == "token_ids"


def test_poisson_rate_is_honoured(sim: SimServer) -> None:
    r = run_bench(sim, num_requests=24, request_rate=40.0, input_len=8, output_len=5, warmup=0, seed=3)
    # 24 arrivals at 40/s take about 0.6 s; the last request adds its own ~0.07 s.
    assert 0.3 < r.duration < 1.3
    assert r.request_throughput == pytest.approx(24 / r.duration)
    assert r.median_ttft_ms == pytest.approx(TTFT_MS, abs=15)


def test_failures_raise_and_are_reported(sim: SimServer) -> None:
    with pytest.raises(BenchmarkFailedError) as info:
        run_bench(sim, num_requests=4, concurrency=2, input_len=8, output_len=4, warmup=0,
                  extra_body={"max_tokens": "lots"})
    msg = str(info.value)
    assert "4 of 4 requests failed" in msg and "HTTP 400" in msg
    result = info.value.result
    assert result is not None and result.failed == 4 and result.first_failure
    r = run_bench(sim, num_requests=2, input_len=8, output_len=4, warmup=0, allow_failures=True,
                  extra_body={"max_tokens": "lots"})
    assert r.failed == 2 and r.output_throughput == 0 and not r.ok


def test_connection_refused_is_a_failure_not_a_hang(tmp_path: Path) -> None:
    from .simproc import free_port

    with pytest.raises(BenchmarkFailedError, match="ConnectionRefusedError|Connect") as info:
        run_bench(f"http://127.0.0.1:{free_port()}", api="generate", num_requests=2, input_len=4,
                  output_len=2, warmup=0)
    assert info.value.result is not None and info.value.result.connection_errors == 2


@dataclass
class _Handle:
    """A server handle with no liveness method at all: the runner must not reach back up into liveness."""

    base_url: str
    api_key: str | None = None
    kind: str = "sglang"
    model: str | None = "sim-model"


def test_a_server_gone_mid_run_is_counted_not_diagnosed(tmp_path: Path) -> None:
    with run_sim(tmp_path, {"decode_tok_s": 500.0, "ttft_ms": 5.0}) as server:
        handle = _Handle(server.base_url)
        assert run_bench(handle, num_requests=2, input_len=4, output_len=3, warmup=1).connection_errors == 0
    with pytest.raises(BenchmarkFailedError, match="warmup requests") as info:  # the sim is gone now
        run_bench(handle, num_requests=3, input_len=4, output_len=3, warmup=1)
    result = info.value.result
    assert result is not None and result.failed == 3 and result.connection_errors == 4  # warmup included
    assert "connection_errors" not in result.to_dict()


def test_client_error_answers_are_server_request_errors(sim: SimServer) -> None:
    client = Client(sim.base_url)
    with pytest.raises(ServerRequestError, match="answered 400") as info:
        client.completions([1, 2, 3], max_tokens="lots")  # type: ignore[arg-type]
    assert info.value.status == 400 and isinstance(info.value, BenchmarkError)
    with pytest.raises(ServerRequestError) as info:
        list(client.stream("completions", [1, 2], max_tokens="lots"))  # type: ignore[arg-type]
    assert info.value.status == 400
    with pytest.raises(ServerRequestError, match="GET .*/no/such/path answered 404") as info:
        client._json(client.get("/no/such/path"))
    assert info.value.status == 404


def test_speculative_decoding_accept_length_and_chunked_tokens(tmp_path: Path) -> None:
    knobs = {"decode_tok_s": 200.0, "ttft_ms": 20.0, "accept_length": 3.0}
    with run_sim(tmp_path, knobs, "--speculative-algorithm", "EAGLE3") as server:
        for api in ("completions", "generate"):
            r = run_bench(server, api=api, num_requests=8, concurrency=8, input_len=16, output_len=60,  # type: ignore[arg-type]
                          warmup=1)
            assert r.total_output_tokens == 8 * 60, api
            assert r.accept_length == pytest.approx(3.0, rel=0.1), api
            # 20 events of 3 tokens each carry 60 tokens: recorded, not miscounted
            assert r.chunk_count_mismatches == 8, api
            expected = expected_throughput(num_requests=8, concurrency=8, output_len=60, ttft_s=0.02,
                                           decode_tok_s=200.0)
            # the same bound as the paced test above: a loaded 2-core CI machine reads a few % low
            assert r.output_throughput == pytest.approx(expected, rel=0.10), r.summary()


def test_api_key_is_sent_and_never_shown(tmp_path: Path) -> None:
    with run_sim(tmp_path, {"decode_tok_s": 500.0, "ttft_ms": 5.0}, api_key="s3cret-key") as server:
        r = run_bench(server, num_requests=2, input_len=4, output_len=3, warmup=0)
        assert r.completed == 2
        server.api_key = None
        with pytest.raises(BenchmarkFailedError) as info:
            run_bench(server, num_requests=1, input_len=4, output_len=3, warmup=0)
        assert "401" in str(info.value)
        client = Client(server.base_url, api_key="s3cret-key")
        assert "s3cret" not in repr(client)
        assert client.completions([1, 2, 3], max_tokens=2)["usage"]["completion_tokens"] == 2
