"""Readiness: the only loop that decides whether a server is ready, failing, or out of time.

Every origin waits here: a launched server (its process, its log watcher, then an HTTP probe), a server
attached with --sglang-url and a kept server reused from an earlier run (an HTTP probe alone). The loop
returns the startup record; a failed or interrupted wait reports its record too, before the error goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import requests

from pytest_sglang.errors import Diagnosis, ServerStartupError
from pytest_sglang.launch.members import died_first, essential_death
from pytest_sglang.launch.process import ProcessTree
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.watch import LogWatcher

POLL_SECONDS = 0.02  # log and process poll: the ready-to-return lag is at most this plus one probe
PROBE_EVERY_SECONDS = 0.25  # probe interval while no ready line says when to ask
CRASH_SETTLE_SECONDS = 1.0  # after a traceback ends, let chained exceptions and other ranks' copies arrive
USAGE_EXIT_WAIT_SECONDS = 15.0  # a usage error is followed by exit 2, but torch-heavy imports exit slowly
STATUS_EVERY_SECONDS = 30.0

StatusCallback = Callable[[str], None]
RecordCallback = Callable[[StartupRecord], None]


def ignore(_: object) -> None:
    """The callback of a caller that wants no status lines or records (benchmarks, scripts)."""


class Probe:
    """An HTTP GET that must answer 200; remembers what it got last, for the error message.

    Given several paths, a 404 or 401 from one moves on to the next (a server version without that endpoint,
    a key the plugin does not know); the last path is kept whatever it answers."""

    def __init__(self, base_url: str, paths: str | Sequence[str], headers: dict[str, str]) -> None:
        self._base = base_url.rstrip("/")
        self._paths = [paths] if isinstance(paths, str) else list(paths)
        self.headers = headers
        self.last: str | None = None  # "HTTP 404", "connection refused", ...
        self.last_status: int | None = None
        self._same_since: float | None = None  # when it first got the answer it got last
        self._session = requests.Session()

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

    @property
    def url(self) -> str:
        return self._base + "/" + self.path.lstrip("/")

    def ok(self, timeout: float = 2.0) -> bool:
        try:
            status = self._session.get(self.url, headers=self.headers, timeout=timeout).status_code
        except requests.ConnectionError:
            self._got("connection refused", None)
            return False
        except requests.RequestException as exc:
            self._got(f"{type(exc).__name__}", None)
            return False
        self._got(f"HTTP {status}", status)
        if status in (401, 404) and len(self._paths) > 1:
            self._paths.pop(0)
            return self.ok(timeout)
        return status == 200

    def _got(self, answer: str, status: int | None) -> None:
        if answer != self.last or self._same_since is None:
            self._same_since = time.monotonic()
        self.last, self.last_status = answer, status


@dataclass(eq=False)
class Peer:
    """Another node of a server that spans nodes (server/slurm.py): its own log, watched by the same rules, and
    its own health server, which answers 200 once that node's schedulers are up."""

    name: str  # "node 1 (node2)": the node rank and its hostname
    watcher: LogWatcher
    probe: Probe | None  # None: the node serves no HTTP (vLLM's --headless), its log and its process tell
    log_path: Path
    up: bool = False


@dataclass
class Wait:
    """What one startup waits on. An attached or reused server has no process and no watcher."""

    template: StartupRecord  # who is starting; the loop fills in outcome, timings, phases, error
    timeout: float  # the hard cap
    started_at: float
    stall_timeout: float | None = None  # fail early when the log has shown nothing new for this long
    probe: Probe | None = None
    process: ProcessTree | None = None
    watcher: LogWatcher | None = None
    wait_for_line: bool = False  # the watcher's ready line must come before the probe
    command: list[str] | None = None
    failure_hints: Callable[[int | None, Diagnosis], list[str]] = field(default=lambda code, d: [])
    timeout_headline: Callable[[], str] | None = None  # default: "not ready within its startup timeout"
    timeout_hints: Callable[[], list[str]] = field(default=list)
    peers: Sequence[Peer] = ()  # the other nodes: each must be up too, and each one's crash or stall fails it
    node: str | None = None  # "node 0 (node1)" where there are peers: rank 0's own failures name it too

    def record(self, outcome: str, now: float, **facts: object) -> StartupRecord:
        watcher = self.watcher
        updates: dict[str, object] = {"outcome": outcome, "elapsed": now - self.started_at}
        if watcher is not None:
            updates["last_phase"] = watcher.phase_label
            if self.template.origin == "launched":
                updates["phases"] = dict(watcher.phases)
        updates.update(facts)
        return replace(self.template, **updates)  # type: ignore[arg-type]


