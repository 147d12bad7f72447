"""Readiness: the only loop that decides whether a server is ready, failing, or out of time.

Every origin waits here: a launched server (its process, its log watcher, then an HTTP probe), a server
attached with --sglang-url and a kept server reused from an earlier run (an HTTP probe alone). The loop
returns the startup record; a failed or interrupted wait reports its record too, before the error goes on.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import requests

from pytest_sglang.errors import Diagnosis, ServerStartupError, describe_exit
from pytest_sglang.launch.members import died_first, essential_death
from pytest_sglang.launch.process import ProcessTree
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.watch import LogWatcher

if TYPE_CHECKING:
    from pytest_sglang.launch.plan import LaunchPlan

POLL_SECONDS = 0.02  # log and process poll: the ready-to-return lag is at most this plus one probe
PROBE_EVERY_SECONDS = 0.25  # probe interval while no ready line says when to ask
CRASH_SETTLE_SECONDS = 1.0  # after a traceback ends, let chained exceptions and other ranks' copies arrive
USAGE_EXIT_WAIT_SECONDS = 15.0  # a usage error is followed by exit 2, but torch-heavy imports exit slowly
STATUS_EVERY_SECONDS = 30.0

StatusCallback = Callable[[str], None]
RecordCallback = Callable[[StartupRecord], None]
Clock = Callable[[], float]
Sleep = Callable[[float], None]


def ignore(_: object) -> None:
    """The callback of a caller that wants no status lines or records (benchmarks, scripts)."""


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
class Peer:
    """Another part of the server that must be up too, with its own log watched by the same rules and its own
    health answer: another node of a server that spans nodes (server/slurm.py, one process tree for all), or a
    member of a fleet (server/fleet.py), which has a process of its own."""

    name: str  # "node 1 (node2)": the node rank and its hostname; a fleet member's name ("worker1")
    watcher: LogWatcher
    probe: HealthCheck | None  # None: the node serves no HTTP (vLLM's --headless), its log and its process tell
    log_path: Path
    up: bool = False
    process: ProcessTree | None = None  # a fleet member's own; None: the peer lives in the wait's process tree
    wait_for_line: bool = False  # its ready line must come before its probe counts
    command: list[str] | None = None
    up_at: float | None = None  # when it was first seen up (the loop's clock)


@dataclass(frozen=True)
class NodeEnd:
    """How one node of a process tree that spans nodes ended, as its launcher reports it (srun's ``srun: error:
    node2: task 1: Exited with exit code 1``): the node's own exit status, not the launcher's, which is the
    status of whichever node the launcher stopped last."""

    name: str  # the peer's name, or the wait's node for node 0
    code: int | None  # Popen's convention: negative, killed by that signal
    said: str  # the launcher's line
    stopped: bool  # it ended once the launcher had begun stopping the step (after another node's end)


@dataclass
class Wait:
    """What one startup waits on. An attached or reused server has no process and no watcher."""

    template: StartupRecord  # who is starting; the loop fills in outcome, timings, phases, error
    timeout: float  # the hard cap
    started_at: float
    stall_timeout: float | None = None  # fail early when the log has shown nothing new for this long
    probe: HealthCheck | None = None
    process: ProcessTree | None = None
    watcher: LogWatcher | None = None
    wait_for_line: bool = False  # the watcher's ready line must come before the probe
    command: list[str] | None = None
    failure_hints: Callable[[int | None, Diagnosis], list[str]] = field(default=lambda code, d: [])
    timeout_headline: Callable[[], str] | None = None  # default: "not ready within its startup timeout"
    timeout_hints: Callable[[], list[str]] = field(default=list)
    peers: Sequence[Peer] = ()  # the other nodes: each must be up too, and each one's crash or stall fails it
    node: str | None = None  # "node 0 (node1)" where there are peers: rank 0's own failures name it too
    # Where one process runs every node (srun): how each node ended, in the order the launcher saw them end.
    node_ends: Callable[[], Sequence[NodeEnd]] | None = None

    @property
    def starts_a_process(self) -> bool:
        """This run started the server (here or on an ssh host): its record has startup seconds and phases."""
        return self.process is not None

    def record(self, outcome: str, now: float, **facts: object) -> StartupRecord:
        watcher = self.watcher
        updates: dict[str, object] = {"outcome": outcome, "elapsed": now - self.started_at}
        if watcher is not None:
            updates["last_phase"] = watcher.phase_label
            if self.starts_a_process:
                updates["phases"] = dict(watcher.phases)
        updates.update(facts)
        return replace(self.template, **updates)  # type: ignore[arg-type]


def wait_for(wait: Wait, *, on_status: StatusCallback, on_record: RecordCallback, clock: Clock = time.monotonic,
             sleep: Sleep = time.sleep) -> StartupRecord:
    """Wait until ready and return the record; every outcome is handed to ``on_record`` exactly once.
    ``clock`` and ``sleep``: what the loop reads the time from and waits with (a test steps a fake pair)."""
    if wait.watcher is not None and wait.probe is not None:
        wait.watcher.ignore_requests(wait.probe.paths)  # the probe's own access-log lines are not progress
    try:
        seconds = _until_ready(wait, on_status, clock, sleep)
    except ServerStartupError as exc:
        # the log that tells: the failing node's or member's own, where the error names one
        named = {"log_path": exc.log_path} if exc.log_path is not None else {}
        cause = f"{exc.member}: {exc.cause}" if exc.member and exc.cause else exc.cause
        on_record(wait.record("failed", clock(), error=str(exc), cause=cause, **named))
        raise
    except BaseException:  # Ctrl-C, or pytest-timeout cutting the wait
        on_record(wait.record("interrupted", clock()))
        raise
    finally:
        if wait.watcher is not None:
            wait.watcher.ignore_requests(())
    now = wait.started_at + seconds
    if wait.watcher is not None:
        wait.watcher.confirm_ready()
    if wait.starts_a_process:
        record = wait.record("ready", now, startup_seconds=seconds)
        record = replace(record, phases={**record.phases, "ready": seconds})
    else:
        record = wait.record("ready", now)
    on_record(record)
    return record


def _until_ready(wait: Wait, on_status: StatusCallback, clock: Clock, sleep: Sleep) -> float:
    """Seconds from the start to ready. Ready: the ready line was logged (where one is awaited), then the
    probe answered 200 (where there is one). Failure: see :class:`_Verdicts`."""
    verdicts = _Verdicts(wait, clock)
    last_status, last_label = wait.started_at, None
    while True:
        now = clock()
        if wait.watcher is not None:
            wait.watcher.poll(now)
        for peer in wait.peers:
            peer.watcher.poll(now)
        error = verdicts.failure(now)
        if error is not None:
            raise error
        seconds = verdicts.ready(now)
        if seconds is not None:
            return seconds
        label = _progress(wait, now)
        if label is not None and (label[0] != last_label or now - last_status >= STATUS_EVERY_SECONDS):
            on_status(f"[sglang {wait.template.profile}] {now - wait.started_at:.0f} s  {label[1]}")
            last_status, last_label = now, label[0]
        sleep(POLL_SECONDS)


def _progress(wait: Wait, now: float) -> tuple[str | None, str] | None:
    """(what changes the status line, the line's text): the server's phase, or each fleet member's."""
    if wait.watcher is not None:
        return wait.watcher.phase_label, wait.watcher.status(now)
    if not wait.peers:
        return None
    states = [f"{p.name} {'ready' if p.up else p.watcher.phase_label or 'starting'}" for p in wait.peers]
    return "; ".join(states), "; ".join(states)


class _Verdicts:
    """What one poll of a startup concludes: failed (and how), ready, or neither yet.

    Failure, the first of these conditions that holds, in this order: the process exited; another node's log
    showed a failure that settled; this node's did while its process is alive and no readiness followed within
    the settle time; a process of its tree that the server needs (a scheduler) died; the startup timeout
    passed; a log showed nothing new for stall_timeout."""

    def __init__(self, wait: Wait, clock: Clock) -> None:
        self.wait = wait
        self.clock = clock
        self.last_probe = -PROBE_EVERY_SECONDS
        self.member_died_at: float | None = None
        self.last_peer_probe = -PROBE_EVERY_SECONDS
        self.conditions: tuple[Callable[[float], ServerStartupError | None], ...] = (
            self.exited, self.peer_exited, self.peer_crashed, self.crashed, self.member_died, self.timed_out,
            self.refused, self.stalled)

    def failure(self, now: float) -> ServerStartupError | None:
        for condition in self.conditions:
            error = condition(now)
            if error is not None:
                return error
        return None

    def exited(self, now: float) -> ServerStartupError | None:
        """The process exited: named after the node(s) that failed of themselves where the launcher says how
        each node ended (each with its own exit status), else after the node whose log shows the first failure
        (rank 0 where it is first)."""
        wait = self.wait
        code = wait.process.poll() if wait.process is not None else None
        if code is None:
            return None
        for w in [wait.watcher, *(p.watcher for p in wait.peers)]:
            if w is not None:
                w.poll(now, final=True)
        ends = [end for end in (wait.node_ends() if wait.node_ends is not None else ()) if _own_end(wait, end)]
        if ends:
            return _nodes_failed(wait, self.clock(), ends, code)
        failing = [p for p in wait.peers if p.watcher.failing_since is not None]
        culprit = (min(failing, key=lambda p: p.watcher.failing_since or 0.0) if failing
                   else next((p for p in wait.peers if p.watcher.diagnosis().root_causes), None))
        watcher = wait.watcher
        rank0_first = watcher is not None and watcher.failing_since is not None and (
            culprit is None or culprit.watcher.failing_since is None
            or watcher.failing_since <= culprit.watcher.failing_since)
        if culprit is not None and not rank0_first:
            return _failure(wait, self.clock(), f"{culprit.name} crashed and the server exited during startup",
                            code, culprit)
        return _failure(wait, self.clock(), "server exited during startup", code)

    def peer_exited(self, now: float) -> ServerStartupError | None:
        """A peer with a process of its own (a fleet member) exited: named, with its log's root cause."""
        for peer in self.wait.peers:
            code = peer.process.poll() if peer.process is not None else None
            if code is not None:
                peer.watcher.poll(now, final=True)
                return _failure(self.wait, self.clock(), f"{peer.name} exited during startup", code, peer)
        return None

    def peer_crashed(self, now: float) -> ServerStartupError | None:
        for peer in self.wait.peers:
            if _settled(peer.watcher, now):
                everywhere = "every member" if peer.process is not None else "every node"
                return _failure(self.wait, now, f"{peer.name} crashed during startup (the server has been stopped "
                                                f"on {everywhere})", None, peer)
        return None

    def crashed(self, now: float) -> ServerStartupError | None:
        watcher = self.wait.watcher
        if watcher is None or not _settled(watcher, now):
            return None
        return _failure(self.wait, now, "server crashed during startup (its process was still alive; the tree has "
                                        "been killed)", None)

    def member_died(self, now: float) -> ServerStartupError | None:
        process = self.wait.process
        if process is not None and self.member_died_at is None and essential_death(process) is not None:
            self.member_died_at = now
        if self.member_died_at is None or now - self.member_died_at < CRASH_SETTLE_SECONDS:
            return None
        return _failure(self.wait, now, "a process of the server's tree died during startup (the tree has been "
                                        "killed)", None)

    def timed_out(self, now: float) -> ServerStartupError | None:
        return _timeout(self.wait, now) if now - self.wait.started_at > self.wait.timeout else None

    def refused(self, now: float) -> ServerStartupError | None:
        """The probe has got the same client error for stall_timeout while the server lives: it is up and says
        no, and its log (its own access lines among it) will keep moving while nothing changes."""
        wait = self.wait
        probe = wait.probe
        refusing = probe.refusing_for(now) if probe is not None else None
        if refusing is None or wait.stall_timeout is None or refusing < wait.stall_timeout:
            return None
        assert probe is not None
        return ServerStartupError(
            f"GET {probe.path} answered {probe.last_status} for {refusing:.0f} s while the server ran: is "
            f"health_path right? (stall_timeout {wait.stall_timeout:g} s)",
            profile=wait.template.profile, log_path=wait.template.log_path, diagnosis=_diagnosis(wait, None),
            elapsed=now - wait.started_at, command=wait.command,
            hints=[f"set the profile's health_path to a path that answers 200 once the server is ready (it answered "
                   f"{probe.url} with {probe.last_status})",
                   "a 401 or 403: give the profile's api_key (or the server's key in its env)"])

    def stalled(self, now: float) -> ServerStartupError | None:
        """A node that has logged nothing for stall_timeout while it is not up. A silent node is named whatever
        rank 0 logs meanwhile (rank 0 may log "waiting for 1 more node(s)" for ever); of several silent nodes
        the one furthest behind is named (rank 0 waits silently in its init for a node that never joined), and
        where rank 0 is as far along, a silent other node is named before it."""
        wait, watcher, stall = self.wait, self.wait.watcher, self.wait.stall_timeout
        if stall is None or (watcher is None and not wait.peers):
            return None
        waiting = [peer for peer in wait.peers if not peer.up]
        quiet = {id(peer): now - (peer.watcher.last_line_at or wait.started_at) for peer in waiting}
        silent = [peer for peer in waiting if quiet[id(peer)] >= stall]
        if watcher is None:  # a fleet's members: the quietest one that is not up yet
            if not silent:
                return None
            quietest = max(silent, key=lambda p: quiet[id(p)])
            return _peer_stalled(wait, now, quietest, quiet[id(quietest)])
        head_quiet = now - (watcher.last_line_at or wait.started_at)
        behind = min(silent, key=lambda p: (len(p.watcher.phases), -quiet[id(p)]), default=None)
        if behind is not None and (head_quiet < stall or len(behind.watcher.phases) <= len(watcher.phases)):
            return _peer_stalled(wait, now, behind, quiet[id(behind)])
        return _stalled(wait, now, head_quiet) if head_quiet >= stall else None

    def ready(self, now: float) -> float | None:
        wait, watcher, probe = self.wait, self.wait.watcher, self.wait.probe
        if watcher is not None and watcher.failing_since is not None:
            return None  # a crash is playing out: never call it ready
        if not self.peers_up(now):
            return None
        ready_at = watcher.ready_at if watcher is not None else None
        if wait.wait_for_line and ready_at is None:
            return None
        if probe is None:
            return self._followers_up(now, (ready_at if ready_at is not None else now) - wait.started_at)
        # After the ready line, ask at once and on every poll: the probe is the last step.
        if wait.wait_for_line or now - self.last_probe >= PROBE_EVERY_SECONDS:
            self.last_probe = now
            if probe.ok():
                return self._followers_up(now, self.clock() - wait.started_at)
        return None

    def _followers_up(self, now: float, seconds: float) -> float:
        """Rank 0 is ready: so is every node that has no signal of its own (a torchrun node without HTTP, vLLM's
        headless node), since rank 0 cannot be ready before the nodes it needs joined."""
        for peer in self.wait.peers:
            if _follower(peer) and not peer.up:
                peer.up, peer.up_at = True, now
        return seconds

    def peers_up(self, now: float) -> bool:
        """Whether every other node's health server has answered 200 (each is asked at the probe pace). A node
        with no signal of its own (no probe, no line to wait for) is not up before rank 0 is: until then it is
        still awaited, and its silence past stall_timeout names it."""
        down = [peer for peer in self.wait.peers if not peer.up and not _follower(peer)]
        if down and now - self.last_peer_probe >= PROBE_EVERY_SECONDS:
            self.last_peer_probe = now
            for peer in down:
                peer.up = (peer.watcher.failing_since is None
                           and (not peer.wait_for_line or peer.watcher.ready_at is not None)
                           and (peer.probe is None or peer.probe.ok(timeout=1.0)))
                peer.up_at = now if peer.up else None
        return all(peer.up for peer in self.wait.peers if not _follower(peer))


def _follower(peer: Peer) -> bool:
    """A node of the wait's own process tree with no signal of its own: no probe, no ready line awaited."""
    return peer.process is None and peer.probe is None and not peer.wait_for_line


def _settled(watcher: LogWatcher, now: float) -> bool:
    """The log showed a failure long enough ago that it has played out."""
    return watcher.failing_since is not None and now - watcher.failing_since >= _settle_seconds(watcher)


def _settle_seconds(watcher: LogWatcher) -> float:
    """How long a logged failure may take to play out before the still-running process is called crashed.

    A usage error (argparse's `prog: error: ...`, click's `Error: ...`) always ends in exit code 2, but a
    process with torch loaded can take seconds to exit: wait for that exit, so the error says "exit code 2"."""
    return USAGE_EXIT_WAIT_SECONDS if watcher.failure_is_usage_error else CRASH_SETTLE_SECONDS


def _diagnosis(wait: Wait, code: int | None, peer: Peer | None = None) -> Diagnosis:
    watcher = peer.watcher if peer is not None else wait.watcher
    diagnosis = watcher.diagnosis(exit_code=code) if watcher is not None else Diagnosis(exit_code=code)
    # which process of the tree died first, and how
    diagnosis.died_first = died_first(peer.process if peer is not None and peer.process is not None else wait.process)
    return diagnosis


def _failure(wait: Wait, now: float, headline: str, code: int | None, peer: Peer | None = None) -> ServerStartupError:
    diagnosis = _diagnosis(wait, code, peer)
    error = ServerStartupError(
        _on_node(wait, headline) if peer is None else headline, profile=wait.template.profile,
        log_path=peer.log_path if peer else wait.template.log_path,
        diagnosis=diagnosis,
        elapsed=now - wait.started_at, hints=wait.failure_hints(code, diagnosis),
        command=peer.command if peer is not None and peer.command else wait.command,
    )
    error.member = peer.name if peer is not None else wait.node
    return error


_SIGNALLED = re.compile(r"(?i)\bgot signal\b|\bSignalException\b|\breceived signal\b|\bSIG(?:TERM|KILL|INT)\b")


def _own_end(wait: Wait, end: NodeEnd) -> bool:
    """A node failed of itself: it ended before the launcher began stopping the step, or after it with a root
    cause of its own in its log (it failed at the same moment; a log that only says it was signalled does not
    count: that is the stop's doing)."""
    if not end.stopped:
        return True
    peer = next((p for p in wait.peers if p.name == end.name), None)
    watcher = peer.watcher if peer is not None else wait.watcher
    causes = watcher.diagnosis().root_causes if watcher is not None else []
    return any(not _SIGNALLED.search(cause.splitlines()[0]) for cause in causes if cause.strip())


def _nodes_failed(wait: Wait, now: float, ends: Sequence[NodeEnd], code: int) -> ServerStartupError:
    """The nodes that failed of themselves (``ends``, the first first), each named with its own exit status; the
    first one's log, root cause and exit status lead, every other one's root cause follows."""
    peers = {peer.name: peer for peer in wait.peers}
    lead = ends[0]
    others = [f"{end.name} too ({describe_exit(end.code) or end.said})" for end in ends[1:]]
    headline = f"{lead.name} exited during startup" + (f", and {', '.join(others)}" if others else "")
    peer = peers.get(lead.name)
    diagnosis = _diagnosis(wait, lead.code, peer)
    logs = []
    for end in ends[1:]:
        other = peers.get(end.name)
        watcher = other.watcher if other is not None else wait.watcher
        causes = watcher.diagnosis().root_causes if watcher is not None else []
        if causes and causes[0] not in diagnosis.root_causes:
            diagnosis.root_causes.append(f"on {end.name}: {causes[0]}")
        path = other.log_path if other is not None else wait.template.log_path
        logs.append(f"{end.name}'s own log: {path}")
    launcher = (f"the launcher exited with code {code} after it stopped the other node(s); each node's own end: "
                + "; ".join(end.said for end in ends))
    return ServerStartupError(
        headline, profile=wait.template.profile, log_path=peer.log_path if peer is not None else wait.template.log_path,
        diagnosis=diagnosis, elapsed=now - wait.started_at,
        hints=[*logs, launcher, *wait.failure_hints(lead.code, diagnosis)], command=wait.command)


def _timeout(wait: Wait, now: float) -> ServerStartupError:
    if wait.timeout_headline is not None:
        headline = wait.timeout_headline()
    else:
        headline = f"server was not ready within its startup timeout of {wait.timeout:.0f} s"
        probed = wait.probe.describe(now) if wait.probe is not None else None
        if probed:
            headline += f" ({probed})"
    return ServerStartupError(
        headline, profile=wait.template.profile, log_path=wait.template.log_path, diagnosis=_diagnosis(wait, None),
        elapsed=now - wait.started_at, hints=wait.timeout_hints(), command=wait.command,
    )


def _stalled(wait: Wait, now: float, quiet: float) -> ServerStartupError:
    phase = wait.watcher.phase_label if wait.watcher is not None else None
    probed = wait.probe.describe(now) if wait.probe is not None else None
    return ServerStartupError(
        _on_node(wait, f"no progress for {quiet:.0f} s in phase {phase or 'starting'} (stall_timeout "
                       f"{wait.stall_timeout:g} s: no new log line, phase or progress in that time"
                       + (f"; {probed}" if probed else "") + ")"),
        profile=wait.template.profile, log_path=wait.template.log_path, diagnosis=_diagnosis(wait, None),
        elapsed=now - wait.started_at, command=wait.command,
        hints=[*([f"the server logged its ready line, but {probed}: check the profile's health_path"]
                 if probed and wait.watcher is not None and wait.watcher.ready_at is not None else []),
               "a server that is still working logs something (a phase, a progress bar) more often than this: "
               "look at the last lines for what it waits on (NCCL init, a download, a lock)",
               "if this phase is legitimately silent for longer, raise stall_timeout in the profile "
               "(startup_timeout stays the hard cap)"],
    )


def _on_node(wait: Wait, headline: str) -> str:
    return f"{wait.node}: {headline}" if wait.node else headline


def _peer_stalled(wait: Wait, now: float, peer: Peer, quiet: float) -> ServerStartupError:
    phase = peer.watcher.phase_label or "starting"
    headline = f"{peer.name} has logged nothing new for {quiet:.0f} s in phase {phase}"
    if wait.watcher is None:  # a fleet member: nobody waits on it but the fleet
        look = f"{peer.name} never got past its phase: look at its log's last lines for what it waits on"
        headline += f" (stall_timeout {wait.stall_timeout:g} s)"
    else:
        rank0 = wait.watcher.phase_label
        headline += f"; rank 0 is waiting in {rank0 or 'starting'} (stall_timeout {wait.stall_timeout:g} s)"
        look = (f"{peer.name} never got past its phase while rank 0 waited for it: look at its log's last lines "
                "(the distributed init address and port reachable from it, its GPUs, its NCCL/gloo network)")
    return ServerStartupError(
        headline, profile=wait.template.profile, log_path=peer.log_path, diagnosis=_diagnosis(wait, None, peer),
        elapsed=now - wait.started_at, command=peer.command or wait.command,
        hints=[look, "if this phase is legitimately silent for longer, raise stall_timeout in the profile"],
    )
