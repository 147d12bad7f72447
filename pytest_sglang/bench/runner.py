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
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import threading
import time
import warnings
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar, runtime_checkable

from pytest_sglang.bench.cache import (
    PROMPT_SETS,
    CachedRoundWarning,
    cached_round_note,
    flush_prefix_cache,
    resolve_cache_mode,
)
from pytest_sglang.bench.client import Client
from pytest_sglang.bench.members import MemberScrapes
from pytest_sglang.bench.metrics import (
    BenchResult,
    combine_rounds,
    compute_metrics,
    failure_text,
    record_from_stream,
)
from pytest_sglang.bench.payloads import API_PATHS, Api, build_payload
from pytest_sglang.bench.prompts import prepare_prompts
from pytest_sglang.bench.selfcheck import LoopLagProbe, judge_client
from pytest_sglang.bench.server_metrics import RoundWitness
from pytest_sglang.bench.slo import check_slo
from pytest_sglang.bench.spread import drive_spread
from pytest_sglang.bench.stream import ConnectionPool, StreamResult, stream_request, warm_up
from pytest_sglang.bench.telemetry import Telemetry
from pytest_sglang.errors import BenchmarkError, BenchmarkFailedError

T = TypeVar("T")

ROUND_GAP_S = 0.1  # pause between rounds: the server goes idle, one round's tail never overlaps the next
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


