"""The HTTP probe: what a ready server answers, asked during startup and, once ready, by its liveness.

A probe remembers what it got and since when, so a timeout or a stall can say "GET /health answered 404 for
12 s" rather than only "not ready"; and it tells a refusal (a 4xx that waiting will not change) from a server
still starting, so a wrong health_path fails at the stall timeout, not at the hard cap.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import requests

from pytest_sglang.server.readiness.check import (
    NOT_YET,
    PROBE_EVERY_SECONDS,
    Check,
    Clock,
    Failed,
    NotYet,
    Ready,
    Subject,
)

if TYPE_CHECKING:
    from pytest_sglang.launch.plan import LaunchPlan


class HealthCheck(Protocol):
    """What the loop and a liveness check ask of a probe: :class:`Probe` over HTTP, or a test's own."""

    last: str | None  # what it got last, for an error message

    @property
    def path(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def paths(self) -> tuple[str, ...]: ...

    def ok(self, timeout: float = 2.0) -> bool: ...

    def describe(self, now: float) -> str | None: ...

    def refusing_for(self, now: float) -> float | None: ...

    @property
    def last_status(self) -> int | None: ...


RETRYABLE_4XX = (408, 425, 429)  # timeout, too early, too many requests: a server still starting may say these


class Probe:
    """An HTTP GET that must answer 200; remembers what it got last, for the error message.

    Given several paths, a 404 or 401 from one moves on to the next (a server version without that endpoint,
    a key the plugin does not know); the last path is kept whatever it answers."""

    def __init__(self, base_url: str, paths: str | Sequence[str], headers: dict[str, str],
                 clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._base = base_url.rstrip("/")
        self._paths = [paths] if isinstance(paths, str) else list(paths)
        self.headers = headers
        self.last: str | None = None  # "HTTP 404", "connection refused", ...
        self.last_status: int | None = None
        self._same_since: float | None = None  # when it first got the answer it got last

    @property
    def path(self) -> str:
        return self._paths[0]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self._paths)

    def describe(self, now: float) -> str | None:
        """What the probe has been getting: "GET /healthz answered 404 for 12 s"; None before its first ask."""
        if self.last is None or self._same_since is None:
            return None
        got = f"answered {self.last_status}" if self.last_status is not None else f"got {self.last}"
        return f"GET {self.path} {got} for {now - self._same_since:.0f} s"

    def refusing_for(self, now: float) -> float | None:
        """How long the probe has got the same client error (a 4xx that waiting does not change: a wrong path,
        a missing key), or None: a server answering that is up, so no startup log line will mend it."""
        status = self.last_status
        if status is None or not 400 <= status < 500 or status in RETRYABLE_4XX or self._same_since is None:
            return None
        return now - self._same_since

    @property
    def url(self) -> str:
        return self._base + "/" + self.path.lstrip("/")

    def ok(self, timeout: float = 2.0) -> bool:
        try:
            # A connection per ask: a kept-alive one outlives the probe (nothing owns its end), and through an
            # ssh forward it held the tunnel's teardown open on a server already gone.
            response = requests.get(self.url, headers=self.headers, timeout=timeout)
        except requests.ConnectionError:
            self._got("connection refused", None)
            return False
        except requests.RequestException as exc:
            self._got(f"{type(exc).__name__}", None)
            return False
        if response.status_code in (401, 404) and len(self._paths) > 1:
            self._got(f"HTTP {response.status_code}", response.status_code)
            self._paths.pop(0)
            return self.ok(timeout)
        return self._judge(response)

    def _judge(self, response: requests.Response) -> bool:
        """Whether this answer of the current path means up, noted as what the probe got last (a probe that asks
        more of the answer than its status says so here)."""
        self._got(f"HTTP {response.status_code}", response.status_code)
        return response.status_code == 200

    def _got(self, answer: str, status: int | None) -> None:
        if answer != self.last or self._same_since is None:
            self._same_since = self._clock()
        self.last, self.last_status = answer, status


def health_probe(plan: LaunchPlan, base_url: str) -> Probe | None:
    """A ready server's liveness probe: GET of the plan's health path at ``base_url`` (None where it has none)."""
    return Probe(base_url, plan.health_path, plan.headers) if plan.health_path else None


@dataclass(eq=False)
class HttpReady(Check):
    """The probe answers 200: the last step of readiness. After a ready line it is asked on every poll (the
    line says the server is up); without one, at its own pace. The same client error for ``refuse_after``
    (the stall timeout) while the server runs fails the startup: the server is up and says no."""

    subject: Subject
    probe: HealthCheck
    after_line: bool = False
    refuse_after: float | None = None  # None: no stall timeout, so the hard cap alone ends a refusal
    last_ask: float = field(default=-PROBE_EVERY_SECONDS, init=False)

    def failed(self, now: float, clock: Clock) -> Failed | None:
        probe, stall = self.probe, self.refuse_after
        refusing = probe.refusing_for(now)
        if refusing is None or stall is None or refusing < stall:
            return None
        return Failed(self.subject.error(
            f"GET {probe.path} answered {probe.last_status} for {refusing:.0f} s while the server ran: is "
            f"health_path right? (stall_timeout {stall:g} s)", now, diagnosis=self.subject.diagnosis(None),
            hints=[f"set the profile's health_path to a path that answers 200 once the server is ready (it "
                   f"answered {probe.url} with {probe.last_status})",
                   "a 401 or 403: give the profile's api_key (or the server's key in its env)"]))

    def ready(self, now: float, clock: Clock) -> Ready | NotYet:
        if self.after_line or now - self.last_ask >= PROBE_EVERY_SECONDS:
            self.last_ask = now
            if self.probe.ok():
                return Ready(at=clock())
        return NOT_YET
