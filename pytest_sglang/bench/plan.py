"""What a run_bench call was asked, checked before anything is sent (runner.py's module doc says what each
argument does)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_sglang.bench.payloads import API_PATHS, Api
from pytest_sglang.errors import BenchmarkError


@dataclass(frozen=True)
class _Plan:
    """What run_bench was asked, checked."""

    api: Api
    num_requests: int
    concurrency: int | None
    request_rate: float
    input_len: int
    output_len: int
    ignore_eos: bool | None
    warmup: int
    seed: int
    tokenizer: Any
    prompts: Sequence[str | Sequence[int]] | None
    model: str | None
    extra_body: Mapping[str, Any] | None
    timeout: float | None
    profile: str | None
    rounds: int
    slo: dict[str, float] | None
    server_metrics: bool
    telemetry: bool
    client_processes: int | None
    cache: str
    sweep: dict[str, Any] | None


def _check(api: str, num_requests: int, input_len: int, output_len: int, concurrency: int | None, rounds: Any,
           client_processes: Any) -> None:
    if api not in API_PATHS:
        raise BenchmarkError(f"api must be one of {', '.join(API_PATHS)}, got {api!r}")
    if num_requests < 1 or input_len < 1 or output_len < 1:
        raise BenchmarkError("num_requests, input_len and output_len must be at least 1")
    if concurrency is not None and concurrency < 1:
        raise BenchmarkError(f"concurrency must be at least 1 (or None for no cap), got {concurrency}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise BenchmarkError(f"rounds must be an integer of at least 1, got {rounds!r}")
    if client_processes is not None and (isinstance(client_processes, bool) or not isinstance(client_processes, int)
                                         or client_processes < 1):
        raise BenchmarkError(f"client_processes must be an integer of at least 1 (or None: chosen from the "
                             f"self-check), got {client_processes!r}")
