"""The server handle that tests get: the startup record plus a liveness strategy for where the server came from.

A handle never has a field that is None because of its origin: what differs between a server this run
launched, one attached to with --sglang-url and one kept from an earlier run is the strategy that says
whether it is still alive and what closing it means.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pytest_sglang.errors import Diagnosis, ServerDiedError, auth_headers
from pytest_sglang.launch.members import died_first, essential_death, pid_alive
from pytest_sglang.launch.plan import base_url
from pytest_sglang.launch.process import ProcessTree
from pytest_sglang.launch.release import stop_and_release
from pytest_sglang.launch.remote import RemoteServer
from pytest_sglang.server.ready import Probe
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.watch import LogWatcher

if TYPE_CHECKING:
    from pytest_sglang.machine.facts import Machine

DYING_WAIT_SECONDS = 10.0  # after a crash is logged mid-session, how long a still-answering server may take to die
FAILURE_GRACE_SECONDS = 0.5  # a server that failed gets little politeness: the error must not wait


class Liveness(Protocol):
    """How a handle knows its server is alive, and what closing it means, for one origin."""

    def death(self) -> ServerDiedError | None:
        """The server's death as an error, if it has died (or stopped answering) by now."""

    def logged_crash(self) -> bool:
        """Whether the server logged a crash it has not been seen to survive (it may be dying)."""

    def survived(self) -> None:
        """The logged crash did not kill the server within DYING_WAIT_SECONDS: take it as survived."""

    def close(self) -> None:
        """Release the server at the end of the session (stop it, or leave it to its owner)."""


@runtime_checkable
class Elsewhere(Protocol):
    """A liveness whose server runs on another machine (an ssh host): that machine's baseline fingerprint."""

    def machine(self, server: str | None) -> Machine: ...


@dataclass(eq=False)
class ServerHandle:
    """The ``sglang_server`` fixture's value: a ready server of any kind (sglang, vllm, generic)."""

    record: StartupRecord
    liveness: Liveness = field(repr=False)
    api_key: str | None = field(default=None, repr=False)
    # A fleet's members by name (router, worker0.., prefill0.., decode0..), each a handle of its own; {}: one server
    members: Mapping[str, ServerHandle] = field(default_factory=dict, repr=False)
    _death: ServerDiedError | None = field(default=None, repr=False)

    profile = property(lambda self: self.record.profile)
    kind = property(lambda self: self.record.kind)
    origin = property(lambda self: self.record.origin)
    host = property(lambda self: self.record.host)
    port = property(lambda self: self.record.port)
    model = property(lambda self: self.record.model)
    log_path = property(lambda self: self.record.log_path)
    pid = property(lambda self: self.record.pid)

    @property
    def startup_seconds(self) -> float | None:
        """Launch to ready; None for a server this run did not start (--sglang-url)."""
        return self.record.startup_seconds

    @property
    def phases(self) -> dict[str, float]:
        return dict(self.record.phases)

    @property
    def base_url(self) -> str:
        return base_url(self.host, self.port)

    def url(self, path: str = "/") -> str:
        return self.base_url + "/" + path.lstrip("/")

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)

    def check_alive(self, wait: float = 0.0) -> None:
        """Raise ServerDiedError (with the log's root cause) if the server has died; `wait` lets a dying
        server finish dying, so a failed request is reported as the crash that caused it.

        A server that has logged a crash since it was ready gets up to DYING_WAIT_SECONDS to exit or stop
        answering (vLLM's API server answers 500 for a moment after its engine died); if it is still healthy
        then, that crash is taken as survived and costs no further wait."""
        if self._death is not None:
            raise self._death
        if self.liveness.logged_crash():
            wait = max(wait, DYING_WAIT_SECONDS)
        deadline = time.monotonic() + wait
        while True:
            self._death = self.liveness.death()
            if self._death is not None:
                raise self._death
            if time.monotonic() >= deadline:
                self.liveness.survived()
                return
            time.sleep(0.1)

    @property
    def death_told(self) -> bool:
        """A check has already raised this server's death (a test failed with it)."""
        return self._death is not None

    def has_logged_crash(self) -> bool:
        return self.liveness.logged_crash()

    def close(self) -> None:
        self.liveness.close()

    def machine(self, server: str | None) -> Machine | None:
        """The fingerprint of the machine the server runs on where that is not this one; None: this one."""
        return self.liveness.machine(server) if isinstance(self.liveness, Elsewhere) else None

    @property
    def ssh_host(self) -> str | None:
        """The ssh host the server runs on (its URL may still be this machine's, through ``ssh -L``); None: here."""
        if not isinstance(self.liveness, Elsewhere):
            return None
        return str(getattr(getattr(self.liveness, "process", None), "host", None) or "an ssh host")

    @property
    def remote(self) -> RemoteServer | None:
        """The server's tree on its ssh host (its agent reads the GPUs there for the telemetry); None: not one."""
        process = getattr(self.liveness, "process", None)
        return process if isinstance(process, RemoteServer) else None


