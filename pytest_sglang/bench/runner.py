"""The run: ``run_bench(server, num_requests=..., concurrency=..., input_len=..., output_len=..., rounds=1)``.

It builds the prompts and request bodies, runs the warmup requests once and then ``rounds`` rounds of the
measured ones through the streaming client on one event loop (``concurrency`` caps those in flight,
``request_rate`` spaces their arrivals as a Poisson process, the same arrivals every round), and returns the
:class:`~pytest_sglang.bench.metrics.BenchResult` of the measured ones: with several rounds, the medians of the
rounds with each figure's spread, and the rounds themselves in ``result.rounds`` (metrics.combine_rounds).
Rounds are ``ROUND_GAP_S`` apart, so the server drains between them. The event-loop thread's CPU time over
each round's wall time is ``client_busy``; past ``CLIENT_BOUND_BUSY``, or with an event loop that wakes late
(selfcheck.py), the run is ``client_bound`` (``client_bound_reason`` says which): the figures then measure the
load generator, and a baseline check does not judge them. ``client_processes=N`` spreads the rounds over N
processes (spread.py); left to the runner, a run whose one loop was client-bound runs again over
:func:`spare_processes` where the machine has cores to spare. During each round the server's GPUs and its
/metrics gauges are sampled (telemetry.py: energy per token and the rest). Failed requests raise
:class:`~pytest_sglang.errors.BenchmarkFailedError` carrying the result, unless ``allow_failures=True``.
The runner never asks about the server's liveness: ``connection_errors`` tells the caller that some requests
got no answer, and the caller asks its server handle why.

Arguments: ``concurrency`` caps requests in flight (None: no cap); ``request_rate`` is the Poisson arrival rate
in requests/s (inf: all at once, bounded by ``concurrency``). ``warmup`` requests run first and are left out.
``rounds``: how many times the measured workload runs on the server (the figures are the rounds' medians;
``result.rounds`` has each). ``slo``: per-request limits in ms (``ttft_ms``, ``tpot_ms``, ``e2el_ms``) for
``goodput``. ``server_metrics``: scrape the server's ``/metrics`` around each round and fail the run where its
token counts differ from the responses' (bench/server_metrics.py; False for a server that others load at the
same time). ``telemetry``: sample the server's GPUs and its /metrics gauges during the rounds
(bench/telemetry.py: energy per token and the rest; None where unmeasured, with why). ``client_processes``:
how many processes send the load (bench/spread.py); None: one event loop, and where its rounds were
client-bound on a machine with cores to spare, the run again over :func:`spare_processes`. ``tokenizer``: a
tokenizer object or a name for ``transformers.AutoTokenizer`` (default: the server's model, when transformers
is installed and has it locally); used only for text prompts. ``cache``: how the rounds meet the server's
prefix cache (bench/cache.py): ``"fresh"`` (default) new prompts for the warmup and every round, ``"flush"``
(default with ``prompts=``) the same prompts with the cache flushed before each round, ``"warm"`` the same
prompts, cached on purpose; each round's ``server_cache_hit_rate`` is the server's witness, and a round of
"fresh" or "flush" that it says was mostly cached gets a ``cache_note`` and a
:class:`~pytest_sglang.bench.cache.CachedRoundWarning`. ``api``: default "completions", and "generate" through
a fleet's router (a server with ``members``): sglang-router parses OpenAI bodies itself and refuses token-id
prompts with HTTP 422, where SGLang's own /generate takes ``input_ids`` through it unchanged
(docs/fleet-real.md). ``sweep``: the tag of a sweep's point (bench/sweep.py), part of the result it makes.
Bad arguments raise BenchmarkError; failed requests raise BenchmarkFailedError with the result.

Each round's result is made once from its requests and the client's health (:meth:`_Run.round_result`); the
server's witness, the cache's note, the telemetry and the speculative fallback each make a new one of it, and
the headline is made once from the rounds (metrics.combine_rounds) with what only the whole run knows.
"""

from __future__ import annotations

import math
import os
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, runtime_checkable

from pytest_sglang.bench.cache import (
    PROMPT_SETS,
    CachedRoundWarning,
    cached_round_note,
    flush_prefix_cache,
    resolve_cache_mode,
)
from pytest_sglang.bench.client import Client
from pytest_sglang.bench.drive import ROUND_GAP_S, _drive, _run_coroutine, stream_one
from pytest_sglang.bench.members import MemberScrapes
from pytest_sglang.bench.metrics import BenchResult, combine_rounds, compute_metrics, failure_text, record_from_stream
from pytest_sglang.bench.payloads import API_PATHS, Api, build_payload
from pytest_sglang.bench.plan import _check, _Plan
from pytest_sglang.bench.prompts import prepare_prompts
from pytest_sglang.bench.selfcheck import LagStats, LoopLagProbe, judge_client
from pytest_sglang.bench.server_metrics import RoundWitness
from pytest_sglang.bench.slo import check_slo
from pytest_sglang.bench.spread import drive_spread
from pytest_sglang.bench.stream import StreamResult
from pytest_sglang.bench.telemetry import Telemetry
from pytest_sglang.errors import BenchmarkFailedError

