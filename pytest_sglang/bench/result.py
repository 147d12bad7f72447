"""The benchmark's record: :class:`BenchResult`, frozen and built once, with its typed parts.

A result is made in one place (metrics.compute_metrics for a round, metrics.combine_rounds for the headline)
and never filled in afterwards: whoever adds to it (the runner with the server's witness, the telemetry, the
client's health) makes a new one with ``dataclasses.replace``. Its parts, each a frozen record of its own:

* :class:`ClientHealth`: the load generator's CPU, busy share, event-loop lag and whether it was the
  bottleneck (``client_bound``), and the honesty counters (connection errors, chunk mismatches, the first failure);
* :class:`ServerWitness`: the server's own account of the run, its /metrics scraped around each round;
* :class:`GpuTelemetry`: what the server's GPUs and gauges did over the measured duration;
* :class:`Speculative`: the accept length of speculative decoding and where it came from.

Every figure reads flat (``result.gpu_energy_j`` is ``result.gauges.gpu_energy_j``), as sglang.bench_serving
names it; the constructor and ``dataclasses.replace`` take the flat names too. ``to_dict`` is the report's
"result" (docs/report-schema.md), its keys in the order of :data:`REPORTED`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, ClassVar, Generic, TypeVar, overload

from pytest_sglang.bench.members import MemberLoad

T = TypeVar("T")


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


@dataclass(frozen=True)
class ClientHealth:
    """The load generator: CPU seconds of its event-loop thread and that over the wall time (0..1); a client
    busy most of the run, or whose loop woke late, measures itself, not the server (``client_bound``,
    bench/selfcheck.py says why). And the honesty counters: requests, warmup included, that got no complete
    HTTP answer (``connection_errors``: the caller asks its server handle whether the server died; not in
    to_dict), the first failed request, stream events beyond the server's count, counts the server never gave."""

    client_cpu_seconds: float | None = None
    client_busy: float | None = None
    client_processes: int = 1  # processes that sent the load (spread.py; the busiest one's CPU and busy above)
    client_bound: bool = False
    client_bound_reason: str | None = None
    client_loop_lag_p90_ms: float | None = None
    client_loop_lag_max_ms: float | None = None
    first_failure: dict[str, Any] | None = None  # {"index", "status", "error"} of the first failed request
    chunk_count_mismatches: int = 0
    server_token_counts_missing: int = 0
    connection_errors: int = 0


@dataclass(frozen=True)
class ServerWitness:
    """The server's own account of the run (its /metrics around each round; bench/server_metrics.py), None
    where the server has no metrics; its prefix cache's share of the prompt tokens (bench/cache.py)."""

    server_metrics: str | None = None  # "sglang" or "vllm": whose metric names were read
    server_generation_tokens: int | None = None
    server_prompt_tokens: int | None = None
    server_median_ttft_ms: float | None = None  # from its histogram (interpolated inside a bucket)
    server_median_itl_ms: float | None = None
    server_accept_length: float | None = None
    server_disagreement: str | None = None  # why its token counts differ from the responses' (fails the run)
    server_cached_tokens: int | None = None
    server_cache_hit_rate: float | None = None


@dataclass(frozen=True)
class GpuTelemetry:
    """What the server's GPUs and gauges did over the measured duration (telemetry.py); None where there is no
    GPU to ask or no /metrics, and ``gpu_unmeasured`` / ``server_unmeasured`` say why. ``gpu_energy_source``:
    "counter", "power_integral", or "mixed" where the rounds differed."""

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
    gpu_energy_source: str | None = None


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding: ``accept_length`` from the measured requests' verify counts ("requests"), else the
    server's /metrics counters ("server_metrics"), else /server_info ("server_info": stale); None without it."""

    accept_length: float | None = None
    accept_length_source: str | None = None


_PARTS: dict[str, type[Any]] = {"health": ClientHealth, "witness": ServerWitness, "gauges": GpuTelemetry,
                                "speculative": Speculative}
PART_OF: dict[str, str] = {f.name: part for part, cls in _PARTS.items() for f in fields(cls)}


class _Flat(Generic[T]):
    """A part's figure read flat off the result: ``result.gpu_energy_j`` is ``result.gauges.gpu_energy_j``."""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name, self.part = name, PART_OF[name]

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> _Flat[T]: ...
    @overload
    def __get__(self, obj: BenchResult, owner: type[Any]) -> T: ...

    def __get__(self, obj: BenchResult | None, owner: type[Any]) -> _Flat[T] | T:
        if obj is None:
            return self
        value: T = getattr(obj.__dict__[self.part], self.name)
        return value


