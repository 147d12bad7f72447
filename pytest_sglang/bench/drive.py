"""The event loop's side of a run: the warmup and each round's requests, streamed on one loop (runner.py plans
the run and makes its result; spread.py drives the same over several processes)."""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from pytest_sglang.bench.payloads import Api
from pytest_sglang.bench.selfcheck import LoopLagProbe
from pytest_sglang.bench.stream import ConnectionPool, StreamResult, stream_request, warm_up
from pytest_sglang.bench.telemetry import Telemetry

T = TypeVar("T")

ROUND_GAP_S = 0.1  # pause between rounds: the server goes idle, one round's tail never overlaps the next


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
            try:
                measured = await _arrivals(bodies, one, rng, request_rate, telemetry)
            finally:
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


async def _arrivals(bodies: Sequence[dict[str, Any]], one: Callable[[dict[str, Any]], Awaitable[StreamResult]],
                    rng: random.Random, request_rate: float, telemetry: Telemetry | None) -> list[StreamResult]:
    """One round's requests, spaced as a Poisson process, with the telemetry sampling while it runs."""
    if telemetry is not None:
        telemetry.round_started()
    try:
        tasks: list[asyncio.Task[StreamResult]] = []
        for i, body in enumerate(bodies):
            if i and math.isfinite(request_rate) and request_rate > 0:
                await asyncio.sleep(rng.expovariate(request_rate))
            tasks.append(asyncio.ensure_future(one(body)))
        return list(await asyncio.gather(*tasks))
    finally:
        if telemetry is not None:
            telemetry.round_ended()
