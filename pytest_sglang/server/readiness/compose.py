"""What each origin's startup waits on, composed once, in the order its failures are judged.

A server this run started (here, on an ssh host, over SLURM nodes, a fleet's router) waits on its tree, its
log, its probe and its peers; one attached to or reused waits on its probe alone; a fleet's servers wait on
each other as peers. The order of a composition is the order of the failures it can tell: an exit first, then
a peer's end, a crash, a needed member's death, the deadline, a refusing probe, silence; and, among the
readiness signals, a crash in play before the peers, the peers before the ready line, the line before the
probe, the followers last. The nodes of a server that spans nodes are always composed, whatever their kind,
so each one is awaited and a silent one is named.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pytest_sglang.server.readiness.check import (
    Deadline,
    ReadinessCheck,
    Server,
    Subject,
    nothing_said,
    timeout_headline,
)
from pytest_sglang.server.readiness.log import LogCrash, ReadyLine, Silence
from pytest_sglang.server.readiness.peers import Followers, MemberSilence, Peer, PeerFailures, PeersUp
from pytest_sglang.server.readiness.probe import HealthCheck, HttpReady
from pytest_sglang.server.readiness.tree import NodeEnd, TreeExit, TreeMembers, no_ends
from pytest_sglang.watch import LogWatcher

TimeoutHints = Callable[[], list[str]]


class Progress(Protocol):
    """How a startup's progress is told: the logs read each poll, the status line, what its records say."""

    def begin(self) -> None: ...

    def end(self) -> None: ...

    def poll(self, now: float) -> None: ...

    def status(self, now: float) -> tuple[str | None, str] | None:
        """(what changes the status line, the line's text); None: no line to show."""

    def facts(self) -> dict[str, object]:
        """What any record of this startup says of its progress."""

    def ready(self, seconds: float) -> dict[str, object]:
        """What the ready record adds, once every check is ready after ``seconds``."""


class Unseen:
    """A server that runs no process here (attached, reused): no log is read, its records say no phase."""

    def begin(self) -> None:
        pass

    def end(self) -> None:
        pass

    def poll(self, now: float) -> None:
        pass

    def status(self, now: float) -> tuple[str | None, str] | None:
        return None

    def facts(self) -> dict[str, object]:
        return {}

    def ready(self, seconds: float) -> dict[str, object]:
        return {}


@dataclass(eq=False)
class ServerLog(Unseen):
    """A server this run started: its log and its peers' logs read each poll (its probe's own access lines
    are not progress), its phase on the status line, its phases and startup seconds in its records."""

    watcher: LogWatcher
    peers: Sequence[Peer] = ()
    probe_paths: Sequence[str] = ()

    def begin(self) -> None:
        if self.probe_paths:
            self.watcher.ignore_requests(self.probe_paths)

    def end(self) -> None:
        self.watcher.ignore_requests(())

    def poll(self, now: float) -> None:
        self.watcher.poll(now)
        for peer in self.peers:
            peer.watcher.poll(now)

    def status(self, now: float) -> tuple[str | None, str] | None:
        return self.watcher.phase_label, self.watcher.status(now)

    def facts(self) -> dict[str, object]:
        return {"last_phase": self.watcher.phase_label, "phases": dict(self.watcher.phases)}

    def ready(self, seconds: float) -> dict[str, object]:
        self.watcher.confirm_ready()
        return {**self.facts(), "startup_seconds": seconds, "phases": {**self.watcher.phases, "ready": seconds}}


@dataclass(eq=False)
class MembersLog(Unseen):
    """A fleet's servers before its router runs: each one's log read each poll, each one's state on the line."""

    peers: Sequence[Peer]

    def poll(self, now: float) -> None:
        for peer in self.peers:
            peer.watcher.poll(now)

    def status(self, now: float) -> tuple[str | None, str] | None:
        states = "; ".join(f"{p.name} {'ready' if p.up else p.watcher.phase_label or 'starting'}" for p in self.peers)
        return states, states


@dataclass(eq=False)
class Startup:
    """One startup as the readiness loop runs it: who, its checks in their order, how its progress is told."""

    subject: Subject
    checks: Sequence[ReadinessCheck]
    progress: Progress

    @property
    def started_at(self) -> float:
        return self.subject.started_at


def server_startup(server: Server, *, timeout: float, stall_timeout: float | None, probe: HealthCheck | None,
                   await_line: bool, peers: Sequence[Peer] = (), ends: Callable[[], Sequence[NodeEnd]] = no_ends,
                   timeout_hints: TimeoutHints = list) -> Startup:
    """A server this run started. ``probe``: None where the plan asks no HTTP; ``await_line``: its ready line
    must come before the probe; ``peers``: its other nodes (or a fleet's servers, for its router); ``ends``:
    how each node ended, where its launcher says."""
    said = probe.describe if probe is not None else nothing_said
    checks: list[ReadinessCheck] = [TreeExit(server, peers, ends)]
    if peers:
        checks.append(PeerFailures(server, peers))
    checks += [LogCrash(server), TreeMembers(server),
               Deadline(server, timeout, timeout_headline(timeout, said), timeout_hints)]
    if peers:
        checks.append(PeersUp(peers))
    checks.append(ReadyLine(server, awaited=await_line))
    if probe is not None:
        checks.append(HttpReady(server, probe, after_line=await_line, refuse_after=stall_timeout))
    if stall_timeout is not None:
        checks.append(Silence(server, peers, stall_timeout, said))
    if peers:
        checks.append(Followers(peers))
    return Startup(server, checks, ServerLog(server.watcher, peers, probe.paths if probe is not None else ()))


def probe_startup(subject: Subject, *, probe: HealthCheck | None, timeout: float,
                  headline: Callable[[float], str] | None = None, timeout_hints: TimeoutHints = list) -> Startup:
    """A server that runs no process here (attached, kept from an earlier run): its probe alone, within
    ``timeout``; ready at once where the plan asks no HTTP."""
    said = probe.describe if probe is not None else nothing_said
    checks: list[ReadinessCheck] = [Deadline(subject, timeout, headline or timeout_headline(timeout, said),
                                             timeout_hints)]
    if probe is not None:
        checks.append(HttpReady(subject, probe))
    return Startup(subject, checks, Unseen())


def members_startup(subject: Subject, peers: Sequence[Peer], *, timeout: float, stall_timeout: float | None,
                    headline: Callable[[float], str], timeout_hints: TimeoutHints = list) -> Startup:
    """A fleet's servers, each a peer with a process of its own, before its router runs."""
    checks: list[ReadinessCheck] = [PeerFailures(subject, peers),
                                    Deadline(subject, timeout, headline, timeout_hints), PeersUp(peers)]
    if stall_timeout is not None:
        checks.append(MemberSilence(subject, peers, stall_timeout))
    return Startup(subject, checks, MembersLog(peers))
