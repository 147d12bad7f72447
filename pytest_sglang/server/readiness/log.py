"""The server's own log as readiness sees it: a crash it shows, the ready line it awaits, and its silence.

A logged crash is judged only once it has played out (chained exceptions, other ranks' copies), and a usage
error waits for its exit code 2; the silence check judges the server and its nodes together, because which
node to name depends on how far each got (rank 0 may log "waiting for 1 more node(s)" for ever).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_sglang.errors import ServerStartupError
from pytest_sglang.server.readiness.check import (
    CRASH_SETTLE_SECONDS,
    NOT_YET,
    READY,
    USAGE_EXIT_WAIT_SECONDS,
    Check,
    Clock,
    Failed,
    NotYet,
    Ready,
    Server,
)
from pytest_sglang.watch import LogWatcher

if TYPE_CHECKING:
    from pytest_sglang.server.readiness.peers import Peer


def settled(watcher: LogWatcher, now: float) -> bool:
    """The log showed a failure long enough ago that it has played out."""
    return watcher.failing_since is not None and now - watcher.failing_since >= settle_seconds(watcher)


def settle_seconds(watcher: LogWatcher) -> float:
    """How long a logged failure may take to play out before the still-running process is called crashed.

    A usage error (argparse's `prog: error: ...`, click's `Error: ...`) always ends in exit code 2, but a
    process with torch loaded can take seconds to exit: wait for that exit, so the error says "exit code 2"."""
    return USAGE_EXIT_WAIT_SECONDS if watcher.failure_is_usage_error else CRASH_SETTLE_SECONDS


def quiet_for(peers: Sequence[Peer], now: float, started_at: float) -> dict[int, float]:
    """How long each peer not up yet has logged nothing, by id."""
    return {id(peer): now - (peer.watcher.last_line_at or started_at) for peer in peers if not peer.up}


@dataclass(eq=False)
class LogCrash(Check):
    """A crash the log shows while the process lives fails once settled; while one plays out, never ready."""

    server: Server

    def failed(self, now: float, clock: Clock) -> Failed | None:
        if not settled(self.server.watcher, now):
            return None
        return Failed(self.server.failure(now, "server crashed during startup (its process was still alive; the "
                                               "tree has been killed)", None))

    def ready(self, now: float, clock: Clock) -> Ready | NotYet:
        return NOT_YET if self.server.watcher.failing_since is not None else READY


@dataclass(eq=False)
class ReadyLine(Check):
    """The ready line, where the plan awaits one; either way its moment is when the server became ready, unless
    a probe answers later."""

    server: Server
    awaited: bool

    def ready(self, now: float, clock: Clock) -> Ready | NotYet:
        ready_at = self.server.watcher.ready_at
        if self.awaited and ready_at is None:
            return NOT_YET
        return Ready(at=ready_at)


@dataclass(eq=False)
class Silence(Check):
    """Nothing new logged for ``stall`` seconds, by the server or by a node of it that is not up. A silent node
    is named whatever rank 0 logs meanwhile; of several, the one furthest behind (rank 0 waits silently in its
    init for a node that never joined), and where rank 0 is as far along, a silent node before rank 0."""

    server: Server
    peers: Sequence[Peer]
    stall: float
    said: Callable[[float], str | None]  # what the probe has been getting, for the message

    def failed(self, now: float, clock: Clock) -> Failed | None:
        server, stall = self.server, self.stall
        quiet = quiet_for(self.peers, now, server.started_at)
        silent = [peer for peer in self.peers if id(peer) in quiet and quiet[id(peer)] >= stall]
        head_quiet = now - (server.watcher.last_line_at or server.started_at)
        behind = min(silent, key=lambda p: (len(p.watcher.phases), -quiet[id(p)]), default=None)
        if behind is not None and (head_quiet < stall or len(behind.watcher.phases) <= len(server.watcher.phases)):
            return Failed(self._node_silent(now, behind, quiet[id(behind)]))
        return Failed(self._silent(now, head_quiet)) if head_quiet >= stall else None

    def _silent(self, now: float, quiet: float) -> ServerStartupError:
        server, probed = self.server, self.said(now)
        phase = server.watcher.phase_label
        return server.error(
            server.on_node(f"no progress for {quiet:.0f} s in phase {phase or 'starting'} (stall_timeout "
                           f"{self.stall:g} s: no new log line, phase or progress in that time"
                           + (f"; {probed}" if probed else "") + ")"), now, diagnosis=server.diagnosis(None),
            hints=[*([f"the server logged its ready line, but {probed}: check the profile's health_path"]
                     if probed and server.watcher.ready_at is not None else []),
                   "a server that is still working logs something (a phase, a progress bar) more often than this: "
                   "look at the last lines for what it waits on (NCCL init, a download, a lock)",
                   "if this phase is legitimately silent for longer, raise stall_timeout in the profile "
                   "(startup_timeout stays the hard cap)"])

    def _node_silent(self, now: float, peer: Peer, quiet: float) -> ServerStartupError:
        rank0 = self.server.watcher.phase_label
        headline = (f"{peer.name} has logged nothing new for {quiet:.0f} s in phase "
                    f"{peer.watcher.phase_label or 'starting'}; rank 0 is waiting in {rank0 or 'starting'} "
                    f"(stall_timeout {self.stall:g} s)")
        look = (f"{peer.name} never got past its phase while rank 0 waited for it: look at its log's last lines "
                "(the distributed init address and port reachable from it, its GPUs, its NCCL/gloo network)")
        return self.server.error(
            headline, now, diagnosis=self.server.diagnosis(None, peer), log_path=peer.log_path,
            command=peer.command or (),
            hints=[look, "if this phase is legitimately silent for longer, raise stall_timeout in the profile"])
