"""A result's figures as ``python -m sglang.bench_serving`` prints them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_sglang.bench.payloads import API_PATHS

if TYPE_CHECKING:
    from pytest_sglang.bench.result import BenchResult

_SECTIONS = (("End-to-End Latency", "e2e_latency"), ("Time to First Token", "ttft"),
             ("Time per Output Token (excl. 1st token)", "tpot"), ("Inter-Token Latency", "itl"))


def _row(label: str, value: Any) -> str:
    if isinstance(value, float):
        value = f"{value:.2f}"
    return f"{label:<40}{value!s:<10}"


def summary_text(result: BenchResult) -> str:
    from pytest_sglang.bench.result import failure_text

    r = result
    lines = [f"{' Serving Benchmark Result ':=^50}"]
    lines += [
        _row("Backend:", f"{r.api} ({API_PATHS.get(r.api, '?')})"),
        _row("Traffic request rate:", r.request_rate),
        _row("Max request concurrency:", r.max_concurrency or "not set"),
        _row("Successful requests:", r.completed),
        _row("Failed requests:", r.failed),
        _row("Benchmark duration (s):", r.duration),
        _row("Total input tokens:", r.total_input_tokens),
        _row("Total generated tokens:", r.total_output_tokens),
        _row("Request throughput (req/s):", r.request_throughput),
        _row("Input token throughput (tok/s):", r.input_throughput),
        _row("Output token throughput (tok/s):", r.output_throughput),
        _row("Total token throughput (tok/s):", r.total_throughput),
        _row("Concurrency:", r.concurrency),
    ]
    if r.accept_length is not None:
        lines.append(_row("Accept length:", r.accept_length))
    if r.goodput is not None:
        lines.append(_row("Request goodput (req/s):", r.goodput))
    if r.server_cache_hit_rate is not None:
        lines.append(_row(f"Prefix cache hits ({r.cache}):", f"{r.server_cache_hit_rate:.1%}"))
    if r.num_rounds > 1:
        sp = r.spread.get("output_throughput")
        cv = f", CV {sp.cv_pct:.1f}%" if sp and sp.cv_pct is not None else ""
        lines.append(_row("Rounds (figures: medians):", f"{r.num_rounds}{cv}"))
    flat = r.flat()
    for title, key in _SECTIONS:
        lines.append(f"{title:-^50}")
        for stat in ("mean", "median", "p90", "p99"):
            lines.append(_row(f"{stat.capitalize() if stat[0] != 'p' else stat.upper()} "
                              f"{key.upper().replace('_LATENCY', '')} (ms):", flat[f"{stat}_{key}_ms"]))
    if r.failed:
        lines.append(f"{' FAILURES ':-^50}")
        lines.append(failure_text(r))
    lines.append("=" * 50)
    return "\n".join(lines)
