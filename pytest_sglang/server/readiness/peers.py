"""The other parts of a server that must be up too: the nodes of one that spans nodes, the members of a fleet.

A node of the server's own tree that has no signal of its own (a torchrun node without HTTP, vLLM's headless
node) is a follower: it cannot be asked, so it is up once rank 0 is, and until then its silence names it. A
fleet member has a process of its own, so its exit is its own failure, named, before the fleet's router runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_sglang.errors import ServerStartupError
from pytest_sglang.launch.process import ProcessTree
from pytest_sglang.server.readiness.check import (
    NOT_YET,
    PROBE_EVERY_SECONDS,
    READY,
    Check,
    Clock,
    Failed,
    NotYet,
    Ready,
    Subject,
)
from pytest_sglang.server.readiness.log import quiet_for, settled
from pytest_sglang.server.readiness.probe import HealthCheck
from pytest_sglang.watch import LogWatcher


@dataclass(eq=False)
class Peer:
    """Another part of the server that must be up too, with its own log watched by the same rules and its own
    health answer: another node of a server that spans nodes (server/slurm.py, one process tree for all), or a
    member of a fleet (server/fleet.py), which has a process of its own."""

    name: str  # "node 1 (node2)": the node rank and its hostname; a fleet member's name ("worker1")
    watcher: LogWatcher
    probe: HealthCheck | None  # None: the node serves no HTTP (vLLM's --headless), its log and its process tell
    log_path: Path
    up: bool = False
    process: ProcessTree | None = None  # a fleet member's own; None: the peer lives in the server's process tree
    wait_for_line: bool = False  # its ready line must come before its probe counts
    command: list[str] | None = None
    up_at: float | None = None  # when it was first seen up (the loop's clock)

    @property
    def follower(self) -> bool:
        """A node of the server's own process tree with no signal of its own: no probe, no ready line awaited."""
        return self.process is None and self.probe is None and not self.wait_for_line


@dataclass(eq=False)
class PeerFailures(Check):
    """A peer's own end: a fleet member's process exited, or a peer's log showed a crash that settled."""

    subject: Subject
    peers: Sequence[Peer]

    def failed(self, now: float, clock: Clock) -> Failed | None:
        for peer in self.peers:
            code = peer.process.poll() if peer.process is not None else None
            if code is not None:
                peer.watcher.poll(now, final=True)
                return Failed(self.subject.failure(clock(), f"{peer.name} exited during startup", code, peer))
        for peer in self.peers:
            if settled(peer.watcher, now):
                everywhere = "every member" if peer.process is not None else "every node"
                return Failed(self.subject.failure(now, f"{peer.name} crashed during startup (the server has been "
                                                        f"stopped on {everywhere})", None, peer))
        return None


@dataclass(eq=False)
class PeersUp(Check):
    """Every peer with a signal of its own is up: no crash in its log, its ready line where awaited, its health
    answer 200 (each asked at the probe pace). A follower is not asked: it waits for :class:`Followers`."""

    peers: Sequence[Peer]
    last_ask: float = field(default=-PROBE_EVERY_SECONDS, init=False)

    def ready(self, now: float, clock: Clock) -> Ready | NotYet:
        down = [peer for peer in self.peers if not peer.up and not peer.follower]
        if down and now - self.last_ask >= PROBE_EVERY_SECONDS:
            self.last_ask = now
            for peer in down:
                peer.up = (peer.watcher.failing_since is None
                           and (not peer.wait_for_line or peer.watcher.ready_at is not None)
                           and (peer.probe is None or peer.probe.ok(timeout=1.0)))
                peer.up_at = now if peer.up else None
        return READY if all(peer.up for peer in self.peers if not peer.follower) else NOT_YET


@dataclass(eq=False)
class Followers(Check):
    """Composed last: asked only once everything else is ready, so rank 0 is, and it cannot be before the nodes
    it needs joined; every follower is then up."""

    peers: Sequence[Peer]

    def ready(self, now: float, clock: Clock) -> Ready | NotYet:
        for peer in self.peers:
            if peer.follower and not peer.up:
                peer.up, peer.up_at = True, now
        return READY


@dataclass(eq=False)
class MemberSilence(Check):
    """A fleet member not up yet that has logged nothing for ``stall`` seconds: the quietest one is named."""

    subject: Subject
    peers: Sequence[Peer]
    stall: float

    def failed(self, now: float, clock: Clock) -> Failed | None:
        quiet = quiet_for(self.peers, now, self.subject.started_at)
        silent = [peer for peer in self.peers if id(peer) in quiet and quiet[id(peer)] >= self.stall]
        if not silent:
            return None
        quietest = max(silent, key=lambda p: quiet[id(p)])
        return Failed(self._silent(now, quietest, quiet[id(quietest)]))

    def _silent(self, now: float, peer: Peer, quiet: float) -> ServerStartupError:
        headline = (f"{peer.name} has logged nothing new for {quiet:.0f} s in phase "
                    f"{peer.watcher.phase_label or 'starting'} (stall_timeout {self.stall:g} s)")
        look = f"{peer.name} never got past its phase: look at its log's last lines for what it waits on"
        return self.subject.error(
            headline, now, diagnosis=self.subject.diagnosis(None, peer), log_path=peer.log_path,
            command=peer.command or (),
            hints=[look, "if this phase is legitimately silent for longer, raise stall_timeout in the profile"])
