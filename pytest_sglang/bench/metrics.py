"""The figures, with sglang.bench_serving's definitions and names; pure functions of the measured requests.

* ``duration``: from the first request sent to the last response done, warmup requests excluded;
* ``output_throughput = total_output_tokens / duration``, likewise ``input_throughput``,
  ``request_throughput`` and ``total_throughput``;
* output tokens are the server's count (``usage.completion_tokens`` with ``stream_options.include_usage``,
  ``meta_info.completion_tokens`` natively); only where the server gives none is the chunk count used
  (``server_token_counts_missing`` says how often). ``chunk_count_mismatches`` counts requests with more
  output-bearing stream events than the server's token count: every such event carries at least one new
  token, so a server that counted right never shows one, speculative or not. Fewer events than tokens is
  normal and not counted: one event carries several tokens under speculative decoding, and without it too.
  SGLang yields one event per wake-up of the request's coroutine with every token produced since
  (tokenizer_manager's ``_wait_one_response`` takes the last of the queued outputs, or joins them under
  ``--incremental-streaming-output``), so a loaded server coalesces; its detokenizer holds back a token's text
  that ends in a partial UTF-8 character until the next token completes it; ``--stream-interval N`` sends
  every N tokens; and a token that decodes to no text (a special token) streams an empty event, which carries
  no output;
* TTFT: request sent to the first event that carries output; ITL: the gaps between such events; TPOT:
  ``(e2e - ttft) / (output_tokens - 1)``; e2e latency: request sent to the stream's end. Each with mean,
  median, std, p90 and p99 in ms (percentiles interpolate linearly, like numpy's default);
* ``accept_length``: native ``completion_tokens / spec_verify_ct`` here; the runner prefers the server's
  ``/server_info`` figure where it has one.

Failed requests never hide: ``failed`` and ``first_failure`` say what happened, and ``connection_errors``
how many requests got no complete HTTP answer (the caller decides whether the server died).

Rounds (``run_bench(..., rounds=N)``): :func:`combine_rounds` makes the headline result of N rounds: every
figure of :data:`ROUND_METRICS` is the median of the rounds' figures, the counts are the median round's
(``completed``, token totals), while the honesty counters (``failed``, ``connection_errors``,
``chunk_count_mismatches``, ``server_token_counts_missing``) add up over every round, so a failure in any
round shows. ``spread`` holds a :class:`Spread` (n, median, mean, stdev, CV, min, max) per figure, and
``rounds`` the per-round results.

Goodput (``slo={"ttft_ms": 200, "tpot_ms": 50, "e2el_ms": ...}``), as ``vllm bench serve --goodput`` defines
it: the completed requests that meet every given limit (``<=``), per second of ``duration``; TPOT is 0 for a
request of one output token. ``slo_attainment`` is their share of all measured requests.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from pytest_sglang.bench.members import MemberLoad
from pytest_sglang.bench.payloads import API_PATHS
from pytest_sglang.bench.slo import meets_slo
from pytest_sglang.bench.stream import StreamResult

# Fields of BenchResult left out of to_dict(): the requests (on demand), what only the caller acts on, and the
# rounds and spread (written in their own shape) (docs/report-schema.md lists every field of a report's "result").
_NOT_REPORTED = frozenset({"requests", "connection_errors", "rounds", "spread", "telemetry", "members"})

# The figures of the GPU and server telemetry (telemetry.py): None where unmeasured, and the field that says why.
GPU_FIGURES = ("gpu_energy_j", "energy_per_output_token_j", "output_tokens_per_joule", "gpu_util_mean_pct",
               "gpu_memory_peak_mib", "gpu_power_mean_w", "gpu_sm_clock_mean_mhz")
SERVER_FIGURES = ("server_queue_mean", "server_kv_usage_peak")
_UNMEASURED_BY = {**{m: "gpu_unmeasured" for m in GPU_FIGURES}, **{m: "server_unmeasured" for m in SERVER_FIGURES}}
# The figures that are medians over rounds and have a spread: rates and latencies, not counts.
ROUND_METRICS: tuple[str, ...] = (
    "duration", "request_throughput", "input_throughput", "output_throughput", "total_throughput", "concurrency",
    *(f"{stat}_{key}_ms" for key in ("ttft", "itl", "tpot", "e2e_latency")
      for stat in ("mean", "median", "std", "p90", "p99")),
    "max_itl_ms", "accept_length", "goodput", "slo_attainment", "client_busy",
    "server_median_ttft_ms", "server_median_itl_ms", "server_accept_length", "server_cache_hit_rate",
    "client_loop_lag_p90_ms",
    "client_loop_lag_max_ms", *GPU_FIGURES, *SERVER_FIGURES,
)
# Counters that add up over rounds (a failure in any round shows in the headline).
_SUMMED = ("failed", "connection_errors", "chunk_count_mismatches", "server_token_counts_missing")
# vllm bench serve --goodput's keys, in ms, and our names for them.


@dataclass
class RequestRecord:
    """One measured request (warmup excluded). Times in seconds."""

    ok: bool
    start: float
    latency: float
    ttft: float | None
    itls: list[float]
    input_tokens: int
    output_tokens: int
    chunks: int
    server_counted: bool
    status: int | None = None
    error: str | None = None
    connection_error: bool = False
    spec_verify_ct: int | None = None


@dataclass(frozen=True)
class Spread:
    """How much one figure moved over the rounds. ``cv_pct`` is the sample standard deviation over the mean in
    percent (None with one round, or a mean of 0)."""

    n: int
    median: float
    mean: float
    stdev: float
    cv_pct: float | None
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("a spread needs at least one value")
        data = [float(v) for v in values]
        mean = statistics.fmean(data)
        stdev = statistics.stdev(data) if len(data) > 1 else 0.0
        cv = stdev / abs(mean) * 100.0 if len(data) > 1 and mean else None
        return cls(len(data), statistics.median(data), mean, stdev, cv, min(data), max(data))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchResult:
    """Figures of one benchmark run, named as sglang.bench_serving names them."""

    # what was run
    api: str = "completions"
    num_requests: int = 0
    max_concurrency: int | None = None
    request_rate: float = math.inf
    input_len: int = 0
    output_len: int = 0
    warmup: int = 0
    seed: int = 0
    prompt_kind: str = "token_ids"  # "token_ids", "tokenizer_text" or "approx_text"
    prompt_vocab: str | None = None  # where the prompt ids' vocabulary came from (bench/vocab.py)
    profile: str | None = None
    started_at: str = ""
    # counts
    completed: int = 0
    failed: int = 0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    duration: float = 0.0
    # throughput
    request_throughput: float = 0.0
    input_throughput: float = 0.0
    output_throughput: float = 0.0
    total_throughput: float = 0.0
    concurrency: float = 0.0  # achieved: sum of e2e latencies / duration
    # latency (ms)
    mean_ttft_ms: float = 0.0
    median_ttft_ms: float = 0.0
    std_ttft_ms: float = 0.0
    p90_ttft_ms: float = 0.0
    p99_ttft_ms: float = 0.0
    mean_itl_ms: float = 0.0
    median_itl_ms: float = 0.0
    std_itl_ms: float = 0.0
    p90_itl_ms: float = 0.0
    p99_itl_ms: float = 0.0
    max_itl_ms: float = 0.0
    mean_tpot_ms: float = 0.0
    median_tpot_ms: float = 0.0
    std_tpot_ms: float = 0.0
    p90_tpot_ms: float = 0.0
    p99_tpot_ms: float = 0.0
    mean_e2e_latency_ms: float = 0.0
    median_e2e_latency_ms: float = 0.0
    std_e2e_latency_ms: float = 0.0
    p90_e2e_latency_ms: float = 0.0
    p99_e2e_latency_ms: float = 0.0
    # speculative decoding: accept_length from the measured requests' verify counts ("requests"), else the
    # server's /metrics counters over the rounds ("server_metrics"), else /server_info ("server_info": stale)
    accept_length: float | None = None
    accept_length_source: str | None = None
    # the server's own account of the run (its /metrics scraped around each round; bench/server_metrics.py):
    # None where the server has no metrics
    server_metrics: str | None = None  # "sglang" or "vllm": whose metric names were read
    server_generation_tokens: int | None = None
    server_prompt_tokens: int | None = None
    server_median_ttft_ms: float | None = None  # from its histogram (interpolated inside a bucket)
    server_median_itl_ms: float | None = None
    server_accept_length: float | None = None
    server_disagreement: str | None = None  # why its token counts differ from the responses' (fails the run)
    # the server's prefix cache (bench/cache.py): how the rounds met it ("fresh": new prompts every round; "flush":
    # flushed before each round; "warm": the same prompts, cached on purpose), the prompt tokens the server served
    # from it and their share of the prompt tokens (its /metrics; None where it does not say), and the flag of a
    # round that the mode says is uncached but that was mostly served from the cache
    cache: str = "fresh"
    server_cached_tokens: int | None = None
    server_cache_hit_rate: float | None = None
    cache_note: str | None = None
    # goodput under SLOs (vllm bench serve --goodput): None unless run with slo={...}
    slo: dict[str, float] | None = None  # {"ttft_ms": 200, "tpot_ms": 50, "e2el_ms": ...}, any subset
    goodput: float | None = None  # completed requests meeting every limit, per second of duration
    slo_attainment: float | None = None  # their share of the measured requests (0..1)
    # the load generator itself: CPU seconds of its event-loop thread, and that over the wall time (0..1); a
    # client busy most of the run measures itself, not the server (client_bound)
    client_cpu_seconds: float | None = None
    client_busy: float | None = None
    client_processes: int = 1  # processes that sent the load (spread.py; the busiest one's CPU and busy above)
    client_bound: bool = False
    client_bound_reason: str | None = None  # why client_bound (bench/selfcheck.py): busy, or a lagging loop
    client_loop_lag_p90_ms: float | None = None  # how late the event loop woke (p90 and max over the round)
    client_loop_lag_max_ms: float | None = None
    # what the server's GPUs and gauges did over the measured duration (telemetry.py): energy of its GPUs (power
    # summed over them, integrated), per output token and its inverse, their mean utilisation, power and SM
    # clock, the most memory one of them held; the server's mean queue and peak KV-cache usage (0..1). None
    # where there is no GPU to ask or no /metrics: gpu_unmeasured and server_unmeasured say why
    gpu_energy_j: float | None = None
    energy_per_output_token_j: float | None = None
    output_tokens_per_joule: float | None = None
    gpu_util_mean_pct: float | None = None
    gpu_memory_peak_mib: float | None = None
    gpu_power_mean_w: float | None = None
    gpu_sm_clock_mean_mhz: float | None = None
    server_queue_mean: float | None = None
    server_kv_usage_peak: float | None = None
    gpu_unmeasured: str | None = None
    server_unmeasured: str | None = None
    # how gpu_energy_j was found: "counter" (the GPUs' own energy counters), "power_integral" (their power
    # integrated), "mixed" (rounds differed; each round's own in rounds); None where unmeasured
    gpu_energy_source: str | None = None
    # rounds: 1 unless run_bench(rounds=N); the per-round results and each figure's spread over them
    num_rounds: int = 1
    sweep: dict[str, Any] | None = None  # {"param": "concurrency", "value": 4} for a point of a sweep
    # honesty
    first_failure: dict[str, Any] | None = None  # {"index", "status", "error"} of the first failed request
    chunk_count_mismatches: int = 0
    server_token_counts_missing: int = 0
    # requests, warmup included, that could not connect or whose connection broke before the answer ended:
    # the caller asks its server handle whether the server died (not part of to_dict)
    connection_errors: int = 0
    requests: list[RequestRecord] = field(default_factory=list, repr=False)
    rounds: list[BenchResult] = field(default_factory=list, repr=False)
    spread: dict[str, Spread] = field(default_factory=dict, repr=False)
    telemetry: dict[str, Any] | None = field(default=None, repr=False)  # the time series (the report's own key)
    # a fleet's: what each server member served over the rounds, from its own /metrics (bench/members.py)
    members: dict[str, MemberLoad] = field(default_factory=dict, repr=False)

    def to_dict(self, *, include_requests: bool = False) -> dict[str, Any]:
        """JSON-ready figures (``request_rate`` inf becomes the string "inf"), as docs/report-schema.md lists
        them; ``include_requests`` adds every measured request."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in _NOT_REPORTED:
                continue
            value = getattr(self, f.name)
            if isinstance(value, float) and math.isinf(value):
                value = "inf"
            out[f.name] = value
        out["spread"] = {m: sp.to_dict() for m, sp in self.spread.items()}
        if self.members:
            out["members"] = {name: load.to_dict() for name, load in self.members.items()}
        if len(self.rounds) > 1:
            out["rounds"] = [{k: v for k, v in r.to_dict().items() if k not in ("spread", "sweep")}
                             for r in self.rounds]
        if include_requests:
            out["requests"] = [asdict(r) for r in self.requests]
        return out

    def samples(self, metric: str) -> list[float]:
        """The per-round values of ``metric`` (one value without rounds; [] where it has none)."""
        source = self.rounds or [self]
        values = [getattr(r, metric, None) for r in source]
        if any(v is None for v in values):
            value = getattr(self, metric, None)
            return [] if value is None else [float(value)]
        return [float(v) for v in values]  # type: ignore[arg-type]

    def unmeasured(self, metric: str) -> str | None:
        """Why ``metric`` is None on this result where it is a telemetry figure that was not measured."""
        owner = _UNMEASURED_BY.get(metric)
        if owner is None or getattr(self, metric) is not None:
            return None
        return getattr(self, owner) or "it was not measured"

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.completed > 0

    @property
    def attempted(self) -> int:
        """Measured requests sent, over every round (``completed`` is the median round's count)."""
        return sum(r.completed + r.failed for r in self.rounds) if self.rounds else self.completed + self.failed

    def summary(self) -> str:
        """The figures as ``python -m sglang.bench_serving`` prints them."""

        def row(label: str, value: Any) -> str:
            if isinstance(value, float):
                value = f"{value:.2f}"
            return f"{label:<40}{value!s:<10}"

        lines = [f"{' Serving Benchmark Result ':=^50}"]
        lines += [
            row("Backend:", f"{self.api} ({API_PATHS.get(self.api, '?')})"),
            row("Traffic request rate:", self.request_rate),
            row("Max request concurrency:", self.max_concurrency or "not set"),
            row("Successful requests:", self.completed),
            row("Failed requests:", self.failed),
            row("Benchmark duration (s):", self.duration),
            row("Total input tokens:", self.total_input_tokens),
            row("Total generated tokens:", self.total_output_tokens),
            row("Request throughput (req/s):", self.request_throughput),
            row("Input token throughput (tok/s):", self.input_throughput),
            row("Output token throughput (tok/s):", self.output_throughput),
            row("Total token throughput (tok/s):", self.total_throughput),
            row("Concurrency:", self.concurrency),
        ]
        if self.accept_length is not None:
            lines.append(row("Accept length:", self.accept_length))
        if self.goodput is not None:
            lines.append(row("Request goodput (req/s):", self.goodput))
        if self.server_cache_hit_rate is not None:
            lines.append(row(f"Prefix cache hits ({self.cache}):", f"{self.server_cache_hit_rate:.1%}"))
        if self.num_rounds > 1:
            sp = self.spread.get("output_throughput")
            cv = f", CV {sp.cv_pct:.1f}%" if sp and sp.cv_pct is not None else ""
            lines.append(row("Rounds (figures: medians):", f"{self.num_rounds}{cv}"))
        sections = (("End-to-End Latency", "e2e_latency"), ("Time to First Token", "ttft"),
                    ("Time per Output Token (excl. 1st token)", "tpot"), ("Inter-Token Latency", "itl"))
        for title, key in sections:
            lines.append(f"{title:-^50}")
            for stat in ("mean", "median", "p90", "p99"):
                lines.append(row(f"{stat.capitalize() if stat[0] != 'p' else stat.upper()} "
                                 f"{key.upper().replace('_LATENCY', '')} (ms):",
                                 getattr(self, f"{stat}_{key}_ms")))
        if self.failed:
            lines.append(f"{' FAILURES ':-^50}")
            lines.append(failure_text(self))
        lines.append("=" * 50)
        return "\n".join(lines)