@dataclass(eq=False)
class LoggedCrashes:
    """The crashes a server's log shows, less the one it was last seen to survive (a request error the server
    logged and lived through must not make every later test wait for a death)."""

    watcher: LogWatcher | None
    _survived_at: float | None = None

    def seen(self) -> bool:
        if self.watcher is None:
            return False
        self.watcher.poll(time.monotonic())
        failing = self.watcher.failing_since
        return failing is not None and failing != self._survived_at

    def survived(self) -> None:
        if self.watcher is not None:
            self._survived_at = self.watcher.failing_since


@dataclass(eq=False)
class LaunchedLiveness:
    """A server this run started: its process, its log watcher, and its health probe once a crash is logged."""

    profile: str
    process: ProcessTree  # here, or on an ssh host (server/remote.py)
    watcher: LogWatcher
    health: Probe | None
    log_path: Path
    host: str
    port: int
    shutdown_grace: float
    keep: bool = False  # --sglang-reuse: the server outlives the session
    on_status: Callable[[str], None] | None = None  # says so when the stopped server is slow to let go of a GPU

    def __post_init__(self) -> None:
        self.crashes = LoggedCrashes(self.watcher)

    def death(self) -> ServerDiedError | None:
        now = time.monotonic()
        self.watcher.poll(now)
        code = self.process.poll()
        if code is not None:
            self.watcher.poll(now, final=True)
            return self._died("server died during the session", code)
        if essential_death(self.process) is not None:  # a scheduler gone: its main process may serve on, hung
            error = self._died("server died during the session: a process of its tree died", None)
            self.process.stop(grace=FAILURE_GRACE_SECONDS)
            return error
        if self.logged_crash() and not (self.health is None or self.health.ok()):
            error = self._died("server died during the session: it logged a crash and stopped answering", None)
            self.process.stop(grace=FAILURE_GRACE_SECONDS)
            return error
        return None

    def logged_crash(self) -> bool:
        return self.crashes.seen()

    def survived(self) -> None:
        self.crashes.survived()

    def close(self) -> None:
        if self.keep and self.process.poll() is None:
            return
        stop_and_release(self.process, grace=self.shutdown_grace, profile=self.profile, host=self.host,
                         port=self.port, on_status=self.on_status)

    def _died(self, headline: str, code: int | None) -> ServerDiedError:
        diagnosis = self.watcher.diagnosis(exit_code=code)
        diagnosis.died_first = died_first(self.process)
        return ServerDiedError(
            headline, profile=self.profile, log_path=self.log_path, diagnosis=diagnosis,
            elapsed=time.monotonic() - self.process.started_at,
            hints=["every later test that uses this server fails with this same error; fix the crash above"],
        )


class Unwatched:
    """A server whose log this run does not read and whose life is not this run's to end."""

    def logged_crash(self) -> bool:
        return False

    def survived(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(eq=False)
class AttachedLiveness(Unwatched):
    """A server someone else runs (--sglang-url): alive while its health path answers; never stopped."""

    profile: str
    health: Probe | None

    def death(self) -> ServerDiedError | None:
        if self.health is None or self.health.ok(timeout=5.0):
            return None
        return ServerDiedError(f"server at {self.health.url} no longer answers 200 ({self.health.last})",
                               profile=self.profile, log_path=None, diagnosis=Diagnosis())


@dataclass(eq=False)
class WatchedPidLiveness:
    """A server this session did not start but whose pid and log it knows: one another xdist worker launched,
    or one kept from an earlier run (--sglang-reuse). Alive while its pid is, its crashes read from its log as
    a launched server's are; its health is asked only once a crash is logged (SGLang's /health costs about a
    second a call). Never stopped here: its owner does that."""

    profile: str
    pid: int
    log_path: Path | None
    watcher: LogWatcher | None
    health: Probe | None
    hint: str  # what to do about its death

    def __post_init__(self) -> None:
        self.crashes = LoggedCrashes(self.watcher)

    def death(self) -> ServerDiedError | None:
        if pid_alive(self.pid):
            if not (self.logged_crash() and self.health is not None and not self.health.ok()):
                return None
            headline = "server died during the session: it logged a crash and stopped answering"
        else:
            headline = f"server (pid {self.pid}) died during the session"
        if self.watcher is not None:
            self.watcher.poll(time.monotonic(), final=True)
        diagnosis = self.watcher.diagnosis() if self.watcher is not None else Diagnosis()
        return ServerDiedError(headline, profile=self.profile, log_path=self.log_path, diagnosis=diagnosis,
                               hints=[self.hint])

    def logged_crash(self) -> bool:
        return self.crashes.seen()

    def survived(self) -> None:
        self.crashes.survived()

    def close(self) -> None:
        pass

