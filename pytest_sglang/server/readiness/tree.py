"""The server's process tree as readiness sees it: its exit, and the death of a member it needs.

An exit is named after whoever failed first: the node(s) that ended of themselves where the launcher says how
each node ended (srun's own status is that of whichever node it stopped last), else the node whose log shows
the first failure. A needed member (a scheduler) that dies leaves the main process serving nothing; it gets
the settle time to let the main process's own exit, which says more, come first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pytest_sglang.errors import ServerStartupError, describe_exit
from pytest_sglang.launch.members import essential_death
from pytest_sglang.server.readiness.check import CRASH_SETTLE_SECONDS, Check, Clock, Failed, Server
from pytest_sglang.server.readiness.peers import Peer


@dataclass(frozen=True)
class NodeEnd:
    """How one node of a process tree that spans nodes ended, as its launcher reports it (srun's ``srun: error:
    node2: task 1: Exited with exit code 1``): the node's own exit status, not the launcher's, which is the
    status of whichever node the launcher stopped last."""

    name: str  # the peer's name, or the server's node for node 0
    code: int | None  # Popen's convention: negative, killed by that signal
    said: str  # the launcher's line
    stopped: bool  # it ended once the launcher had begun stopping the step (after another node's end)


def no_ends() -> Sequence[NodeEnd]:
    """A tree whose launcher does not say how each node ended (one process here, or on an ssh host)."""
    return ()


_SIGNALLED = re.compile(r"(?i)\bgot signal\b|\bSignalException\b|\breceived signal\b|\bSIG(?:TERM|KILL|INT)\b")


@dataclass(eq=False)
class TreeExit(Check):
    """The process exited during startup: named after the node(s) that failed of themselves, else after the
    node whose log shows the first failure (rank 0 where it is first)."""

    server: Server
    peers: Sequence[Peer] = ()
    ends: Callable[[], Sequence[NodeEnd]] = no_ends

    def failed(self, now: float, clock: Clock) -> Failed | None:
        server, peers = self.server, self.peers
        code = server.process.poll()
        if code is None:
            return None
        for w in [server.watcher, *(p.watcher for p in peers)]:
            w.poll(now, final=True)
        ends = [end for end in self.ends() if self._own_end(end)]
        if ends:
            return Failed(self._nodes_failed(clock(), ends, code))
        failing = [p for p in peers if p.watcher.failing_since is not None]
        culprit = (min(failing, key=lambda p: p.watcher.failing_since or 0.0) if failing
                   else next((p for p in peers if p.watcher.diagnosis().root_causes), None))
        watcher = server.watcher
        rank0_first = watcher.failing_since is not None and (
            culprit is None or culprit.watcher.failing_since is None
            or watcher.failing_since <= culprit.watcher.failing_since)
        if culprit is not None and not rank0_first:
            return Failed(server.failure(clock(), f"{culprit.name} crashed and the server exited during startup",
                                         code, culprit))
        return Failed(server.failure(clock(), "server exited during startup", code))

    def _own_end(self, end: NodeEnd) -> bool:
        """A node failed of itself: it ended before the launcher began stopping the step, or after it with a
        root cause of its own in its log (it failed at the same moment; a log that only says it was signalled
        does not count: that is the stop's doing)."""
        if not end.stopped:
            return True
        peer = next((p for p in self.peers if p.name == end.name), None)
        watcher = peer.watcher if peer is not None else self.server.watcher
        causes = watcher.diagnosis().root_causes
        return any(not _SIGNALLED.search(cause.splitlines()[0]) for cause in causes if cause.strip())

    def _nodes_failed(self, now: float, ends: Sequence[NodeEnd], code: int) -> ServerStartupError:
        """The nodes that failed of themselves (``ends``, the first first), each named with its own exit status;
        the first one's log, root cause and exit status lead, every other one's root cause follows."""
        server = self.server
        peers = {peer.name: peer for peer in self.peers}
        lead = ends[0]
        others = [f"{end.name} too ({describe_exit(end.code) or end.said})" for end in ends[1:]]
        headline = f"{lead.name} exited during startup" + (f", and {', '.join(others)}" if others else "")
        peer = peers.get(lead.name)
        diagnosis = server.diagnosis(lead.code, peer)
        logs = []
        for end in ends[1:]:
            other = peers.get(end.name)
            causes = (other.watcher if other is not None else server.watcher).diagnosis().root_causes
            if causes and causes[0] not in diagnosis.root_causes:
                diagnosis.root_causes.append(f"on {end.name}: {causes[0]}")
            path = other.log_path if other is not None else server.template.log_path
            logs.append(f"{end.name}'s own log: {path}")
        launcher = (f"the launcher exited with code {code} after it stopped the other node(s); each node's own "
                    "end: " + "; ".join(end.said for end in ends))
        return server.error(headline, now, diagnosis=diagnosis,
                            log_path=peer.log_path if peer is not None else None,
                            hints=[*logs, launcher, *server.failure_hints(lead.code, diagnosis)])


@dataclass(eq=False)
class TreeMembers(Check):
    """A process of the tree that the server needs (a scheduler, an engine core) died: failed once it has had
    the settle time."""

    server: Server
    died_at: float | None = field(default=None, init=False)

    def failed(self, now: float, clock: Clock) -> Failed | None:
        if self.died_at is None and essential_death(self.server.process) is not None:
            self.died_at = now
        if self.died_at is None or now - self.died_at < CRASH_SETTLE_SECONDS:
            return None
        return Failed(self.server.failure(now, "a process of the server's tree died during startup (the tree has "
                                               "been killed)", None))