def failure_text(result: BenchResult) -> str:
    ff = result.first_failure or {}
    status = f"HTTP {ff['status']}" if ff.get("status") else "no HTTP status"
    where = f"round {ff['round']}, " if "round" in ff else ""
    return (f"{result.failed} of {result.attempted} requests failed; the first "
            f"({where}request {ff.get('index')}, {status}): {ff.get('error')}")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, numpy's default (``numpy.percentile(values, q)``)."""
    if not values:
        return 0.0
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _stats(values_s: Sequence[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    if not ms:
        return {"mean": 0.0, "median": 0.0, "std": 0.0, "p90": 0.0, "p99": 0.0}
    return {
        "mean": statistics.fmean(ms),
        "median": percentile(ms, 50),
        "std": statistics.pstdev(ms),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
    }


def record_from_stream(s: StreamResult, prompt_tokens: int) -> RequestRecord:
    """Turn what the client saw into a measured request: the server's token counts win over chunk counts."""
    chunks = len(s.chunk_times)
    server_counted = s.completion_tokens is not None
    output_tokens = s.completion_tokens if s.completion_tokens is not None else (
        sum(s.chunk_tokens) if s.chunk_tokens else chunks)
    itls = [b - a for a, b in zip(s.chunk_times, s.chunk_times[1:], strict=False)]
    return RequestRecord(
        ok=s.ok, start=s.start, latency=s.latency, ttft=s.ttft, itls=itls,
        input_tokens=s.prompt_tokens if s.prompt_tokens is not None else prompt_tokens,
        output_tokens=output_tokens if s.ok else 0, chunks=chunks, server_counted=server_counted,
        status=s.status, error=s.error, connection_error=s.connection_error, spec_verify_ct=s.spec_verify_ct,
    )


def compute_metrics(
    records: Sequence[RequestRecord], duration: float | None = None, **config: Any
) -> BenchResult:
    """Aggregate measured requests into a BenchResult. ``duration`` defaults to first start to last end."""
    result = BenchResult(**config)
    result.requests = list(records)
    good = [r for r in records if r.ok]
    bad = [(i, r) for i, r in enumerate(records) if not r.ok]
    result.completed, result.failed = len(good), len(bad)
    if bad:
        i, r = bad[0]
        result.first_failure = {"index": i, "status": r.status, "error": r.error}
    if duration is None:
        ends = [r.start + r.latency for r in records]
        duration = (max(ends) - min(r.start for r in records)) if records else 0.0
    result.duration = duration
    result.total_input_tokens = sum(r.input_tokens for r in good)
    result.total_output_tokens = sum(r.output_tokens for r in good)
    result.chunk_count_mismatches = sum(1 for r in good if r.server_counted and r.chunks > r.output_tokens)
    result.server_token_counts_missing = sum(1 for r in good if not r.server_counted)
    result.connection_errors = sum(1 for r in records if r.connection_error)
    if duration > 0:
        result.request_throughput = len(good) / duration
        result.input_throughput = result.total_input_tokens / duration
        result.output_throughput = result.total_output_tokens / duration
        result.total_throughput = (result.total_input_tokens + result.total_output_tokens) / duration
        result.concurrency = sum(r.latency for r in good) / duration
    ttfts = [r.ttft for r in good if r.ttft is not None]
    itls = [x for r in good for x in r.itls]
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in good
             if r.ttft is not None and r.output_tokens > 1]
    e2e = [r.latency for r in good]
    for key, values in (("ttft", ttfts), ("itl", itls), ("tpot", tpots), ("e2e_latency", e2e)):
        for stat, value in _stats(values).items():
            setattr(result, f"{stat}_{key}_ms", value)
    result.max_itl_ms = max(itls) * 1000.0 if itls else 0.0
    verify = [r for r in good if r.spec_verify_ct]
    if verify:
        verified = sum(r.spec_verify_ct or 0 for r in verify)
        result.accept_length = sum(r.output_tokens for r in verify) / verified
    if result.slo:
        met = sum(1 for r in records if meets_slo(r, result.slo))
        result.goodput = met / duration if duration > 0 else 0.0
        result.slo_attainment = met / len(records) if records else 0.0
    return result


def combine_rounds(rounds: Sequence[BenchResult]) -> BenchResult:
    """The headline result of one or more rounds of the same workload: medians of :data:`ROUND_METRICS`,
    the median round's counts, the honesty counters summed, and a :class:`Spread` per figure."""
    if not rounds:
        raise ValueError("combine_rounds needs at least one round")
    first = rounds[0]
    head = replace(first, requests=[r for rnd in rounds for r in rnd.requests], rounds=list(rounds), spread={},
                   num_rounds=len(rounds))
    for metric in ROUND_METRICS:
        values = [getattr(r, metric) for r in rounds]
        if any(v is None for v in values):
            continue
        head.spread[metric] = Spread.of(values)
        setattr(head, metric, statistics.median(values))
    by_throughput = sorted(rounds, key=lambda r: r.output_throughput)
    middle = by_throughput[(len(rounds) - 1) // 2]  # the median round (the lower one of an even count)
    for count in ("completed", "total_input_tokens", "total_output_tokens", "server_generation_tokens",
                  "server_prompt_tokens", "server_cached_tokens"):
        setattr(head, count, getattr(middle, count))
    for counter in _SUMMED:
        setattr(head, counter, sum(getattr(r, counter) for r in rounds))
    for i, rnd in enumerate(rounds):
        if rnd.first_failure is not None:
            head.first_failure = {**rnd.first_failure, "round": i} if len(rounds) > 1 else rnd.first_failure
            break
    cpu = [r.client_cpu_seconds for r in rounds if r.client_cpu_seconds is not None]
    head.client_cpu_seconds = sum(cpu) if cpu else None
    head.client_bound = any(r.client_bound for r in rounds)
    head.client_bound_reason = next((f"round {i}: {r.client_bound_reason}" if len(rounds) > 1 else
                                     r.client_bound_reason for i, r in enumerate(rounds)
                                     if r.client_bound and r.client_bound_reason), None)
    sources = {r.gpu_energy_source for r in rounds if r.gpu_energy_source is not None}
    head.gpu_energy_source = sources.pop() if len(sources) == 1 else ("mixed" if sources else None)
    notes = [r.cache_note for r in rounds if r.cache_note]
    head.cache_note = "; ".join(notes) if notes else None
    return head