def wait_for(wait: Wait, *, on_status: StatusCallback, on_record: RecordCallback) -> StartupRecord:
    """Wait until ready and return the record; every outcome is handed to ``on_record`` exactly once."""
    if wait.watcher is not None and wait.probe is not None:
        wait.watcher.ignore_requests(wait.probe.paths)  # the probe's own access-log lines are not progress
    try:
        seconds = _until_ready(wait, on_status)
    except ServerStartupError as exc:
        on_record(wait.record("failed", time.monotonic(), error=str(exc), cause=exc.cause))
        raise
    except BaseException:  # Ctrl-C, or pytest-timeout cutting the wait
        on_record(wait.record("interrupted", time.monotonic()))
        raise
    finally:
        if wait.watcher is not None:
            wait.watcher.ignore_requests(())
    now = wait.started_at + seconds
    if wait.watcher is not None:
        wait.watcher.confirm_ready()
    if wait.template.origin == "launched":
        record = wait.record("ready", now, startup_seconds=seconds)
        record = replace(record, phases={**record.phases, "ready": seconds})
    else:
        record = wait.record("ready", now)
    on_record(record)
    return record


def _until_ready(wait: Wait, on_status: StatusCallback) -> float:
    """Seconds from the start to ready. Ready: the ready line was logged (where one is awaited), then the
    probe answered 200 (where there is one). Failure: see :class:`_Verdicts`."""
    verdicts = _Verdicts(wait)
    last_status, last_label = wait.started_at, None
    while True:
        now = time.monotonic()
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
        watcher = wait.watcher
        if watcher is not None and (watcher.phase_label != last_label or now - last_status >= STATUS_EVERY_SECONDS):
            on_status(f"[sglang {wait.template.profile}] {now - wait.started_at:.0f} s  {watcher.status(now)}")
            last_status, last_label = now, watcher.phase_label
        time.sleep(POLL_SECONDS)


class _Verdicts:
    """What one poll of a startup concludes: failed (and how), ready, or neither yet.

    Failure: the process exited; a traceback or fatal marker appeared while it is alive and no readiness
    followed within the settle time; a process of its tree that the server needs (a scheduler) died; its log
    showed nothing new for stall_timeout; or the startup timeout passed."""

    def __init__(self, wait: Wait) -> None:
        self.wait = wait
        self.last_probe = -PROBE_EVERY_SECONDS
        self.member_died_at: float | None = None
        self.last_peer_probe = -PROBE_EVERY_SECONDS

    def failure(self, now: float) -> ServerStartupError | None:
        wait, process, watcher = self.wait, self.wait.process, self.wait.watcher
        code = process.poll() if process is not None else None
        if code is not None:
            return _exited(wait, code)
        for peer in wait.peers:
            since = peer.watcher.failing_since
            if since is not None and now - since >= _settle_seconds(peer.watcher):
                return _failure(wait, f"{peer.name} crashed during startup (the server has been stopped on every "
                                      "node)", None, peer)
        failing_since = watcher.failing_since if watcher is not None else None
        if watcher is not None and failing_since is not None and now - failing_since >= _settle_seconds(watcher):
            return _failure(wait, "server crashed during startup (its process was still alive; the tree has been "
                                  "killed)", None)
        if process is not None and self.member_died_at is None and essential_death(process) is not None:
            self.member_died_at = now
        if self.member_died_at is not None and now - self.member_died_at >= CRASH_SETTLE_SECONDS:
            return _failure(wait, "a process of the server's tree died during startup (the tree has been killed)",
                            None)
        if now - wait.started_at > wait.timeout:
            return _timeout(wait)
        if watcher is not None and wait.stall_timeout is not None:
            return self.stall(now, watcher, wait.stall_timeout)
        return None

    def stall(self, now: float, watcher: LogWatcher, stall_timeout: float) -> ServerStartupError | None:
        """A node that has logged nothing for stall_timeout. Of several silent nodes the one furthest behind is
        named (rank 0 waits silently in its init for a node that never joined); where rank 0 is as far along,
        a silent other node is named before it."""
        waiting = [peer for peer in self.wait.peers if not peer.up]
        quiet = {id(peer): now - (peer.watcher.last_line_at or self.wait.started_at) for peer in waiting}
        quiet[id(watcher)] = now - (watcher.last_line_at or self.wait.started_at)
        if max(quiet.values()) < stall_timeout:
            return None
        behind = min(waiting, key=lambda p: (len(p.watcher.phases), -quiet[id(p)]), default=None)
        if behind is not None and len(behind.watcher.phases) <= len(watcher.phases):
            return _peer_stalled(self.wait, behind, quiet[id(behind)])
        return _stalled(self.wait, quiet[id(watcher)])

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
            return (ready_at if ready_at is not None else now) - wait.started_at
        # After the ready line, ask at once and on every poll: the probe is the last step.
        if wait.wait_for_line or now - self.last_probe >= PROBE_EVERY_SECONDS:
            self.last_probe = now
            if probe.ok():
                return time.monotonic() - wait.started_at
        return None

    def peers_up(self, now: float) -> bool:
        """Whether every other node's health server has answered 200 (each is asked at the probe pace)."""
        down = [peer for peer in self.wait.peers if not peer.up]
        if down and now - self.last_peer_probe >= PROBE_EVERY_SECONDS:
            self.last_peer_probe = now
            for peer in down:
                peer.up = peer.watcher.failing_since is None and (peer.probe is None or peer.probe.ok(timeout=1.0))
        return all(peer.up for peer in self.wait.peers)