# The report's "result" keys, in their order (docs/report-schema.md); "rounds" and "members" follow where present.
REPORTED: tuple[str, ...] = (
    "api", "num_requests", "max_concurrency", "request_rate", "input_len", "output_len", "warmup", "seed",
    "prompt_kind", "prompt_vocab", "profile", "started_at", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "duration", "request_throughput", "input_throughput", "output_throughput",
    "total_throughput", "concurrency",
    *(f"{stat}_{key}_ms" for key in ("ttft", "itl") for stat in ("mean", "median", "std", "p90", "p99")),
    "max_itl_ms",
    *(f"{stat}_{key}_ms" for key in ("tpot", "e2e_latency") for stat in ("mean", "median", "std", "p90", "p99")),
    "accept_length", "accept_length_source", "server_metrics", "server_generation_tokens", "server_prompt_tokens",
    "server_median_ttft_ms", "server_median_itl_ms", "server_accept_length", "server_disagreement", "cache",
    "server_cached_tokens", "server_cache_hit_rate", "cache_note", "slo", "goodput", "slo_attainment",
    "client_cpu_seconds", "client_busy", "client_processes", "client_bound", "client_bound_reason",
    "client_loop_lag_p90_ms", "client_loop_lag_max_ms", *(f.name for f in fields(GpuTelemetry)), "num_rounds",
    "sweep", "first_failure", "chunk_count_mismatches", "server_token_counts_missing",
)


