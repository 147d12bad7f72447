"""The metrics a check may name: which way is better, the unit, the part of the result that owns it, and how
it is read off a :class:`~pytest_sglang.bench.result.BenchResult`.

Parts: ``figures`` (the run's own counts, rates and latencies), ``health`` (the client's), ``witness`` (the
server's /metrics), ``speculative``, ``gpu`` and ``server_gauges`` (the telemetry; ``gpu_unmeasured`` and
``server_unmeasured`` say why one is None), and ``server`` (the server handle's, not a benchmark's).
baseline/directions.py judges by this table; a name outside it (a mapping's or a handle's own figure) goes by
its suffix there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from pytest_sglang.bench.result import BenchResult

Direction = Literal["higher", "lower"]
Part = Literal["figures", "health", "witness", "speculative", "gpu", "server_gauges", "server"]
Reader = Callable[["BenchResult"], "float | int | None"]


@dataclass(frozen=True)
class Metric:
    name: str
    direction: Direction
    unit: str
    part: Part
    read: Reader


def _none(result: BenchResult) -> None:
    """A figure that is no benchmark's (the server handle's startup_seconds)."""
    return None


_ROWS: tuple[Metric, ...] = (
    Metric("duration", "lower", "s", "figures", lambda r: r.duration),
    Metric("completed", "higher", "", "figures", lambda r: r.completed),
    Metric("failed", "lower", "", "figures", lambda r: r.failed),
    Metric("request_throughput", "higher", "req/s", "figures", lambda r: r.request_throughput),
    Metric("input_throughput", "higher", "tok/s", "figures", lambda r: r.input_throughput),
    Metric("output_throughput", "higher", "tok/s", "figures", lambda r: r.output_throughput),
    Metric("total_throughput", "higher", "tok/s", "figures", lambda r: r.total_throughput),
    Metric("concurrency", "higher", "", "figures", lambda r: r.concurrency),
    Metric("mean_ttft_ms", "lower", "ms", "figures", lambda r: r.mean_ttft_ms),
    Metric("median_ttft_ms", "lower", "ms", "figures", lambda r: r.median_ttft_ms),
    Metric("std_ttft_ms", "lower", "ms", "figures", lambda r: r.std_ttft_ms),
    Metric("p90_ttft_ms", "lower", "ms", "figures", lambda r: r.p90_ttft_ms),
    Metric("p99_ttft_ms", "lower", "ms", "figures", lambda r: r.p99_ttft_ms),
    Metric("mean_itl_ms", "lower", "ms", "figures", lambda r: r.mean_itl_ms),
    Metric("median_itl_ms", "lower", "ms", "figures", lambda r: r.median_itl_ms),
    Metric("std_itl_ms", "lower", "ms", "figures", lambda r: r.std_itl_ms),
    Metric("p90_itl_ms", "lower", "ms", "figures", lambda r: r.p90_itl_ms),
    Metric("p99_itl_ms", "lower", "ms", "figures", lambda r: r.p99_itl_ms),
    Metric("max_itl_ms", "lower", "ms", "figures", lambda r: r.max_itl_ms),
    Metric("mean_tpot_ms", "lower", "ms", "figures", lambda r: r.mean_tpot_ms),
    Metric("median_tpot_ms", "lower", "ms", "figures", lambda r: r.median_tpot_ms),
    Metric("std_tpot_ms", "lower", "ms", "figures", lambda r: r.std_tpot_ms),
    Metric("p90_tpot_ms", "lower", "ms", "figures", lambda r: r.p90_tpot_ms),
    Metric("p99_tpot_ms", "lower", "ms", "figures", lambda r: r.p99_tpot_ms),
    Metric("mean_e2e_latency_ms", "lower", "ms", "figures", lambda r: r.mean_e2e_latency_ms),
    Metric("median_e2e_latency_ms", "lower", "ms", "figures", lambda r: r.median_e2e_latency_ms),
    Metric("std_e2e_latency_ms", "lower", "ms", "figures", lambda r: r.std_e2e_latency_ms),
    Metric("p90_e2e_latency_ms", "lower", "ms", "figures", lambda r: r.p90_e2e_latency_ms),
    Metric("p99_e2e_latency_ms", "lower", "ms", "figures", lambda r: r.p99_e2e_latency_ms),
    Metric("goodput", "higher", "req/s", "figures", lambda r: r.goodput),
    Metric("slo_attainment", "higher", "", "figures", lambda r: r.slo_attainment),
    Metric("chunk_count_mismatches", "lower", "", "health", lambda r: r.chunk_count_mismatches),
    Metric("client_cpu_seconds", "lower", "s", "health", lambda r: r.client_cpu_seconds),
    Metric("client_loop_lag_p90_ms", "lower", "ms", "health", lambda r: r.client_loop_lag_p90_ms),
    Metric("client_loop_lag_max_ms", "lower", "ms", "health", lambda r: r.client_loop_lag_max_ms),
    Metric("server_median_ttft_ms", "lower", "ms", "witness", lambda r: r.server_median_ttft_ms),
    Metric("server_median_itl_ms", "lower", "ms", "witness", lambda r: r.server_median_itl_ms),
    Metric("accept_length", "higher", "", "speculative", lambda r: r.accept_length),
    Metric("gpu_energy_j", "lower", "J", "gpu", lambda r: r.gpu_energy_j),
    Metric("energy_per_output_token_j", "lower", "J", "gpu", lambda r: r.energy_per_output_token_j),
    Metric("output_tokens_per_joule", "higher", "tok/J", "gpu", lambda r: r.output_tokens_per_joule),
    Metric("gpu_util_mean_pct", "higher", "%", "gpu", lambda r: r.gpu_util_mean_pct),
    Metric("gpu_memory_peak_mib", "lower", "MiB", "gpu", lambda r: r.gpu_memory_peak_mib),
    Metric("gpu_power_mean_w", "lower", "W", "gpu", lambda r: r.gpu_power_mean_w),
    Metric("gpu_sm_clock_mean_mhz", "higher", "MHz", "gpu", lambda r: r.gpu_sm_clock_mean_mhz),
    Metric("server_queue_mean", "lower", "", "server_gauges", lambda r: r.server_queue_mean),
    Metric("server_kv_usage_peak", "lower", "", "server_gauges", lambda r: r.server_kv_usage_peak),
    Metric("startup_seconds", "lower", "s", "server", _none),
    Metric("max_output_tokens_per_s", "higher", "tok/s", "server", _none),
)
METRICS: dict[str, Metric] = {m.name: m for m in _ROWS}


def read(result: BenchResult, metric: str) -> float | int | None:
    """``metric`` of ``result`` by the table (None for a name outside it or one the result does not have)."""
    entry = METRICS.get(metric)
    return entry.read(result) if entry is not None else None
