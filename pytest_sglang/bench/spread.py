"""The load generator spread over processes, for a server faster than one event loop can read.

One Python event loop parses a few tens of thousands of stream events a second; a GPU server at concurrency
256 sends more. :func:`drive_spread` runs each measured round over ``processes`` worker processes (spawned
once per run, each with its own event loop and connection pool) and merges their requests' results back in
the order the requests were made. What a single loop guarantees is kept across them:

* concurrency: the cap's slots are dealt out (process i holds ``C // N`` of them, the first ``C % N`` one more),
  so ``C`` are in flight while every process has work; requests are dealt to the slots in turn, so each
  process's share of the requests is its share of the slots (the last wave's within one request);
* arrivals: the Poisson arrival times are drawn once, in the parent, from the same seeded generator (the same
  arrivals every round), as offsets from one start time that every worker waits for: ``time.perf_counter`` is
  the system's monotonic clock, the same in every process of the machine, so the merged arrival process is the
  single loop's and every timestamp is comparable.

Each worker measures its own loop (``client_busy``: its CPU time over its wall time; its wake-up lag,
selfcheck.py); the round is as client-bound as its busiest worker. The warmup runs in the parent. A worker
exits when the parent's end of its socket closes, so none outlives a parent that dies.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pytest_sglang.bench.payloads import Api
from pytest_sglang.bench.selfcheck import LagStats, LoopLagProbe
from pytest_sglang.bench.stream import ConnectionPool, StreamResult, stream_request, warm_up

START_MARGIN_S = 0.02  # from the last worker's "ready" to the round's start
JOIN_S = 5.0
WORKER_CODE = "import sys; from pytest_sglang.bench.spread import worker_main; worker_main(int(sys.argv[1]))"


@dataclass
class Share:
    """One worker's part of a round: which requests (their indices), their bodies, arrival offsets (None: all at
    once), its slots of the concurrency cap (None: no cap)."""

    indices: list[int]
    bodies: list[dict[str, Any]]
    offsets: list[float] | None
    slots: int | None


@dataclass
class WorkerRound:
    results: list[StreamResult]
    cpu_seconds: float
    wall_seconds: float
    lag: LagStats | None


def deal(count: int, processes: int, concurrency: int | None) -> list[tuple[list[int], int | None]]:
    """Request indices and slots per worker: the cap's slots dealt out in turn, the requests to the slots in turn."""
    if concurrency is None:
        return [(list(range(i, count, processes)), None) for i in range(processes)]
    used = min(processes, concurrency)
    slots = [concurrency // used + (1 if i < concurrency % used else 0) for i in range(used)]
    owner = [k % used for k in range(concurrency)]  # slot k's process: the slots interleaved, so the tail is too
    indices: list[list[int]] = [[] for _ in range(used)]
    for j in range(count):
        indices[owner[j % concurrency]].append(j)
    return [(ix, slots[i]) for i, ix in enumerate(indices)]


def arrival_offsets(count: int, request_rate: float, rng: random.Random) -> list[float] | None:
    """Seconds from the round's start at which each request is sent: a Poisson process (None: all at once)."""
    if not (math.isfinite(request_rate) and request_rate > 0):
        return None
    offsets, t = [0.0], 0.0
    for _ in range(count - 1):
        t += rng.expovariate(request_rate)
        offsets.append(t)
    return offsets


async def _share_round(pool: ConnectionPool, api: Api, share: Share, start_at: float, timeout: float | None
                       ) -> WorkerRound:
    sem = asyncio.Semaphore(share.slots) if share.slots else None

    async def one(body: dict[str, Any]) -> StreamResult:
        if sem is None:
            return await stream_request(pool, api, body, timeout=timeout)
        async with sem:
            return await stream_request(pool, api, body, timeout=timeout)

    await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
    probe = LoopLagProbe()
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    probe.start()
    try:
        tasks = []
        for k, body in enumerate(share.bodies):
            if share.offsets is not None:
                await asyncio.sleep(max(0.0, start_at + share.offsets[k] - time.perf_counter()))
            tasks.append(asyncio.ensure_future(one(body)))
        results = list(await asyncio.gather(*tasks))
    finally:
        await probe.stop()
    return WorkerRound(results, time.thread_time() - cpu0, time.perf_counter() - wall0,
                       probe.rounds[-1] if probe.rounds else None)


def worker_main(fd: int) -> None:
    """A worker process's entry point (WORKER_CODE): the socket it was handed is its connection to the parent."""
    _worker(Connection(fd))


def _worker(conn: Connection) -> None:
    """A worker's life: its settings in, then per round a share in, "ready", a start time in, the results out;
    until the parent's end closes."""
    try:
        base_url, api_key, api, timeout = conn.recv()
    except (EOFError, OSError):
        return
    loop = asyncio.new_event_loop()
    pool = ConnectionPool(base_url, api_key=api_key)
    try:
        while True:
            share = conn.recv()
            if share is None:
                return
            conn.send("ready")
            start_at = conn.recv()
            conn.send(loop.run_until_complete(_share_round(pool, api, share, start_at, timeout)))
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the parent is gone: so is the work
    finally:
        loop.run_until_complete(pool.close())
        loop.close()


class WorkerPool:
    """``processes`` workers for one benchmark run; :meth:`close` ends them (SIGKILL after JOIN_S).

    Each is ``python -c WORKER_CODE FD``, talking over a socket pair: not multiprocessing's spawn,
    which would run the caller's main script again in every worker (a script without a ``__main__`` guard would
    benchmark itself recursively). The API key travels over the socket, never on a command line."""

    def __init__(self, processes: int, base_url: str, api_key: str | None, api: Api, timeout: float | None) -> None:
        self._conns: list[Connection] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH"))
                                                          if p))
        try:
            for _ in range(processes):
                ours, theirs = socket.socketpair()
                with theirs:
                    proc = subprocess.Popen([sys.executable, "-c", WORKER_CODE, str(theirs.fileno())],
                                            pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
                self._procs.append(proc)
                conn = Connection(ours.detach())
                self._conns.append(conn)
                conn.send((base_url, api_key, api, timeout))
        except BaseException:
            self.close()
            raise

    def run(self, shares: Sequence[Share]) -> list[WorkerRound]:
        """One round: every share sent, every worker ready, one start time for all, their results back."""
        conns = self._conns[:len(shares)]
        for conn, share in zip(conns, shares, strict=True):
            conn.send(share)
        for conn in conns:
            if conn.recv() != "ready":
                raise RuntimeError("a load-generator worker answered out of turn")
        start_at = time.perf_counter() + START_MARGIN_S
        for conn in conns:
            conn.send(start_at)
        return [conn.recv() for conn in conns]

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
            conn.close()
        for proc in self._procs:
            try:
                proc.wait(JOIN_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def drive_spread(base_url: str, api_key: str | None, api: Api, round_bodies: Sequence[Sequence[dict[str, Any]]], *,
                 processes: int, concurrency: int | None, request_rate: float, seed: int, timeout: float | None,
                 warmup_bodies: Sequence[dict[str, Any]], round_gap: float,
                 between: Callable[[list[StreamResult] | None], None] | None = None, telemetry: Any = None,
                 run: Callable[..., Any]) -> tuple[list[StreamResult], list[tuple[list[StreamResult], float, float]],
                                                   list[LagStats]]:
    """The runner's ``_drive`` over ``processes`` workers, a round for each of ``round_bodies`` (each the same
    number of requests): (warmup results, [(results, client CPU s of the busiest worker, its wall s)], the
    busiest worker's lag per round). ``run`` runs a coroutine to its end."""

    async def warm() -> list[StreamResult]:
        pool = ConnectionPool(base_url, api_key=api_key)
        try:
            return await warm_up(pool, api, warmup_bodies, timeout)
        finally:
            await pool.close()

    count = len(round_bodies[0]) if round_bodies else 0
    dealt = [(ix, slots) for ix, slots in deal(count, processes, concurrency) if ix]
    workers = WorkerPool(len(dealt), base_url, api_key, api, timeout)  # no worker without a request
    try:
        warm_results: list[StreamResult] = run(warm)
        if between is not None:
            between(None)
        done, lags = [], []
        for k, bodies in enumerate(round_bodies):
            if k:
                time.sleep(round_gap)
            offsets = arrival_offsets(len(bodies), request_rate, random.Random(seed + 1))
            shares = [Share(ix, [bodies[j] for j in ix], [offsets[j] for j in ix] if offsets else None, slots)
                      for ix, slots in dealt]
            if telemetry is not None:
                telemetry.round_started()
            try:
                parts = workers.run(shares)
            finally:
                if telemetry is not None:
                    telemetry.round_ended()
            merged: list[StreamResult | None] = [None] * len(bodies)
            for share, part in zip(shares, parts, strict=True):
                for j, result in zip(share.indices, part.results, strict=True):
                    merged[j] = result
            measured = [m for m in merged if m is not None]
            busiest = max(parts, key=lambda p: p.cpu_seconds / p.wall_seconds if p.wall_seconds > 0 else 0.0)
            done.append((measured, busiest.cpu_seconds, busiest.wall_seconds))
            late = [p.lag for p in parts if p.lag is not None]
            if late:
                lags.append(max(late, key=lambda lag: lag.p90_ms))
            if between is not None:
                between(measured)
        return warm_results, done, lags
    finally:
        workers.close()