def _run_coroutine(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run, or, when this thread already runs an event loop (pytest-asyncio), in a worker thread."""
    try:
        asyncio.get_running_loop()
        in_a_loop = True
    except RuntimeError:
        in_a_loop = False
    if not in_a_loop:  # run outside the except: its errors are not "during handling of" that RuntimeError
        return asyncio.run(factory())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(factory())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="sglang-bench")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


async def _drive(
    base_url: str,
    api_key: str | None,
    api: Api,
    round_bodies: Sequence[Sequence[dict[str, Any]]],
    *,
    concurrency: int | None,
    request_rate: float,
    rng: random.Random,
    timeout: float | None,
    warmup_bodies: Sequence[dict[str, Any]] = (),
    seed: int = 0,
    between: Callable[[list[StreamResult] | None], None] | None = None,
    probe: LoopLagProbe | None = None,
    telemetry: Telemetry | None = None,
) -> tuple[list[StreamResult], list[tuple[list[StreamResult], float, float]]]:
    """Warmup once, then a round of each of ``round_bodies``: (warmup results, [(measured results, client CPU
    s, wall s)]).
    ``between`` is called after the warmup (with None) and after each round (with its results), outside the
    rounds' clocks: the server's metrics are scraped there (server_metrics.RoundWitness). ``telemetry``
    samples the GPUs and the server's gauges during each round, its samplers stopped however the round ends."""
    pool = ConnectionPool(base_url, api_key=api_key)
    done: list[tuple[list[StreamResult], float, float]] = []
    try:
        warm = await warm_up(pool, api, warmup_bodies, timeout)
        if between is not None:
            between(None)
        sem = asyncio.Semaphore(concurrency) if concurrency else None

        async def one(body: dict[str, Any]) -> StreamResult:
            if sem is None:
                return await stream_one(pool, api, body, timeout)
            async with sem:
                return await stream_one(pool, api, body, timeout)

        for k, bodies in enumerate(round_bodies):
            if k:
                await asyncio.sleep(ROUND_GAP_S)
            rng.seed(seed + 1)  # the same arrivals every round: only the system varies
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            if probe is not None:
                probe.start()  # the event loop's own lag over the round (selfcheck.py)
            if telemetry is not None:
                telemetry.round_started()
            try:
                tasks: list[asyncio.Task[StreamResult]] = []
                for i, body in enumerate(bodies):
                    if i and math.isfinite(request_rate) and request_rate > 0:
                        await asyncio.sleep(rng.expovariate(request_rate))
                    tasks.append(asyncio.ensure_future(one(body)))
                measured = list(await asyncio.gather(*tasks))
            finally:
                if telemetry is not None:
                    telemetry.round_ended()
            if probe is not None:
                await probe.stop()
            done.append((measured, time.thread_time() - cpu0, time.perf_counter() - wall0))
            if between is not None:
                between(measured)
    finally:
        await pool.close()
    return warm, done


async def stream_one(
    pool: ConnectionPool, api: Api, body: dict[str, Any], timeout: float | None
) -> StreamResult:
    return await stream_request(pool, api, body, timeout=timeout)


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
) -> BenchResult:
    """Benchmark ``server`` (a server handle, or a base URL) with streamed requests; see the package doc.

    ``concurrency`` caps requests in flight (None: no cap); ``request_rate`` is the Poisson arrival rate in
    requests/s (inf: all at once, bounded by ``concurrency``). ``warmup`` requests run first and are left
    out. ``rounds``: how many times the measured workload runs on the server (the figures are the rounds'
    medians; ``result.rounds`` has each). ``slo``: per-request limits in ms (``ttft_ms``, ``tpot_ms``,
    ``e2el_ms``) for ``goodput``. ``server_metrics``: scrape the server's ``/metrics`` around each round and
    fail the run where its token counts differ from the responses' (bench/server_metrics.py; False for a
    server that others load at the same time). ``telemetry``: sample the server's GPUs and its /metrics gauges
    during the rounds (bench/telemetry.py: energy per token and the rest; None where unmeasured, with why).
    ``client_processes``: how many processes send the load (bench/spread.py); None: one event loop, and where
    its rounds were client-bound on a machine with cores to spare, the run again over :func:`spare_processes`.
    ``tokenizer``: a tokenizer object or a name for
    ``transformers.AutoTokenizer`` (default: the server's model, when transformers is installed and has it
    locally); used only for text prompts. ``cache``: how the rounds meet the server's prefix cache (bench/cache.py):
    ``"fresh"`` (default) new prompts for the warmup and every round, ``"flush"`` (default with ``prompts=``) the
    same prompts with the cache flushed before each round, ``"warm"`` the same prompts, cached on purpose; each
    round's ``server_cache_hit_rate`` is the server's witness, and a round of "fresh" or "flush" that it says was
    mostly cached gets a ``cache_note`` and a :class:`~pytest_sglang.bench.cache.CachedRoundWarning`.
    ``api``: default "completions", and "generate" through a fleet's router (a server with ``members``):
    sglang-router parses OpenAI bodies itself and refuses token-id prompts with HTTP 422, where SGLang's own
    /generate takes ``input_ids`` through it unchanged (docs/fleet-real.md).
    Bad arguments raise BenchmarkError; failed requests raise BenchmarkFailedError with the result.
    """
    if api is None:
        api = "generate" if getattr(server, "members", None) else "completions"
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
    slo_ms = check_slo(slo) if slo is not None else None
    mode = resolve_cache_mode(cache, prompts_given=prompts is not None)
    handle: ServerLike = _Url(server.rstrip("/")) if isinstance(server, str) else server
    profile = profile if profile is not None else getattr(handle, "profile", None)
    client = Client(handle.base_url, api_key=handle.api_key, timeout=60, model=model or handle.model)
    tel: Telemetry | None = None
    members = MemberScrapes(handle)
    try:
        served_model = None
        if api != "generate":
            served_model = model or _served_model(client, handle)
        spec_info = _speculative(client, handle)
        if spec_info and api != "generate":  # SGLang's per-request verify counts on its OpenAI APIs
            extra_body = {"return_spec_tokens_details": True, **(extra_body or {})}
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        prompt_kind, vocab = "token_ids", None

        def workload() -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[list[int]]]:
            """The warmup bodies, each round's and each round's prompt lengths: "fresh" draws sets this server
            has not been sent (cache.PROMPT_SETS), the other modes send the same prompts every round."""
            nonlocal prompt_kind, vocab
            sets = None
            if mode == "fresh":
                n_sets = (1 if warmup else 0) + rounds
                first = PROMPT_SETS.take(handle.base_url, n_sets)
                sets = list(range(first, first + n_sets))
            made, prompt_kind, vocab = prepare_prompts(
                client, api=api, model=handle.model, served_model=served_model, count=num_requests, warmup=warmup,
                input_len=input_len, seed=seed, tokenizer=tokenizer, prompts=prompts, sets=sets)
            bodies, lens = [], []
            for p in made:
                bodies.append(build_payload(api, prompt=p, output_len=output_len, model=served_model,
                                            ignore_eos=ignore_eos, stream=True, extra=extra_body)[1])
                lens.append(len(p) if not isinstance(p, str) else input_len)
            starts = [warmup + k * num_requests if sets else warmup for k in range(rounds)]
            return (bodies[:warmup], [bodies[i:i + num_requests] for i in starts],
                    [lens[i:i + num_requests] for i in starts])

        def measure(processes: int) -> tuple[list[StreamResult], list[BenchResult], RoundWitness, Telemetry]:
            nonlocal tel
            if tel is not None:
                tel.close()
            warm_bodies, round_bodies, round_lens = workload()
            wit = RoundWitness(client, enabled=server_metrics)
            members.snaps.clear()
            marks = 0

            def between(results: list[StreamResult] | None) -> None:
                """The server's metrics after the warmup and each round; "flush": its cache emptied before the
                next round (after the scrape, outside the rounds' clocks)."""
                nonlocal marks
                wit.mark(results)
                if marks in (0, rounds):  # a fleet's members: what each served over all the rounds
                    members.mark()
                marks += 1
                if mode == "flush" and marks <= rounds:
                    flush_prefix_cache(client, handle.kind)

            tel = Telemetry(base_url=handle.base_url, api_key=handle.api_key, host=getattr(handle, "host", None),
                            pid=getattr(handle, "pid", None), kind=handle.kind,
                            ssh_host=getattr(handle, "ssh_host", None), remote=getattr(handle, "remote", None),
                            enabled=telemetry)
            if processes > 1:
                warm, done, lags = drive_spread(
                    handle.base_url, handle.api_key, api, round_bodies, processes=processes,
                    concurrency=concurrency, request_rate=request_rate, seed=seed, timeout=timeout,
                    warmup_bodies=warm_bodies, round_gap=ROUND_GAP_S, between=between, telemetry=tel,
                    run=_run_coroutine)
            else:
                probe = LoopLagProbe()
                warm, done = _run_coroutine(lambda: _drive(
                    handle.base_url, handle.api_key, api, round_bodies, concurrency=concurrency,
                    request_rate=request_rate, rng=random.Random(seed + 1), timeout=timeout,
                    warmup_bodies=warm_bodies, seed=seed, between=between, probe=probe, telemetry=tel))
                lags = probe.rounds
            per_round = []
            for k, (measured, cpu, wall) in enumerate(done):
                one = compute_metrics(
                    [record_from_stream(s, n) for s, n in zip(measured, round_lens[k], strict=True)],
                    api=api, num_requests=num_requests, max_concurrency=concurrency, request_rate=request_rate,
                    input_len=input_len, output_len=output_len, warmup=warmup, seed=seed,
                    prompt_kind=prompt_kind, profile=profile, started_at=started_at,
                    slo=dict(slo_ms) if slo_ms else None,
                )
                one.prompt_vocab = vocab.describe() if vocab is not None else None
                one.accept_length_source = "requests" if one.accept_length is not None else None
                one.client_processes = processes
                one.client_cpu_seconds = cpu
                one.client_busy = cpu / wall if wall > 0 else 0.0
                lag = lags[k] if k < len(lags) else None
                if lag is not None:
                    one.client_loop_lag_p90_ms, one.client_loop_lag_max_ms = lag.p90_ms, lag.max_ms
                one.client_bound_reason = judge_client(one.client_busy, lag, one.median_tpot_ms,
                                                       busy_limit=CLIENT_BOUND_BUSY)
                one.client_bound = one.client_bound_reason is not None
                per_round.append(one)
            return warm, per_round, wit, tel

        processes = client_processes or 1
        warm, per_round, wit, tel = measure(processes)
        spare = spare_processes()
        if client_processes is None and spare > 1 and any(one.client_bound for one in per_round):
            warm, per_round, wit, tel = measure(spare)  # one loop could not keep pace: the figures were its own
        disagreements = wit.apply(per_round)
        for k, one in enumerate(per_round):
            one.cache = mode
            one.cache_note = cached_round_note(mode, one.server_cache_hit_rate, round_index=k, rounds=rounds)
        tel.apply(per_round)
        if spec_info and any(one.accept_length is None for one in per_round):
            server_accept = client.accept_length()  # the last resort: updated only every decode-log interval
            for one in per_round:
                if one.accept_length is None and server_accept is not None:
                    one.accept_length, one.accept_length_source = server_accept, "server_info"
        result = combine_rounds(per_round)
        result.members = members.loads()
        for one in per_round:
            if one.cache_note:
                warnings.warn(CachedRoundWarning(f"{handle.base_url}: {one.cache_note}"), stacklevel=2)
        result.telemetry = tel.series(per_round)
        result.server_disagreement = disagreements[0] if disagreements else None
        result.connection_errors += sum(1 for s in warm if s.connection_error)
        warm_failures = [s for s in warm if not s.ok]
        if warm_failures and not allow_failures:
            s = warm_failures[0]
            raise BenchmarkFailedError(
                f"{len(warm_failures)} of {len(warm)} warmup requests to {handle.base_url}{API_PATHS[api]} "
                f"failed; the first: {'HTTP ' + str(s.status) if s.status else 'no HTTP status'}: {s.error}",
                result)
        if result.failed and not allow_failures:
            raise BenchmarkFailedError(
                f"benchmark against {handle.base_url}{API_PATHS[api]}: {failure_text(result)} "
                f"(output_throughput of the {result.completed} completed would be "
                f"{result.output_throughput:.1f} tok/s; pass allow_failures=True to get the result anyway)",
                result)
        if disagreements:
            raise BenchmarkFailedError(
                f"benchmark against {handle.base_url}{API_PATHS[api]}: the server's own count disagrees: "
                f"{'; '.join(disagreements)} (pass server_metrics=False where other clients load the server)",
                result)
        return result
    finally:
        if tel is not None:
            tel.close()
        client.close()


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