@dataclass(frozen=True, init=False)
class BenchResult:
    """Figures of one benchmark run, named as sglang.bench_serving names them; frozen (see the module doc)."""

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
    # the server's prefix cache (bench/cache.py): "fresh" (new prompts every round), "flush" (flushed before
    # each round) or "warm" (cached on purpose), and the flag of a round the mode says is uncached but that was
    # mostly served from the cache
    cache: str = "fresh"
    cache_note: str | None = None
    # goodput under SLOs (vllm bench serve --goodput): None unless run with slo={...}
    slo: dict[str, float] | None = None  # {"ttft_ms": 200, "tpot_ms": 50, "e2el_ms": ...}, any subset
    goodput: float | None = None  # completed requests meeting every limit, per second of duration
    slo_attainment: float | None = None  # their share of the measured requests (0..1)
    # rounds: 1 unless run_bench(rounds=N); the per-round results and each figure's spread over them
    num_rounds: int = 1
    sweep: dict[str, Any] | None = None  # {"param": "concurrency", "value": 4} for a point of a sweep
    requests: list[RequestRecord] = field(default_factory=list, repr=False)
    rounds: list[BenchResult] = field(default_factory=list, repr=False)
    spread: dict[str, Spread] = field(default_factory=dict, repr=False)
    telemetry: dict[str, Any] | None = field(default=None, repr=False)  # the time series (the report's own key)
    # a fleet's: what each server member served over the rounds, from its own /metrics (bench/members.py)
    members: dict[str, MemberLoad] = field(default_factory=dict, repr=False)
    # the typed parts
    health: ClientHealth = field(default_factory=ClientHealth)
    witness: ServerWitness = field(default_factory=ServerWitness)
    gauges: GpuTelemetry = field(default_factory=GpuTelemetry)
    speculative: Speculative = field(default_factory=Speculative)

    def __init__(self, **figures: Any) -> None:
        """Every field by its flat name (a part's too: ``gpu_energy_j=...``), or a part whole (``gauges=...``,
        the flat names given beside it win): so ``dataclasses.replace(result, gpu_energy_j=...)`` works."""
        flat: dict[str, dict[str, Any]] = {part: {} for part in _PARTS}
        for name in [n for n in figures if n in PART_OF]:
            flat[PART_OF[name]][name] = figures.pop(name)
        for f in fields(self):
            if f.name in _PARTS:
                given = figures.pop(f.name, None)
                value = replace(given, **flat[f.name]) if given is not None else _PARTS[f.name](**flat[f.name])
            elif f.name in figures:
                value = figures.pop(f.name)
            else:
                value = f.default_factory() if f.default is MISSING else f.default  # type: ignore[operator]
            object.__setattr__(self, f.name, value)
        if figures:
            raise TypeError(f"BenchResult got unexpected keyword arguments: {', '.join(map(repr, figures))}")

    # the parts' figures, read flat
    client_cpu_seconds: ClassVar[_Flat[float | None]] = _Flat()
    client_busy: ClassVar[_Flat[float | None]] = _Flat()
    client_processes: ClassVar[_Flat[int]] = _Flat()
    client_bound: ClassVar[_Flat[bool]] = _Flat()
    client_bound_reason: ClassVar[_Flat[str | None]] = _Flat()
    client_loop_lag_p90_ms: ClassVar[_Flat[float | None]] = _Flat()
    client_loop_lag_max_ms: ClassVar[_Flat[float | None]] = _Flat()
    first_failure: ClassVar[_Flat[dict[str, Any] | None]] = _Flat()
    chunk_count_mismatches: ClassVar[_Flat[int]] = _Flat()
    server_token_counts_missing: ClassVar[_Flat[int]] = _Flat()
    connection_errors: ClassVar[_Flat[int]] = _Flat()
    server_metrics: ClassVar[_Flat[str | None]] = _Flat()
    server_generation_tokens: ClassVar[_Flat[int | None]] = _Flat()
    server_prompt_tokens: ClassVar[_Flat[int | None]] = _Flat()
    server_median_ttft_ms: ClassVar[_Flat[float | None]] = _Flat()
    server_median_itl_ms: ClassVar[_Flat[float | None]] = _Flat()
    server_accept_length: ClassVar[_Flat[float | None]] = _Flat()
    server_disagreement: ClassVar[_Flat[str | None]] = _Flat()
    server_cached_tokens: ClassVar[_Flat[int | None]] = _Flat()
    server_cache_hit_rate: ClassVar[_Flat[float | None]] = _Flat()
    gpu_energy_j: ClassVar[_Flat[float | None]] = _Flat()
    energy_per_output_token_j: ClassVar[_Flat[float | None]] = _Flat()
    output_tokens_per_joule: ClassVar[_Flat[float | None]] = _Flat()
    gpu_util_mean_pct: ClassVar[_Flat[float | None]] = _Flat()
    gpu_memory_peak_mib: ClassVar[_Flat[float | None]] = _Flat()
    gpu_power_mean_w: ClassVar[_Flat[float | None]] = _Flat()
    gpu_sm_clock_mean_mhz: ClassVar[_Flat[float | None]] = _Flat()
    server_queue_mean: ClassVar[_Flat[float | None]] = _Flat()
    server_kv_usage_peak: ClassVar[_Flat[float | None]] = _Flat()
    gpu_unmeasured: ClassVar[_Flat[str | None]] = _Flat()
    server_unmeasured: ClassVar[_Flat[str | None]] = _Flat()
    gpu_energy_source: ClassVar[_Flat[str | None]] = _Flat()
    accept_length: ClassVar[_Flat[float | None]] = _Flat()
    accept_length_source: ClassVar[_Flat[str | None]] = _Flat()

    def with_figures(self, **figures: Any) -> BenchResult:
        """A new result: this one with ``figures`` (flat names, a part's too) changed."""
        return replace(self, **figures)

    def flat(self) -> dict[str, Any]:
        """Every field by its flat name, the parts' figures in place of the parts."""
        out = {f.name: self.__dict__[f.name] for f in fields(self) if f.name not in _PARTS}
        for part in _PARTS:
            out.update(vars(self.__dict__[part]))
        return out

    def to_dict(self, *, include_requests: bool = False) -> dict[str, Any]:
        """JSON-ready figures (``request_rate`` inf becomes the string "inf"), as docs/report-schema.md lists
        them; ``include_requests`` adds every measured request."""
        flat = self.flat()
        out: dict[str, Any] = {}
        for name in REPORTED:
            value = flat[name]
            out[name] = "inf" if isinstance(value, float) and math.isinf(value) else value
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
        values = [r.figure(metric) for r in self.rounds or [self]]
        if any(v is None for v in values):
            value = self.figure(metric)
            return [] if value is None else [float(value)]
        return [float(v) for v in values if v is not None]

    def figure(self, metric: str) -> Any:
        """``metric`` by the metric table (bench/metric_table.py); a name outside it, by the flat record."""
        from pytest_sglang.bench.metric_table import METRICS

        entry = METRICS.get(metric)
        return entry.read(self) if entry is not None else self.flat().get(metric)

    def unmeasured(self, metric: str) -> str | None:
        """Why ``metric`` is None on this result where it is a telemetry figure that was not measured."""
        from pytest_sglang.bench.metric_table import METRICS

        entry = METRICS.get(metric)
        if entry is None or entry.part not in ("gpu", "server_gauges") or entry.read(self) is not None:
            return None
        why = self.gauges.gpu_unmeasured if entry.part == "gpu" else self.gauges.server_unmeasured
        return why or "it was not measured"

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.completed > 0

    @property
    def attempted(self) -> int:
        """Measured requests sent, over every round (``completed`` is the median round's count)."""
        return sum(r.completed + r.failed for r in self.rounds) if self.rounds else self.completed + self.failed

    def summary(self) -> str:
        """The figures as ``python -m sglang.bench_serving`` prints them."""
        from pytest_sglang.bench.summary import summary_text

        return summary_text(self)


def failure_text(result: BenchResult) -> str:
    ff = result.first_failure or {}
    status = f"HTTP {ff['status']}" if ff.get("status") else "no HTTP status"
    where = f"round {ff['round']}, " if "round" in ff else ""
    return (f"{result.failed} of {result.attempted} requests failed; the first "
            f"({where}request {ff.get('index')}, {status}): {ff.get('error')}")