__all__ = ["CLIENT_BOUND_BUSY", "MAX_CLIENT_PROCESSES", "ROUND_GAP_S", "ServerLike", "_run_coroutine",
           "expected_throughput", "run_bench", "spare_processes", "stream_one"]

CLIENT_BOUND_BUSY = 0.9  # the client's event loop busy this share of a round: the round measured the client
MAX_CLIENT_PROCESSES = 8


@runtime_checkable
class ServerLike(Protocol):
    """What the load generator needs of a server handle (``sglang_server`` is one)."""

    @property
    def base_url(self) -> str: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def model(self) -> str | None: ...


@dataclass
class _Url:
    base_url: str
    api_key: str | None = None
    kind: str = "generic"
    model: str | None = None


def run_bench(
    server: ServerLike | str,
    *,
    num_requests: int = 64,
    concurrency: int | None = None,
    request_rate: float = math.inf,
    input_len: int = 128,
    output_len: int = 128,
    api: Api | None = None,
    ignore_eos: bool | None = True,
    warmup: int = 1,
    seed: int = 0,
    tokenizer: Any | str | None = None,
    prompts: Sequence[str | Sequence[int]] | None = None,
    model: str | None = None,
    extra_body: Mapping[str, Any] | None = None,
    timeout: float | None = 1800.0,
    allow_failures: bool = False,
    profile: str | None = None,
    rounds: int = 1,
    slo: Mapping[str, float] | None = None,
    server_metrics: bool = True,
    telemetry: bool = True,
    client_processes: int | None = None,
    cache: str | None = None,
    sweep: Mapping[str, Any] | None = None,
) -> BenchResult:
    """Benchmark ``server`` (a server handle, or a base URL) with streamed requests; the module doc says what
    each argument does. Bad arguments raise BenchmarkError; failed requests raise BenchmarkFailedError with
    the result."""
    if api is None:
        api = "generate" if getattr(server, "members", None) else "completions"
    _check(api, num_requests, input_len, output_len, concurrency, rounds, client_processes)
    slo_ms = check_slo(slo) if slo is not None else None
    handle: ServerLike = _Url(server.rstrip("/")) if isinstance(server, str) else server
    plan = _Plan(api, num_requests, concurrency, request_rate, input_len, output_len, ignore_eos, warmup, seed,
                 tokenizer, prompts, model, extra_body, timeout,
                 profile if profile is not None else getattr(handle, "profile", None), rounds,
                 dict(slo_ms) if slo_ms else None, server_metrics, telemetry, client_processes,
                 resolve_cache_mode(cache, prompts_given=prompts is not None), dict(sweep) if sweep else None)
    run = _Run(plan, handle)
    try:
        result, warm = run.result()
    finally:
        run.close()
    _raise_failures(result, warm, run.disagreements, handle, plan, allow_failures=allow_failures)
    return result


Workload = tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[list[int]]]


