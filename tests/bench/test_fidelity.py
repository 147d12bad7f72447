"""Fidelity on the simulator: the client's figures are the server's own account of the same requests.

The simulator writes its own timestamps of every request (the ``request_trace`` knob: arrival, each chunk), on
the client's clock. A loaded machine delays the simulator behind its pacing as much as it delays the client, so
the figures are judged against what the server did (the duration that gives tok/s holds the server's span and
is within 10 % of it, TTFT is no earlier than the server's and within 15 ms of it, each plus twice the worst lag
the client's own self-check measured in that run, which its timestamps carry by design; ITL within 3 ms of the
server's), never against the knobs' pace; that no chunk left before its pacing said
is checked beside it (a deadline is never early), and the client's agreement at speed is measured in
benchmarks/client_ceiling.py. Every connection a run uses is opened by its warmup, so that the server's
connection set-up, which its trace cannot see, is not in the measured requests.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_sglang.bench import BenchResult, drive, expected_throughput, run_bench
from pytest_sglang.bench.client import Client
from pytest_sglang.errors import BenchmarkError, BenchmarkFailedError, ServerRequestError
from pytest_sglang.sim.engine import Pacing
from pytest_sglang.sim.trace import read_trace

from .simproc import SimServer, run_sim

DECODE_TOK_S = 100.0
TTFT_MS = 30.0


@dataclass
class Traced:
    server: SimServer
    trace: Path

    def served(self, result: BenchResult) -> list[dict[str, Any]]:
        """The trace lines of ``result``'s measured requests: those that arrived once its first one was sent (its
        warmup and earlier runs arrived before). A line is written once its answer is, maybe after the client
        read the answer's end: waited for."""
        first = min(r.start for r in result.requests)
        deadline = time.monotonic() + 10
        while True:
            lines = [line for line in read_trace(self.trace) if line["arrived"] >= first]
            if len(lines) >= len(result.requests) or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)


def server_span(lines: list[dict[str, Any]]) -> float:
    """Seconds from the server's first arrival to its last chunk."""
    return max(line["chunks"][-1] for line in lines) - min(line["arrived"] for line in lines)


def server_throughput(lines: list[dict[str, Any]]) -> float:
    """Output tok/s by the server's own clock: its tokens over first arrival to last chunk."""
    return sum(line["tokens"] for line in lines) / server_span(lines)


def assert_duration_is_the_servers(result: BenchResult, lines: list[dict[str, Any]], figures: str) -> None:
    """The client's duration holds the server's span (every request's clock starts before it arrives and stops
    after its last chunk left), and is within 10 % of it plus twice the client's own worst measured lag (the
    first request's send and the last answer's read; output tok/s is tokens over this duration)."""
    span, lag = server_span(lines), (result.client_loop_lag_max_ms or 0.0) / 1000
    assert span - 1e-6 <= result.duration <= span * 1.10 + 2 * lag, f"{figures}\nserver span {span:.3f} s, " \
        f"client lag max {lag * 1000:.1f} ms"


def server_median_ttft_ms(lines: list[dict[str, Any]]) -> float:
    return statistics.median(line["chunks"][0] - line["arrived"] for line in lines) * 1000


def server_median_itl_ms(lines: list[dict[str, Any]]) -> float:
    gaps = [b - a for line in lines for a, b in zip(line["chunks"], line["chunks"][1:], strict=False)]
    return statistics.median(gaps) * 1000


def never_early(lines: list[dict[str, Any]], pacing: Pacing) -> bool:
    """Each chunk left no earlier than its pacing's offset from the request's start (a deadline is never early)."""
    return all(at - line["handled"] >= offset - 1e-6 for line in lines
               for at, (offset, _lo, _hi) in zip(line["chunks"], pacing.chunks(line["tokens"]), strict=True))


def assert_ttft_is_the_servers(result: BenchResult, lines: list[dict[str, Any]], figures: str) -> None:
    """No earlier than the server's own first chunk (each request's clock starts before it arrives, the first
    token is seen after it left), and within 15 ms plus twice the client's own worst measured lag of it (the
    send and the read of the first chunk)."""
    server = server_median_ttft_ms(lines)
    lag = result.client_loop_lag_max_ms or 0.0
    assert server - 0.001 <= result.median_ttft_ms <= server + 15 + 2 * lag, f"{figures}\nclient lag max {lag:.1f} ms"


def traced_sim(tmp: Path, knobs: dict[str, Any], *args: str) -> Any:
    return run_sim(tmp, {**knobs, "request_trace": str(tmp / "trace.jsonl")}, *args)


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    tmp = tmp_path_factory.mktemp("sim")
    with traced_sim(tmp, {"decode_tok_s": DECODE_TOK_S, "ttft_ms": TTFT_MS, "max_batch": 64}) as server:
        yield Traced(server, tmp / "trace.jsonl")


@pytest.fixture
def sim(traced: Traced) -> SimServer:
    return traced.server


