"""Service-level objectives: which requests meet per-request limits (goodput), as `vllm bench serve --goodput`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytest_sglang.errors import BenchmarkError

if TYPE_CHECKING:
    from pytest_sglang.bench.metrics import RequestRecord

SLO_KEYS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2el_ms": "e2el"}


def meets_slo(record: RequestRecord, slo: Mapping[str, float]) -> bool:
    """Whether a completed request meets every limit of ``slo`` (ms, ``<=``), as vllm bench serve counts it."""
    if not record.ok:
        return False
    ttft = record.ttft if record.ttft is not None else record.latency
    tpot = (record.latency - ttft) / (record.output_tokens - 1) if record.output_tokens > 1 else 0.0
    measured = {"ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": record.latency}
    return all(measured[k] * 1000.0 <= float(limit) for k, limit in slo.items())


def check_slo(slo: Mapping[str, Any]) -> dict[str, float]:
    """``slo`` with vllm's short names (``ttft``, ``tpot``, ``e2el``) accepted; BenchmarkError for the rest."""
    out: dict[str, float] = {}
    for key, limit in slo.items():
        name = key if key in SLO_KEYS else f"{key}_ms" if f"{key}_ms" in SLO_KEYS else None
        if name is None:
            raise BenchmarkError(f"slo key {key!r} unknown: use ttft_ms, tpot_ms and e2el_ms (milliseconds)")
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
            raise BenchmarkError(f"slo {key} must be a positive number of milliseconds, got {limit!r}")
        out[name] = float(limit)
    if not out:
        raise BenchmarkError("slo needs at least one of ttft_ms, tpot_ms, e2el_ms")
    return out