@dataclass
class _Run:
    """One run_bench call against one server: its client, its samplers and the rounds it measured."""

    plan: _Plan
    handle: ServerLike
    client: Client = field(init=False)
    members: MemberScrapes = field(init=False)
    tel: Telemetry | None = None
    served_model: str | None = None
    prompt_kind: str = "token_ids"
    vocab: str | None = None
    spec_info: bool = False
    extra_body: Mapping[str, Any] | None = None
    started_at: str = ""
    disagreements: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client = Client(self.handle.base_url, api_key=self.handle.api_key, timeout=60,
                             model=self.plan.model or self.handle.model)
        self.members = MemberScrapes(self.handle)

    def close(self) -> None:
        if self.tel is not None:
            self.tel.close()
        self.client.close()

    def result(self) -> tuple[BenchResult, list[StreamResult]]:
        """The headline result, made once from the rounds, and the warmup's requests."""
        plan, handle, client = self.plan, self.handle, self.client
        if plan.api != "generate":
            self.served_model = plan.model or _served_model(client, handle)
        self.spec_info = _speculative(client, handle)
        self.extra_body = plan.extra_body
        if self.spec_info and plan.api != "generate":  # SGLang's per-request verify counts on its OpenAI APIs
            self.extra_body = {"return_spec_tokens_details": True, **(plan.extra_body or {})}
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        warm, per_round, wit, tel = self.measure(plan.client_processes or 1)
        spare = spare_processes()
        if plan.client_processes is None and spare > 1 and any(one.client_bound for one in per_round):
            warm, per_round, wit, tel = self.measure(spare)  # one loop could not keep pace: the figures were its own
        per_round, self.disagreements = wit.apply(per_round)
        per_round = [one.with_figures(cache_note=cached_round_note(plan.cache, one.server_cache_hit_rate,
                                                                   round_index=k, rounds=plan.rounds))
                     for k, one in enumerate(per_round)]
        per_round = self._accept_fallback(tel.apply(per_round))
        head = combine_rounds(per_round)
        for one in per_round:
            if one.cache_note:
                warnings.warn(CachedRoundWarning(f"{handle.base_url}: {one.cache_note}"), stacklevel=3)
        return head.with_figures(members=self.members.loads(), telemetry=tel.series(per_round),
                       server_disagreement=self.disagreements[0] if self.disagreements else None,
                       connection_errors=head.connection_errors + sum(1 for s in warm if s.connection_error)), warm

    def _accept_fallback(self, per_round: list[BenchResult]) -> list[BenchResult]:
        """The server's /server_info accept length for the rounds that have none: the last resort, updated
        only every decode-log interval."""
        if not self.spec_info or all(one.accept_length is not None for one in per_round):
            return per_round
        server_accept = self.client.accept_length()
        if server_accept is None:
            return per_round
        return [one.with_figures(accept_length=server_accept, accept_length_source="server_info")
                if one.accept_length is None else one for one in per_round]

    def workload(self) -> Workload:
        """The warmup bodies, each round's and each round's prompt lengths: "fresh" draws sets this server has
        not been sent (cache.PROMPT_SETS), the other modes send the same prompts every round."""
        plan = self.plan
        sets = None
        if plan.cache == "fresh":
            n_sets = (1 if plan.warmup else 0) + plan.rounds
            first = PROMPT_SETS.take(self.handle.base_url, n_sets)
            sets = list(range(first, first + n_sets))
        made, self.prompt_kind, vocab = prepare_prompts(
            self.client, api=plan.api, model=self.handle.model, served_model=self.served_model,
            count=plan.num_requests, warmup=plan.warmup, input_len=plan.input_len, seed=plan.seed,
            tokenizer=plan.tokenizer, prompts=plan.prompts, sets=sets)
        self.vocab = vocab.describe() if vocab is not None else None
        bodies, lens = [], []
        for p in made:
            bodies.append(build_payload(plan.api, prompt=p, output_len=plan.output_len, model=self.served_model,
                                        ignore_eos=plan.ignore_eos, stream=True, extra=self.extra_body)[1])
            lens.append(len(p) if not isinstance(p, str) else plan.input_len)
        n, w = plan.num_requests, plan.warmup
        starts = [w + k * n if sets else w for k in range(plan.rounds)]
        return bodies[:w], [bodies[i:i + n] for i in starts], [lens[i:i + n] for i in starts]

    def measure(self, processes: int) -> tuple[list[StreamResult], list[BenchResult], RoundWitness, Telemetry]:
        plan, handle = self.plan, self.handle
        if self.tel is not None:
            self.tel.close()
        warm_bodies, round_bodies, round_lens = self.workload()
        wit = RoundWitness(self.client, enabled=plan.server_metrics)
        self.members.snaps.clear()
        marks = 0

        def between(results: list[StreamResult] | None) -> None:
            """The server's metrics after the warmup and each round; "flush": its cache emptied before the next
            round (after the scrape, outside the rounds' clocks)."""
            nonlocal marks
            wit.mark(results)
            if marks in (0, plan.rounds):  # a fleet's members: what each served over all the rounds
                self.members.mark()
            marks += 1
            if plan.cache == "flush" and marks <= plan.rounds:
                flush_prefix_cache(self.client, handle.kind)

        tel = self.tel = Telemetry(
            base_url=handle.base_url, api_key=handle.api_key, host=getattr(handle, "host", None),
            pid=getattr(handle, "pid", None), kind=handle.kind, ssh_host=getattr(handle, "ssh_host", None),
            remote=getattr(handle, "remote", None), enabled=plan.telemetry)
        common: dict[str, Any] = {"concurrency": plan.concurrency, "request_rate": plan.request_rate,
                                  "timeout": plan.timeout, "warmup_bodies": warm_bodies, "between": between,
                                  "telemetry": tel}
        if processes > 1:
            warm, done, lags = drive_spread(handle.base_url, handle.api_key, plan.api, round_bodies,
                                            processes=processes, seed=plan.seed, round_gap=ROUND_GAP_S,
                                            run=_run_coroutine, **common)
        else:
            probe = LoopLagProbe()
            warm, done = _run_coroutine(lambda: _drive(
                handle.base_url, handle.api_key, plan.api, round_bodies, rng=random.Random(plan.seed + 1),
                seed=plan.seed, probe=probe, **common))
            lags = probe.rounds
        per_round = [self.round_result(measured, round_lens[k], cpu, wall, lags[k] if k < len(lags) else None,
                                       processes)
                     for k, (measured, cpu, wall) in enumerate(done)]
        return warm, per_round, wit, tel

    def round_result(self, measured: list[StreamResult], lens: list[int], cpu: float, wall: float,
                     lag: LagStats | None, processes: int) -> BenchResult:
        """One round's result, made from its requests and the client's health; judged client-bound or not."""
        plan = self.plan
        busy = cpu / wall if wall > 0 else 0.0
        one = compute_metrics(
            [record_from_stream(s, n) for s, n in zip(measured, lens, strict=True)],
            api=plan.api, num_requests=plan.num_requests, max_concurrency=plan.concurrency,
            request_rate=plan.request_rate, input_len=plan.input_len, output_len=plan.output_len,
            warmup=plan.warmup, seed=plan.seed, prompt_kind=self.prompt_kind, prompt_vocab=self.vocab,
            profile=plan.profile, started_at=self.started_at, slo=dict(plan.slo) if plan.slo else None,
            cache=plan.cache, sweep=plan.sweep, client_processes=processes, client_cpu_seconds=cpu,
            client_busy=busy, client_loop_lag_p90_ms=lag.p90_ms if lag is not None else None,
            client_loop_lag_max_ms=lag.max_ms if lag is not None else None)
        reason = judge_client(busy, lag, one.median_tpot_ms, busy_limit=CLIENT_BOUND_BUSY)
        return one.with_figures(accept_length_source="requests" if one.accept_length is not None else None,
                       client_bound_reason=reason, client_bound=reason is not None)


