"""Load generator, with sglang.bench_serving's definitions and names. Knows nothing about pytest.

``run_bench(server, num_requests=..., concurrency=..., input_len=..., output_len=...)`` streams requests at
a server and returns a :class:`BenchResult`. One module per job:

* ``payloads``: the APIs' paths and one request's JSON body (``build_payload``), the auth header;
* ``stream``: asyncio HTTP/1.1 streaming on raw sockets (``ConnectionPool``, ``stream_request``), every SSE
  event timed as its bytes arrive;
* ``client``: the synchronous ``Client`` for the calls a test makes one at a time;
* ``prompts``: prompts of an exact token length (``make_prompts``, ``load_tokenizer``);
* ``metrics``: ``RequestRecord``, ``BenchResult``, ``compute_metrics``, ``percentile`` (the definitions);
* ``runner``: ``run_bench`` (warmup, concurrency, Poisson arrivals) and ``expected_throughput``.

Errors are :mod:`pytest_sglang.errors`' own: BenchmarkError for bad arguments, BenchmarkFailedError (with the
result) when requests failed, ServerRequestError when the client gets an error answer.
"""

from __future__ import annotations

from pytest_sglang.bench.client import Client
from pytest_sglang.bench.metrics import (
    BenchResult,
    RequestRecord,
    compute_metrics,
    failure_text,
    percentile,
    record_from_stream,
)
from pytest_sglang.bench.payloads import API_PATHS, Api, build_payload
from pytest_sglang.bench.prompts import load_tokenizer, make_prompts
from pytest_sglang.bench.runner import ServerLike, expected_throughput, run_bench
from pytest_sglang.bench.stream import StreamResult
from pytest_sglang.errors import BenchmarkError, BenchmarkFailedError, ServerRequestError

__all__ = [
    "API_PATHS",
    "Api",
    "BenchResult",
    "BenchmarkError",
    "BenchmarkFailedError",
    "Client",
    "RequestRecord",
    "ServerLike",
    "ServerRequestError",
    "StreamResult",
    "build_payload",
    "compute_metrics",
    "expected_throughput",
    "failure_text",
    "load_tokenizer",
    "make_prompts",
    "percentile",
    "record_from_stream",
    "run_bench",
]