def _exited(wait: Wait, code: int) -> ServerStartupError:
    """The process exited: named after the node whose log shows the first failure (rank 0 where it is first)."""
    watcher = wait.watcher
    for w in [watcher, *(p.watcher for p in wait.peers)]:
        if w is not None:
            w.poll(time.monotonic(), final=True)
    failing = [p for p in wait.peers if p.watcher.failing_since is not None]
    culprit = (min(failing, key=lambda p: p.watcher.failing_since or 0.0) if failing
               else next((p for p in wait.peers if p.watcher.diagnosis().root_causes), None))
    rank0_first = watcher is not None and watcher.failing_since is not None and (
        culprit is None or culprit.watcher.failing_since is None
        or watcher.failing_since <= culprit.watcher.failing_since)
    if culprit is not None and not rank0_first:
        return _failure(wait, f"{culprit.name} crashed and the server exited during startup", code, culprit)
    return _failure(wait, "server exited during startup", code)


def _settle_seconds(watcher: LogWatcher) -> float:
    """How long a logged failure may take to play out before the still-running process is called crashed.

    A usage error (argparse's `prog: error: ...`, click's `Error: ...`) always ends in exit code 2, but a
    process with torch loaded can take seconds to exit: wait for that exit, so the error says "exit code 2"."""
    return USAGE_EXIT_WAIT_SECONDS if watcher.failure_is_usage_error else CRASH_SETTLE_SECONDS


def _diagnosis(wait: Wait, code: int | None, peer: Peer | None = None) -> Diagnosis:
    watcher = peer.watcher if peer is not None else wait.watcher
    diagnosis = watcher.diagnosis(exit_code=code) if watcher is not None else Diagnosis(exit_code=code)
    diagnosis.died_first = died_first(wait.process)  # which process of the tree died first, and how
    return diagnosis


def _failure(wait: Wait, headline: str, code: int | None, peer: Peer | None = None) -> ServerStartupError:
    diagnosis = _diagnosis(wait, code, peer)
    return ServerStartupError(
        _on_node(wait, headline) if peer is None else headline, profile=wait.template.profile,
        log_path=peer.log_path if peer else wait.template.log_path,
        diagnosis=diagnosis,
        elapsed=time.monotonic() - wait.started_at, hints=wait.failure_hints(code, diagnosis), command=wait.command,
    )


def _timeout(wait: Wait) -> ServerStartupError:
    if wait.timeout_headline is not None:
        headline = wait.timeout_headline()
    else:
        headline = f"server was not ready within its startup timeout of {wait.timeout:.0f} s"
        probed = wait.probe.describe(time.monotonic()) if wait.probe is not None else None
        if probed:
            headline += f" ({probed})"
    return ServerStartupError(
        headline, profile=wait.template.profile, log_path=wait.template.log_path, diagnosis=_diagnosis(wait, None),
        elapsed=time.monotonic() - wait.started_at, hints=wait.timeout_hints(), command=wait.command,
    )


def _stalled(wait: Wait, quiet: float) -> ServerStartupError:
    phase = wait.watcher.phase_label if wait.watcher is not None else None
    probed = wait.probe.describe(time.monotonic()) if wait.probe is not None else None
    return ServerStartupError(
        _on_node(wait, f"no progress for {quiet:.0f} s in phase {phase or 'starting'} (stall_timeout "
                       f"{wait.stall_timeout:g} s: no new log line, phase or progress in that time"
                       + (f"; {probed}" if probed else "") + ")"),
        profile=wait.template.profile, log_path=wait.template.log_path, diagnosis=_diagnosis(wait, None),
        elapsed=time.monotonic() - wait.started_at, command=wait.command,
        hints=[*([f"the server logged its ready line, but {probed}: check the profile's health_path"]
                 if probed and wait.watcher is not None and wait.watcher.ready_at is not None else []),
               "a server that is still working logs something (a phase, a progress bar) more often than this: "
               "look at the last lines for what it waits on (NCCL init, a download, a lock)",
               "if this phase is legitimately silent for longer, raise stall_timeout in the profile "
               "(startup_timeout stays the hard cap)"],
    )


def _on_node(wait: Wait, headline: str) -> str:
    return f"{wait.node}: {headline}" if wait.node else headline


def _peer_stalled(wait: Wait, peer: Peer, quiet: float) -> ServerStartupError:
    rank0 = wait.watcher.phase_label if wait.watcher is not None else None
    return ServerStartupError(
        f"{peer.name} has logged nothing new for {quiet:.0f} s in phase {peer.watcher.phase_label or 'starting'}; "
        f"rank 0 is waiting in {rank0 or 'starting'} (stall_timeout {wait.stall_timeout:g} s)",
        profile=wait.template.profile, log_path=peer.log_path, diagnosis=_diagnosis(wait, None, peer),
        elapsed=time.monotonic() - wait.started_at, command=wait.command,
        hints=[f"{peer.name} never got past its phase while rank 0 waited for it: look at its log's last lines "
               "(the distributed init address and port reachable from it, its GPUs, its NCCL/gloo network)",
               "if this phase is legitimately silent for longer, raise stall_timeout in the profile"],
    )
