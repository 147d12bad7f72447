"""The load generator's self-check (issue 9 point 4): is the client the bottleneck of this round?

Two witnesses of the client's own state, measured during each round:

* ``client_busy``: the CPU time of the event-loop thread over the round's wall time (runner.py): a loop busy
  most of the round has no time left to read the server's answers when they arrive;
* the event loop's lag (:class:`LoopLagProbe`): a task that asks to wake every :data:`PROBE_INTERVAL_S` and
  records how late it wakes (p90 and max over the round). Every stream event is stamped when the loop gets
  to it, so a late loop stamps late: TTFT and ITL then carry the client's own delay. A loop starved of CPU
  (the server's processes on the same cores) lags without being busy itself, which the CPU share misses.

:func:`judge_client` marks a round ``client_bound`` with the reason: busy at least the runner's
``CLIENT_BOUND_BUSY``, or a p90 lag above :data:`LAG_LIMIT_MS` and above :data:`LAG_SHARE` of the median time
per output token (a delay that size moves the figures the run is about). The p90, not the p99: a shared
machine's scheduler hiccups reach the p99 of a client that keeps up (4 to 17 ms against real SGLang on the
2-core CI machine), while a saturated loop is late most of the time. A client-bound result's figures are a
lower bound of what the server can do: a baseline check does not judge them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

PROBE_INTERVAL_S = 0.005
LAG_LIMIT_MS = 20.0  # p90 wake-up lag in ms below which the loop is never called late
LAG_SHARE = 0.5  # ... and the share of the median TPOT it must also pass


@dataclass
class LagStats:
    samples: int
    p90_ms: float
    max_ms: float


@dataclass
class LoopLagProbe:
    """Started at each round's start and stopped at its end, on the event loop that drives the requests."""

    rounds: list[LagStats] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _lags: list[float] = field(default_factory=list)

    def start(self) -> None:
        self._lags = []
        self._task = asyncio.ensure_future(self._sample())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # wait, not `await task`: a CancelledError caught here could be the caller's own, and swallowing it
        # would keep running a round that was cancelled
        await asyncio.wait([task])
        self.rounds.append(lag_stats(self._lags))

    async def _sample(self) -> None:
        while True:
            due = time.perf_counter() + PROBE_INTERVAL_S
            await asyncio.sleep(PROBE_INTERVAL_S)
            self._lags.append(max(0.0, time.perf_counter() - due))


def lag_stats(lags: list[float]) -> LagStats:
    if not lags:
        return LagStats(0, 0.0, 0.0)
    ordered = sorted(lags)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return LagStats(len(lags), p90 * 1000.0, ordered[-1] * 1000.0)


def judge_client(busy: float | None, lag: LagStats | None, median_tpot_ms: float, *, busy_limit: float
                 ) -> str | None:
    """Why this round measured the client rather than the server; None when the client kept up."""
    if busy is not None and busy >= busy_limit:
        return (f"client-bound: the load generator's event loop was on the CPU {busy:.0%} of the round "
                f"(limit {busy_limit:.0%}): the figures are a lower bound")
    if lag is not None and lag.p90_ms > LAG_LIMIT_MS and lag.p90_ms > LAG_SHARE * median_tpot_ms:
        return (f"client-bound: the load generator's event loop woke {lag.p90_ms:.1f} ms late (p90; max "
                f"{lag.max_ms:.1f} ms), over {LAG_SHARE:.0%} of the median time per output token "
                f"({median_tpot_ms:.1f} ms): its timestamps carry its own delay, the figures are a lower bound")
    return None