@pytest.mark.parametrize("api", ["completions", "generate", "chat"])
def test_measured_matches_pacing(traced: Traced, api: str) -> None:
    n, c, out = 16, 8, 100
    r = run_bench(traced.server, api=api, num_requests=n, concurrency=c, input_len=64, output_len=out, warmup=c)  # type: ignore[arg-type]
    lines = traced.served(r)
    assert r.completed == n and r.failed == 0
    assert r.total_output_tokens == n * out
    assert len(lines) == n and all(line["tokens"] == out and len(line["chunks"]) == out for line in lines), lines
    assert never_early(lines, Pacing(DECODE_TOK_S, TTFT_MS / 1000)), "a chunk left before its pacing said"
    paced = expected_throughput(num_requests=n, concurrency=c, output_len=out, ttft_s=TTFT_MS / 1000,
                                decode_tok_s=DECODE_TOK_S)
    server = server_throughput(lines)
    assert server <= paced * 1.01, "the server ran ahead of its pacing"
    figures = f"{r.summary()}\nthe server's own: {server:.1f} tok/s, TTFT {server_median_ttft_ms(lines):.1f} ms, " \
              f"ITL {server_median_itl_ms(lines):.2f} ms"
    assert_duration_is_the_servers(r, lines, figures)
    assert_ttft_is_the_servers(r, lines, figures)
    assert r.median_itl_ms == pytest.approx(server_median_itl_ms(lines), abs=3), figures
    assert r.median_tpot_ms == pytest.approx(server_median_itl_ms(lines), abs=3), figures
    assert r.chunk_count_mismatches == 0 and r.server_token_counts_missing == 0
    assert r.accept_length is None
    if api != "chat":
        assert r.total_input_tokens == n * 64 and r.prompt_kind == "token_ids"


class _SleepsRecorded:
    """The runner's asyncio with its sleeps recorded: (seconds asked, perf_counter when the sleep ended)."""

    def __init__(self) -> None:
        self.slept: list[tuple[float, float]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.slept.append((seconds, time.perf_counter()))


def test_poisson_rate_is_honoured(traced: Traced, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = _SleepsRecorded()
    monkeypatch.setattr(drive, "asyncio", recorded)  # the event loop side of the runner (bench/drive.py)
    r = run_bench(traced.server, num_requests=24, request_rate=40.0, input_len=8, output_len=5, warmup=8, seed=3)
    # the arrivals are the seed's Poisson process at 40/s, and no request left before its arrival: the gaps the
    # runner slept are the process's, each request's clock started once its gap had passed (a loaded runner
    # sends later, never earlier)
    arrivals = random.Random(3 + 1)
    assert [seconds for seconds, _ in recorded.slept] == [arrivals.expovariate(40.0) for _ in range(23)]
    assert all(req.start >= ended for req, (_, ended) in zip(r.requests[1:], recorded.slept, strict=True))
    assert r.duration >= sum(seconds for seconds, _ in recorded.slept)
    assert r.request_throughput == pytest.approx(24 / r.duration)
    lines = traced.served(r)
    assert len(lines) == 24
    assert_ttft_is_the_servers(r, lines, r.summary())


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
    knobs = {"decode_tok_s": 100.0, "ttft_ms": 20.0, "accept_length": 3.0}
    traced = tmp_path / "trace.jsonl"
    with traced_sim(tmp_path, knobs, "--speculative-algorithm", "EAGLE3") as server:
        for api in ("completions", "generate"):
            r = run_bench(server, api=api, num_requests=8, concurrency=8, input_len=16, output_len=60,  # type: ignore[arg-type]
                          warmup=8)
            lines = Traced(server, traced).served(r)
            assert r.total_output_tokens == 8 * 60, api
            assert r.accept_length == pytest.approx(3.0, rel=0.1), api
            # 20 events of 3 tokens each carry 60 tokens: counted by the server's usage, no mismatch
            assert r.chunk_count_mismatches == 0, api
            assert len(lines) == 8 and all(len(line["chunks"]) == 20 for line in lines), api
            assert never_early(lines, Pacing(100.0, 0.02, accept_length=3.0)), "a chunk left before its pacing said"
            assert_duration_is_the_servers(r, lines, f"{api}: {r.summary()}\nthe server's own: "
                                                     f"{server_throughput(lines):.1f} tok/s")


def test_several_tokens_an_event_without_speculative_decoding_are_no_mismatch(tmp_path: Path) -> None:
    """SGLang's --stream-interval 4 (one of the ways it puts several tokens in an event without speculative
    decoding, issue 26 point 2): 13 tokens come as 1 + 4 + 4 + 4; the server's count is the truth."""
    with traced_sim(tmp_path, {"decode_tok_s": 200.0, "ttft_ms": 10.0}, "--stream-interval", "4") as server:
        for api in ("completions", "chat", "generate"):
            r = run_bench(server, api=api, num_requests=4, concurrency=4, input_len=8, output_len=13,  # type: ignore[arg-type]
                          warmup=1)
            assert r.completed == 4 and r.total_output_tokens == 4 * 13, api
            assert all(one.chunks == 4 for one in r.requests), (api, [one.chunks for one in r.requests])
            assert r.chunk_count_mismatches == 0 and r.server_token_counts_missing == 0, api
            assert r.accept_length is None, api


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
