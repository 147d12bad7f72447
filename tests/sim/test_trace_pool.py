"""The request_trace knob (the simulator's own timestamps of each streamed request, on the client's clock) and
the handler threads that serve a burst of connections (pool.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from simtools import Sim, sse_events

from pytest_sglang.bench import run_bench
from pytest_sglang.sim.trace import read_trace

Launch = Callable[..., Sim]
DECODE_TOK_S = 200.0
TTFT_MS = 20.0


def test_trace_lines_follow_each_request_on_the_clients_clock(launch: Launch, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    sim = launch({"startup_seconds": 0.2, "decode_tok_s": DECODE_TOK_S, "ttft_ms": TTFT_MS,
                  "request_trace": str(trace)})
    sim.wait_ready()
    session = requests.Session()
    sent = []
    for body, path in (({"prompt": [5, 6, 7], "max_tokens": 6, "stream": True, "model": "m"}, "/v1/completions"),
                       ({"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 4}, "stream": True},
                        "/generate")):
        start = time.monotonic()
        with session.post(f"http://127.0.0.1:{sim.port}{path}", json=body, stream=True, timeout=10) as resp:
            events = sse_events(resp)
        sent.append((path, start, events[0][0], time.monotonic()))
    deadline = time.monotonic() + 5
    while len(lines := read_trace(trace)) < len(sent) and time.monotonic() < deadline:
        time.sleep(0.02)  # a line is written once the answer is, so the client may read it first
    assert [line["path"] for line in lines] == [p for p, *_ in sent]  # the sim's own warmup is left out
    read_at = time.monotonic()
    for line, (_path, start, first_seen, end) in zip(lines, sent, strict=True):
        assert start <= line["arrived"] <= line["handled"] <= line["chunks"][0] <= first_seen
        assert line["chunks"][-1] <= end  # the last chunk was produced before the client had the answer's end
        assert line["chunks"][-1] <= line["written"] <= read_at  # stamped after the last write: maybe after `end`
        assert line["chunks"][0] - line["handled"] >= TTFT_MS / 1000 - 0.002
        assert line["chunks"] == sorted(line["chunks"])
    assert [line["tokens"] for line in lines] == [6, 4]
    assert len(lines[0]["chunks"]) == 6 and len(lines[1]["chunks"]) == 4
    assert lines[0]["accepted"] is not None and lines[1]["accepted"] is None  # one keep-alive connection


@pytest.mark.parametrize(("value", "says"), [(7, "request_trace must be a file path"),
                                             ("/nonexistent-dir/trace.jsonl", "request_trace: cannot write")])
def test_bad_trace_path_is_reported(launch: Launch, value: object, says: str) -> None:
    sim = launch({"startup_seconds": 0.2, "request_trace": value})
    assert sim.proc.wait(10) == 2
    assert says in sim.text(), sim.text()
    assert json.dumps(value) in sim.text() or repr(value) in sim.text()


def test_a_burst_beyond_the_started_handler_threads_is_served(launch: Launch) -> None:
    # max_batch 2: two handler threads start with the server; 24 connections at once need the spawner's.
    sim = launch({"startup_seconds": 0.2, "decode_tok_s": 500.0, "max_batch": 2})
    sim.wait_ready()
    result = run_bench(f"http://127.0.0.1:{sim.port}", num_requests=24, concurrency=24, input_len=4, output_len=3,
                       warmup=0, telemetry=False)
    assert result.completed == 24 and result.failed == 0, result.summary()
