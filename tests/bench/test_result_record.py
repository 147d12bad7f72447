"""The benchmark's record is built once: frozen, its report keys those the JSON report and the history have
always read, and every metric a check accepts named in the metric table with its direction."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from pytest_sglang.baseline.directions import direction, unit
from pytest_sglang.bench import BenchResult, RequestRecord, combine_rounds, compute_metrics
from pytest_sglang.bench.members import MemberLoad
from pytest_sglang.bench.metric_table import METRICS
from pytest_sglang.bench.metrics import GPU_FIGURES, ROUND_METRICS, SERVER_FIGURES
from pytest_sglang.bench.result import PART_OF
from pytest_sglang.errors import BaselineError

# to_dict()'s keys before the record had parts, in their order (docs/report-schema.md's "result")
OLD_KEYS = [
    "api", "num_requests", "max_concurrency", "request_rate", "input_len", "output_len", "warmup", "seed",
    "prompt_kind", "prompt_vocab", "profile", "started_at", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "duration", "request_throughput", "input_throughput", "output_throughput",
    "total_throughput", "concurrency", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms",
    "p99_ttft_ms", "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p90_itl_ms", "p99_itl_ms", "max_itl_ms",
    "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "mean_e2e_latency_ms",
    "median_e2e_latency_ms", "std_e2e_latency_ms", "p90_e2e_latency_ms", "p99_e2e_latency_ms", "accept_length",
    "accept_length_source", "server_metrics", "server_generation_tokens", "server_prompt_tokens",
    "server_median_ttft_ms", "server_median_itl_ms", "server_accept_length", "server_disagreement", "cache",
    "server_cached_tokens", "server_cache_hit_rate", "cache_note", "slo", "goodput", "slo_attainment",
    "client_cpu_seconds", "client_busy", "client_processes", "client_bound", "client_bound_reason",
    "client_loop_lag_p90_ms", "client_loop_lag_max_ms", "gpu_energy_j", "energy_per_output_token_j",
    "output_tokens_per_joule", "gpu_util_mean_pct", "gpu_memory_peak_mib", "gpu_power_mean_w",
    "gpu_sm_clock_mean_mhz", "server_queue_mean", "server_kv_usage_peak", "gpu_unmeasured", "server_unmeasured",
    "gpu_energy_source", "num_rounds", "sweep", "first_failure", "chunk_count_mismatches",
    "server_token_counts_missing", "spread",
]
# names a check accepted before the table (baseline/directions.py's explicit names and BenchResult's figures
# its suffix rules matched)
CHECKABLE = [k for k in OLD_KEYS if k.endswith(("_throughput", "_ms", "_seconds"))] + [
    "accept_length", "completed", "concurrency", "goodput", "slo_attainment", "duration", "failed",
    "chunk_count_mismatches", "startup_seconds", "max_output_tokens_per_s", *GPU_FIGURES, *SERVER_FIGURES]


def _request(latency: float, *, ok: bool = True) -> RequestRecord:
    return RequestRecord(ok=ok, start=0.0, latency=latency, ttft=latency / 4, itls=[latency / 8] * 3,
                         input_tokens=8, output_tokens=4, chunks=4, server_counted=True, spec_verify_ct=2,
                         status=None if ok else 500, error=None if ok else "boom")


def test_the_record_is_frozen_parts_and_all() -> None:
    r = compute_metrics([_request(0.1), _request(0.2)], input_len=8, client_busy=0.5)
    for name in ("output_throughput", "gpu_energy_j", "client_bound", "accept_length", "server_metrics", "health"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(r, name, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.health.client_busy = 1.0  # type: ignore[misc]
    changed = r.with_figures(client_bound=True, gpu_energy_j=5.0)
    assert (r.client_bound, r.gpu_energy_j) == (False, None)
    assert (changed.client_bound, changed.health.client_bound, changed.gauges.gpu_energy_j) == (True, True, 5.0)
    assert changed.output_throughput == r.output_throughput and changed.client_busy == 0.5
    with pytest.raises(TypeError, match="unexpected keyword"):
        BenchResult(no_such_figure=1)


def test_to_dict_keeps_the_old_keys_in_their_order_and_round_trips_through_json() -> None:
    assert list(BenchResult().to_dict()) == OLD_KEYS
    rounds = [compute_metrics([_request(0.1 * k), _request(0.1, ok=k != 2)], slo={"ttft_ms": 30.0},
                              client_cpu_seconds=0.1, gpu_unmeasured="no GPU")
              for k in (1, 2, 3)]
    head = combine_rounds(rounds).with_figures(members={"worker0": MemberLoad("worker", 4, 16, 32)})
    report = head.to_dict(include_requests=True)
    assert list(report) == [*OLD_KEYS, "members", "rounds", "requests"]
    assert json.loads(json.dumps(report)) == report
    assert BenchResult(request_rate=math.inf).to_dict()["request_rate"] == "inf"
    assert report["first_failure"] == {"index": 1, "status": 500, "error": "boom", "round": 1}
    assert report["failed"] == 1 and report["client_cpu_seconds"] == pytest.approx(0.3)
    assert report["gpu_unmeasured"] == "no GPU" and report["accept_length"] == 2.0
    assert all(list(r) == [k for k in OLD_KEYS if k not in ("spread", "sweep")] for r in report["rounds"])
    flat = {k: v for k, v in head.flat().items() if k in OLD_KEYS}
    assert BenchResult(**flat, rounds=head.rounds, requests=head.requests).to_dict() == {
        k: v for k, v in report.items() if k not in ("members", "requests")}


def test_every_flat_name_reads_through_its_part() -> None:
    r = BenchResult(**{name: None for name in PART_OF if name not in (
        "client_processes", "client_bound", "chunk_count_mismatches", "server_token_counts_missing",
        "connection_errors")})
    for name, part in PART_OF.items():
        assert getattr(r, name) == getattr(getattr(r, part), name), name


def test_the_metric_table_covers_every_metric_a_check_accepts_with_its_direction() -> None:
    assert set(CHECKABLE) <= set(METRICS)
    for name, entry in METRICS.items():
        assert direction(name) == entry.direction and unit(name) == entry.unit, name
    higher = {"output_throughput", "request_throughput", "accept_length", "goodput", "slo_attainment", "completed",
              "concurrency", "output_tokens_per_joule", "gpu_util_mean_pct", "gpu_sm_clock_mean_mhz"}
    lower = {"median_ttft_ms", "p99_itl_ms", "duration", "failed", "startup_seconds", "gpu_energy_j",
             "energy_per_output_token_j", "gpu_power_mean_w", "gpu_memory_peak_mib", "server_queue_mean",
             "server_kv_usage_peak", "chunk_count_mismatches"}
    assert all(METRICS[m].direction == "higher" for m in higher)
    assert all(METRICS[m].direction == "lower" for m in lower)
    r = compute_metrics([_request(0.1), _request(0.3)])
    for name, entry in METRICS.items():
        if entry.part != "server":
            assert entry.read(r) == r.flat()[name], name
    assert {METRICS[m].part for m in GPU_FIGURES} == {"gpu"} and {METRICS[m].part for m in SERVER_FIGURES} == {
        "server_gauges"}
    assert set(ROUND_METRICS) <= set(r.flat())


def test_a_check_naming_an_unknown_metric_still_fails_clearly() -> None:
    with pytest.raises(BaselineError, match="no direction known for metric 'tokens_per_banana'"):
        direction("tokens_per_banana")
    assert direction("custom_ms") == "lower" and direction("my_throughput") == "higher"  # a mapping's own figure