def _raise_failures(result: BenchResult, warm: list[StreamResult], disagreements: list[str], handle: ServerLike,
                    plan: _Plan, *, allow_failures: bool) -> None:
    where = f"{handle.base_url}{API_PATHS[plan.api]}"
    warm_failures = [s for s in warm if not s.ok]
    if warm_failures and not allow_failures:
        s = warm_failures[0]
        raise BenchmarkFailedError(
            f"{len(warm_failures)} of {len(warm)} warmup requests to {where} failed; the first: "
            f"{'HTTP ' + str(s.status) if s.status else 'no HTTP status'}: {s.error}", result)
    if result.failed and not allow_failures:
        raise BenchmarkFailedError(
            f"benchmark against {where}: {failure_text(result)} "
            f"(output_throughput of the {result.completed} completed would be "
            f"{result.output_throughput:.1f} tok/s; pass allow_failures=True to get the result anyway)", result)
    if disagreements:
        raise BenchmarkFailedError(
            f"benchmark against {where}: the server's own count disagrees: "
            f"{'; '.join(disagreements)} (pass server_metrics=False where other clients load the "
            "server)", result)


def spare_processes() -> int:
    """How many load-generator processes this machine can give a run that one event loop cannot drive: half its
    cores (the other half for the server and the samplers), at most MAX_CLIENT_PROCESSES; 1 below 4 cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1 if cores < 4 else min(MAX_CLIENT_PROCESSES, cores // 2)


def _speculative(client: Client, handle: ServerLike) -> bool:
    """Whether an SGLang server runs speculative decoding (its /server_info's speculative_algorithm)."""
    if handle.kind == "vllm":
        return False
    info = client.server_info()
    return bool(info and info.get("speculative_algorithm"))


def _served_model(client: Client, handle: ServerLike) -> str | None:
    names = []
    try:
        names = client.models()
    except Exception:  # noqa: BLE001 - a server without /v1/models gets the profile's model name
        pass
    if handle.model and handle.model in names:
        return handle.model
    return names[0] if names else handle.model


def expected_throughput(*, num_requests: int, concurrency: int, output_len: int, ttft_s: float,
                        decode_tok_s: float) -> float:
    """Output tok/s of a server that paces each request exactly: first token after ``ttft_s``, then one
    token every ``1/decode_tok_s``; ``concurrency`` requests at a time, in waves."""
    per_request = ttft_s + (output_len - 1) / decode_tok_s
    waves = math.ceil(num_requests / concurrency)
    return num_requests * output_len / (waves * per_request)

