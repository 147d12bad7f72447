"""Readiness: the only loop that decides whether a server is ready, failing, or out of time.

Every origin waits here, on the checks it composed (server/readiness/compose.py): the loop knows no origin,
only the order of its checks, so what an origin does not compose it cannot half-judge. It returns the startup
record; a failed or interrupted wait reports its record too, before the error goes on. Its clock and sleep
are injected so a test can step a startup through minutes of a fake log in no time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from pytest_sglang.errors import ServerStartupError
from pytest_sglang.server.readiness.check import (
    CRASH_SETTLE_SECONDS,
    POLL_SECONDS,
    PROBE_EVERY_SECONDS,
    USAGE_EXIT_WAIT_SECONDS,
    Clock,
    Failed,
    NotYet,
    ReadinessCheck,
    Ready,
    Server,
    Subject,
)
from pytest_sglang.server.readiness.compose import Startup, members_startup, probe_startup, server_startup
from pytest_sglang.server.readiness.peers import Peer
from pytest_sglang.server.readiness.probe import RETRYABLE_4XX, HealthCheck, Probe, health_probe
from pytest_sglang.server.readiness.tree import NodeEnd
from pytest_sglang.server.record import StartupRecord

STATUS_EVERY_SECONDS = 30.0

StatusCallback = Callable[[str], None]
RecordCallback = Callable[[StartupRecord], None]
Sleep = Callable[[float], None]

__all__ = [
    "CRASH_SETTLE_SECONDS", "POLL_SECONDS", "PROBE_EVERY_SECONDS", "RETRYABLE_4XX", "STATUS_EVERY_SECONDS",
    "USAGE_EXIT_WAIT_SECONDS", "Clock", "Failed", "HealthCheck", "NodeEnd", "NotYet", "Peer", "Probe", "Ready",
    "ReadinessCheck", "RecordCallback", "Server", "Sleep", "Startup", "StatusCallback", "Subject", "health_probe",
    "ignore", "members_startup", "probe_startup", "server_startup", "wait_for",
]


def ignore(_: object) -> None:
    """The callback of a caller that wants no status lines or records (benchmarks, scripts)."""


def wait_for(startup: Startup, *, on_status: StatusCallback, on_record: RecordCallback,
             clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> StartupRecord:
    """Wait until ready and return the record; every outcome is handed to ``on_record`` exactly once.
    ``clock`` and ``sleep``: what the loop reads the time from and waits with (a test steps a fake pair)."""
    startup.progress.begin()
    try:
        seconds = _until_ready(startup, on_status, clock, sleep)
    except ServerStartupError as exc:
        # the log that tells: the failing node's or member's own, where the error names one
        named = {"log_path": exc.log_path} if exc.log_path is not None else {}
        cause = f"{exc.member}: {exc.cause}" if exc.member and exc.cause else exc.cause
        on_record(_record(startup, "failed", clock(), error=str(exc), cause=cause, **named))
        raise
    except BaseException:  # Ctrl-C, or pytest-timeout cutting the wait
        on_record(_record(startup, "interrupted", clock()))
        raise
    finally:
        startup.progress.end()
    record = _record(startup, "ready", startup.started_at + seconds, **startup.progress.ready(seconds))
    on_record(record)
    return record


def _record(startup: Startup, outcome: str, now: float, **facts: object) -> StartupRecord:
    updates: dict[str, object] = {"outcome": outcome, "elapsed": now - startup.started_at,
                                  **startup.progress.facts(), **facts}
    return replace(startup.subject.template, **updates)  # type: ignore[arg-type]


def _until_ready(startup: Startup, on_status: StatusCallback, clock: Clock, sleep: Sleep) -> float:
    """Seconds from the start to ready: every check ready in one poll. Failure: the first check, in the order
    composed, that sees one."""
    last_status, last_label = startup.started_at, None
    prefix = f"[sglang {startup.subject.profile}]"
    while True:
        now = clock()
        startup.progress.poll(now)
        for check in startup.checks:
            failed = check.failed(now, clock)
            if failed is not None:
                raise failed.error
        seconds = _ready(startup, now, clock)
        if seconds is not None:
            return seconds
        label = startup.progress.status(now)
        if label is not None and (label[0] != last_label or now - last_status >= STATUS_EVERY_SECONDS):
            on_status(f"{prefix} {now - startup.started_at:.0f} s  {label[1]}")
            last_status, last_label = now, label[0]
        sleep(POLL_SECONDS)


def _ready(startup: Startup, now: float, clock: Clock) -> float | None:
    """Seconds to ready where every check is, in order (none is asked after the first that is not yet); the
    moment is the last one a check knows (the probe's answer after the ready line), else this poll's."""
    at = None
    for check in startup.checks:
        observed = check.ready(now, clock)
        if isinstance(observed, NotYet):
            return None
        at = observed.at if observed.at is not None else at
    return (at if at is not None else now) - startup.started_at
