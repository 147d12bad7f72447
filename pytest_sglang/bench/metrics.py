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
from typing import Any

from pytest_sglang.bench.result import BenchResult, RequestRecord, Spread, failure_text
from pytest_sglang.bench.slo import meets_slo
from pytest_sglang.bench.stream import StreamResult

__all__ = ["GPU_FIGURES", "ROUND_METRICS", "SERVER_FIGURES", "BenchResult", "RequestRecord", "Spread",
           "combine_rounds", "compute_metrics", "failure_text", "percentile", "record_from_stream"]

# The figures of the GPU and server telemetry (telemetry.py): None where unmeasured.
GPU_FIGURES = ("gpu_energy_j", "energy_per_output_token_j", "output_tokens_per_joule", "gpu_util_mean_pct",
               "gpu_memory_peak_mib", "gpu_power_mean_w", "gpu_sm_clock_mean_mhz")
SERVER_FIGURES = ("server_queue_mean", "server_kv_usage_peak")
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
# Counts the headline takes from its median round.
_MEDIAN_ROUND = ("completed", "total_input_tokens", "total_output_tokens", "server_generation_tokens",
                 "server_prompt_tokens", "server_cached_tokens")


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


def _rates(good: Sequence[RequestRecord], duration: float, inp: int, out: int) -> dict[str, float]:
    if duration <= 0:
        return {}
    return {"request_throughput": len(good) / duration, "input_throughput": inp / duration,
            "output_throughput": out / duration, "total_throughput": (inp + out) / duration,
            "concurrency": sum(r.latency for r in good) / duration}


def _latencies(good: Sequence[RequestRecord]) -> dict[str, float]:
    ttfts = [r.ttft for r in good if r.ttft is not None]
    itls = [x for r in good for x in r.itls]
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in good
             if r.ttft is not None and r.output_tokens > 1]
    e2e = [r.latency for r in good]
    out = {f"{stat}_{key}_ms": value
           for key, values in (("ttft", ttfts), ("itl", itls), ("tpot", tpots), ("e2e_latency", e2e))
           for stat, value in _stats(values).items()}
    out["max_itl_ms"] = max(itls) * 1000.0 if itls else 0.0
    return out


def _speculative_and_goodput(records: Sequence[RequestRecord], good: Sequence[RequestRecord], duration: float,
                             slo: dict[str, float] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    verify = [r for r in good if r.spec_verify_ct]
    if verify:
        out["accept_length"] = sum(r.output_tokens for r in verify) / sum(r.spec_verify_ct or 0 for r in verify)
    if slo:
        met = sum(1 for r in records if meets_slo(r, slo))
        out["goodput"] = met / duration if duration > 0 else 0.0
        out["slo_attainment"] = met / len(records) if records else 0.0
    return out


def compute_metrics(
    records: Sequence[RequestRecord], duration: float | None = None, **config: Any
) -> BenchResult:
    """Aggregate measured requests into a BenchResult. ``duration`` defaults to first start to last end;
    ``config`` is the rest of the record (what was run, the client's health), by flat name."""
    good = [r for r in records if r.ok]
    bad = [(i, r) for i, r in enumerate(records) if not r.ok]
    if duration is None:
        ends = [r.start + r.latency for r in records]
        duration = (max(ends) - min(r.start for r in records)) if records else 0.0
    inp, out = sum(r.input_tokens for r in good), sum(r.output_tokens for r in good)
    figures: dict[str, Any] = {
        "requests": list(records), "completed": len(good), "failed": len(bad), "duration": duration,
        "total_input_tokens": inp, "total_output_tokens": out,
        "chunk_count_mismatches": sum(1 for r in good if r.server_counted and r.chunks > r.output_tokens),
        "server_token_counts_missing": sum(1 for r in good if not r.server_counted),
        "connection_errors": sum(1 for r in records if r.connection_error),
        **_rates(good, duration, inp, out), **_latencies(good),
        **_speculative_and_goodput(records, good, duration, config.get("slo")),
    }
    if bad:
        i, r = bad[0]
        figures["first_failure"] = {"index": i, "status": r.status, "error": r.error}
    return BenchResult(**config, **figures)


def _client_health(rounds: Sequence[BenchResult]) -> dict[str, Any]:
    cpu = [r.client_cpu_seconds for r in rounds if r.client_cpu_seconds is not None]
    return {"client_cpu_seconds": sum(cpu) if cpu else None,
            "client_bound": any(r.client_bound for r in rounds),
            "client_bound_reason": next((f"round {i}: {r.client_bound_reason}" if len(rounds) > 1 else
                                         r.client_bound_reason for i, r in enumerate(rounds)
                                         if r.client_bound and r.client_bound_reason), None)}


def combine_rounds(rounds: Sequence[BenchResult]) -> BenchResult:
    """The headline result of one or more rounds of the same workload: medians of :data:`ROUND_METRICS`,
    the median round's counts, the honesty counters summed, and a :class:`Spread` per figure."""
    if not rounds:
        raise ValueError("combine_rounds needs at least one round")
    flat = [r.flat() for r in rounds]
    measured = {m: values for m in ROUND_METRICS if None not in (values := [f[m] for f in flat])}
    spread = {m: Spread.of(values) for m, values in measured.items()}
    middle = sorted(range(len(rounds)), key=lambda k: rounds[k].output_throughput)[(len(rounds) - 1) // 2]
    first_failure = next(({**r.first_failure, "round": i} if len(rounds) > 1 else r.first_failure
                          for i, r in enumerate(rounds) if r.first_failure is not None), rounds[0].first_failure)
    sources = {r.gpu_energy_source for r in rounds if r.gpu_energy_source is not None}
    notes = [r.cache_note for r in rounds if r.cache_note]
    return rounds[0].with_figures(
        requests=[q for rnd in rounds for q in rnd.requests], rounds=list(rounds), spread=spread,
        num_rounds=len(rounds), **{m: statistics.median(values) for m, values in measured.items()},
        **{count: flat[middle][count] for count in _MEDIAN_ROUND},
        **{counter: sum(f[counter] for f in flat) for counter in _SUMMED},
        first_failure=first_failure, **_client_health(rounds),
        gpu_energy_source=sources.pop() if len(sources) == 1 else ("mixed" if sources else None),
        cache_note="; ".join(notes) if notes else None)
