"""Load generator, with sglang.bench_serving's definitions and names. Knows nothing about pytest.

``run_bench(server, num_requests=..., concurrency=..., input_len=..., output_len=...)`` streams requests at
a server and returns a :class:`BenchResult`. One module per job:

* ``payloads``: the APIs' paths and one request's JSON body (``build_payload``), the auth header;
* ``stream``: asyncio HTTP/1.1 streaming on raw sockets (``ConnectionPool``, ``stream_request``), every SSE
  event timed as its bytes arrive;
* ``client``: the synchronous ``Client`` for the calls a test makes one at a time;
* ``prompts``: prompts of an exact token length (``make_prompts``, ``load_tokenizer``);
* ``result``: ``BenchResult``, the frozen record of a run, and its typed parts (``ClientHealth``,
  ``ServerWitness``, ``GpuTelemetry``, ``Speculative``), ``RequestRecord`` and ``Spread``; ``summary``: its
  sglang.bench_serving printout; ``metric_table``: every metric a check may name, its direction, unit and part;
* ``metrics``: ``compute_metrics``, ``percentile`` (the definitions) and ``combine_rounds`` (rounds: medians and
  spread), each making a result once;
* ``answers``: the shapes of what ``/generate`` and the OpenAI APIs answer, read in one place;
* ``vocab``: which token ids the model has, learned before any id is sent;
* ``selfcheck``: is the client the bottleneck of this round; ``server_metrics``: the server's /metrics as a witness;
* ``outputs``: greedy outputs of a fixed prompt set, compared across profiles;
* ``slo``: ``meets_slo`` and ``check_slo``: per-request limits, for goodput;
* ``runner``: ``run_bench`` (warmup, rounds, concurrency, Poisson arrivals) and ``expected_throughput``;
  ``drive``: the event loop's side of it (the warmup and each round's requests);
* ``telemetry``: the server's GPUs (NVML or nvidia-smi, here or on its ssh host) and its /metrics gauges
  sampled during each round, and the figures drawn from them (energy per output token, utilisation, queue,
  KV-cache usage; ``energy``: the GPU figures' arithmetic);
* ``spread``: the rounds over several processes, one event loop each, for a server faster than one loop;
* ``sweep``: ``sweep`` (one result per concurrency or request rate: the curve, its knee) and ``search_slo``
  (the highest concurrency or rate that meets an SLO).

Errors are :mod:`pytest_sglang.errors`' own: BenchmarkError for bad arguments, BenchmarkFailedError (with the
result) when requests failed, ServerRequestError when the client gets an error answer.
"""

from __future__ import annotations

from pytest_sglang.bench.client import Client
from pytest_sglang.bench.metrics import (
    ROUND_METRICS,
    BenchResult,
    RequestRecord,
    Spread,
    combine_rounds,
    compute_metrics,
    failure_text,
    percentile,
    record_from_stream,
)
from pytest_sglang.bench.payloads import API_PATHS, Api, build_payload
from pytest_sglang.bench.prompts import load_tokenizer, make_prompts
from pytest_sglang.bench.runner import ServerLike, expected_throughput, run_bench
from pytest_sglang.bench.slo import meets_slo
from pytest_sglang.bench.stream import StreamResult
from pytest_sglang.bench.sweep import BenchFixture, SloSearch, Sweep, knee_index, search_slo, sweep
from pytest_sglang.errors import BenchmarkError, BenchmarkFailedError, ServerRequestError

__all__ = [
    "API_PATHS",
    "ROUND_METRICS",
    "Api",
    "BenchFixture",
    "BenchResult",
    "BenchmarkError",
    "BenchmarkFailedError",
    "Client",
    "RequestRecord",
    "ServerLike",
    "ServerRequestError",
    "SloSearch",
    "Spread",
    "StreamResult",
    "Sweep",
    "build_payload",
    "combine_rounds",
    "compute_metrics",
    "expected_throughput",
    "failure_text",
    "knee_index",
    "load_tokenizer",
    "make_prompts",
    "meets_slo",
    "percentile",
    "record_from_stream",
    "run_bench",
    "search_slo",
    "sweep",
]
