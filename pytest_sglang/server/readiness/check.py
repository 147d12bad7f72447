"""The one small protocol every readiness check keeps, and who its messages name.

Two questions a poll asks, in two passes: has anything failed (each check in the order its origin composed
it, so the first failure judged is the one told), then is everything ready (in the same order, stopping at
the first "not yet", so a probe is never asked before the line that must come first). A check answers with
a typed observation, never None for "does not apply": a check that does not apply is not composed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pytest_sglang.errors import Diagnosis, ServerStartupError
from pytest_sglang.launch.members import died_first
from pytest_sglang.launch.process import ProcessTree
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.watch import LogWatcher

if TYPE_CHECKING:
    from pytest_sglang.server.readiness.peers import Peer

POLL_SECONDS = 0.02  # log and process poll: the ready-to-return lag is at most this plus one probe
PROBE_EVERY_SECONDS = 0.25  # probe interval while no ready line says when to ask
CRASH_SETTLE_SECONDS = 1.0  # after a traceback ends, let chained exceptions and other ranks' copies arrive
USAGE_EXIT_WAIT_SECONDS = 15.0  # a usage error is followed by exit 2, but torch-heavy imports exit slowly

Clock = Callable[[], float]
Hints = Callable[[int | None, Diagnosis], list[str]]


@dataclass(frozen=True)
class Ready:
    """This check is satisfied. ``at``: when it became so on the loop's clock, where it knows better than the
    poll's own time (the ready line's moment, the probe's answer)."""

    at: float | None = None


@dataclass(frozen=True)
class NotYet:
    """This check is still waiting; the loop asks again at the next poll."""


@dataclass(frozen=True)
class Failed:
    """This check saw the startup fail, and says how in its own words."""

    error: ServerStartupError


READY = Ready()
NOT_YET = NotYet()


class ReadinessCheck(Protocol):
    """One thing a startup waits on: a log line, an HTTP probe, the process tree, peers or nodes, members."""

    def failed(self, now: float, clock: Clock) -> Failed | None:
        """The failure this check sees at this poll; ``clock``: the loop's, for a time read after slow work."""

    def ready(self, now: float, clock: Clock) -> Ready | NotYet:
        """Whether this check is satisfied; asked only once every earlier check is."""


class Check:
    """A check that neither fails nor waits until a subclass says otherwise."""

    def failed(self, now: float, clock: Clock) -> Failed | None:
        return None

    def ready(self, now: float, clock: Clock) -> Ready | NotYet:
        return READY


def no_hints(code: int | None, diagnosis: Diagnosis) -> list[str]:
    return []


@dataclass(frozen=True, eq=False, kw_only=True)
class Subject:
    """Who is starting, as every check's message names it: the profile, its log, the command, since when.
    A server attached to or reused runs no process here, so its errors carry no log diagnosis."""

    template: StartupRecord
    started_at: float
    command: Sequence[str] = ()
    node: str = ""  # "node 0 (node1)", "router": rank 0's own failures name it too where there are peers
    failure_hints: Hints = no_hints

    @property
    def profile(self) -> str:
        return self.template.profile

    def diagnosis(self, code: int | None, peer: Peer | None = None) -> Diagnosis:
        diagnosis = peer.watcher.diagnosis(exit_code=code) if peer is not None else Diagnosis(exit_code=code)
        diagnosis.died_first = died_first(peer.process if peer is not None else None)
        return diagnosis

    def on_node(self, headline: str) -> str:
        return f"{self.node}: {headline}" if self.node else headline

    def error(self, headline: str, now: float, *, diagnosis: Diagnosis, hints: Sequence[str] = (),
              log_path: Path | None = None, command: Sequence[str] = ()) -> ServerStartupError:
        """A startup error of this subject; ``log_path``, ``command``: a peer's own, where it names one."""
        return ServerStartupError(
            headline, profile=self.profile, log_path=log_path or self.template.log_path,
            diagnosis=diagnosis, elapsed=now - self.started_at, hints=hints,
            command=list(command or self.command) or None)

    def failure(self, now: float, headline: str, code: int | None, peer: Peer | None = None) -> ServerStartupError:
        """A crash or an exit: of the server (its node named), or of ``peer``, with the failure hints."""
        diagnosis = self.diagnosis(code, peer)
        error = self.error(self.on_node(headline) if peer is None else headline, now, diagnosis=diagnosis,
                           hints=self.failure_hints(code, diagnosis),
                           log_path=peer.log_path if peer is not None else None,
                           command=(peer.command or ()) if peer is not None else ())
        error.member = peer.name if peer is not None else (self.node or None)
        return error


@dataclass(frozen=True, eq=False, kw_only=True)
class Server(Subject):
    """A server this run started (here, on an ssh host, over SLURM nodes): its process tree and its own log,
    rank 0's where it spans nodes, tell every failure."""

    process: ProcessTree
    watcher: LogWatcher

    def diagnosis(self, code: int | None, peer: Peer | None = None) -> Diagnosis:
        watcher = peer.watcher if peer is not None else self.watcher
        diagnosis = watcher.diagnosis(exit_code=code)
        diagnosis.died_first = died_first(peer.process if peer is not None and peer.process is not None
                                          else self.process)
        return diagnosis


def timeout_headline(timeout: float, said: Callable[[float], str | None]) -> Callable[[float], str]:
    """The default: "not ready within its startup timeout", with what the probe got (``said``) where it asked."""
    def headline(now: float) -> str:
        probed = said(now)
        return f"server was not ready within its startup timeout of {timeout:.0f} s" + (
            f" ({probed})" if probed else "")
    return headline


def nothing_said(now: float) -> str | None:
    return None


@dataclass(eq=False)
class Deadline(Check):
    """The hard cap: not ready within ``timeout`` fails, told by the origin's headline and hints."""

    subject: Subject
    timeout: float
    headline: Callable[[float], str]
    hints: Callable[[], list[str]] = list

    def failed(self, now: float, clock: Clock) -> Failed | None:
        if now - self.subject.started_at <= self.timeout:
            return None
        return Failed(self.subject.error(self.headline(now), now, diagnosis=self.subject.diagnosis(None),
                                         hints=self.hints()))
