"""The readiness loop's verdicts, in-process: a fake clock steps it, a fed watcher plays a server's log, a fake
tree exits when told, a fake probe answers what it is told. Each case is a script of (seconds, event)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_sglang.config.kinds import SGLANG
from pytest_sglang.errors import ServerStartupError
from pytest_sglang.server.ready import (
    CRASH_SETTLE_SECONDS,
    POLL_SECONDS,
    USAGE_EXIT_WAIT_SECONDS,
    Peer,
    Server,
    Subject,
    probe_startup,
    server_startup,
    wait_for,
)
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.watch import LogTail, LogWatcher

T0 = 500.0
READY_LINE = "[2026-02-04 11:30:33] The server is fired up and ready to roll!"
CRASH = ["[2026-02-04 11:30:20 TP0] Scheduler hit an exception: Traceback (most recent call last):",
         '  File "/sgl/scheduler.py", line 10, in run',
         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
Event = Callable[[], None]


class FakeClock:
    """time.monotonic and time.sleep for the loop: sleeping moves the time on and plays what is due by then."""

    def __init__(self, script: list[tuple[float, Event]]) -> None:
        self.now = T0
        self.slept = 0
        self._script = sorted(script, key=lambda step: step[0])

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += 1
        while self._script and T0 + self._script[0][0] <= self.now:
            self._script.pop(0)[1]()


@dataclass
class FakeTree:
    """A process tree that runs until told its exit code."""

    pid: int = 4242
    token: str = "token"
    started_at: float = T0
    code: int | None = None

    def poll(self) -> int | None:
        return self.code

    def stop(self, grace: float = 30.0) -> int | None:
        return self.code


@dataclass
class FakeProbe:
    """A health check that answers 200 once told to; counts its asks."""

    answers: bool = False
    asked: int = 0
    last: str | None = None
    paths: tuple[str, ...] = ("/health",)
    url: str = "http://127.0.0.1:1/health"

    @property
    def path(self) -> str:
        return self.paths[0]

    def ok(self, timeout: float = 2.0) -> bool:
        self.asked += 1
        self.last = "HTTP 200" if self.answers else "HTTP 503"
        return self.answers

    def describe(self, now: float) -> str | None:
        return None if self.last is None else f"GET {self.path} got {self.last}"

    @property
    def last_status(self) -> int | None:
        return None if self.last is None else int(self.last.split()[-1])

    def refusing_for(self, now: float) -> float | None:
        return None  # it answers 503 (starting) or 200


@dataclass
class Startup:
    """One startup under test and what the loop reported."""

    tmp: Path
    tree: FakeTree | None = field(default_factory=FakeTree)
    probe: FakeProbe | None = field(default_factory=FakeProbe)
    records: list[StartupRecord] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.watcher = self.node_watcher("rank0")

    def node_watcher(self, name: str) -> LogWatcher:
        log = self.tmp / f"{name}.log"
        log.write_bytes(b"")  # nothing on disk: the script feeds the lines
        return LogWatcher(SGLANG, started_at=T0, tail=LogTail(log))

    def log(self, *lines: str, watcher: LogWatcher | None = None) -> Event:
        w = watcher or self.watcher
        return lambda: w.feed(list(lines), self.clock.now)

    def run(self, script: list[tuple[float, Event]], **wait: object) -> StartupRecord:
        """Compose the startup as its origin would: ``watcher=None`` is a server not started here (its probe
        alone); else a launched one, with ``peers``, ``node``, ``stall_timeout``, ``wait_for_line``."""
        self.clock = FakeClock(script)
        template = StartupRecord(profile="tiny", kind="sglang", origin="launched", outcome="ready",
                                 host="127.0.0.1", port=1, log_path=self.tmp / "rank0.log")
        settings: dict[str, object] = {"timeout": 600.0, "watcher": self.watcher, "wait_for_line": True, **wait}
        watcher, timeout = settings.pop("watcher"), float(settings.pop("timeout"))  # type: ignore[arg-type]
        if watcher is None:
            assert not settings.pop("wait_for_line")  # no log of its own, so no line to wait for
            startup = probe_startup(Subject(template=template, started_at=T0), probe=self.probe, timeout=timeout)
        else:
            server = Server(template=template, started_at=T0, node=str(settings.pop("node", "")),
                            process=self.tree, watcher=watcher)  # type: ignore[arg-type]
            startup = server_startup(server, timeout=timeout, probe=self.probe,
                                     stall_timeout=settings.pop("stall_timeout", None),  # type: ignore[arg-type]
                                     await_line=bool(settings.pop("wait_for_line")),
                                     peers=settings.pop("peers", ()))  # type: ignore[arg-type]
        assert not settings, f"not a setting of a startup: {settings}"
        return wait_for(startup, on_status=self.statuses.append, on_record=self.records.append, clock=self.clock,
                        sleep=self.clock.sleep)

    def fails(self, script: list[tuple[float, Event]], **wait: object) -> ServerStartupError:
        with pytest.raises(ServerStartupError) as caught:
            self.run(script, **wait)
        assert [r.outcome for r in self.records] == ["failed"]
        assert self.records[0].error == str(caught.value)
        return caught.value

    def answer(self) -> None:
        assert self.probe is not None
        self.probe.answers = True


@pytest.fixture
def startup(tmp_path: Path) -> Startup:
    return Startup(tmp_path)


def test_ready_after_the_ready_line_and_the_probe(startup: Startup) -> None:
    record = startup.run([(3.0, startup.log("[2026 TP0] Load weight begin. avail mem=78.58 GB")),
                          (40.0, startup.log(READY_LINE)), (41.0, startup.answer)])
    assert record.outcome == "ready" and startup.records == [record]
    assert record.startup_seconds == pytest.approx(41.0, abs=2 * POLL_SECONDS)
    assert record.phases["load_weights"] == pytest.approx(3.0, abs=2 * POLL_SECONDS)
    assert record.phases["ready"] == record.startup_seconds
    assert startup.watcher.phase_label == "ready"
    assert any("loading weights" in line for line in startup.statuses)


def test_the_probe_is_not_asked_before_the_ready_line(startup: Startup) -> None:
    assert startup.probe is not None
    startup.probe.answers = True  # a server whose /health answers while it still loads
    record = startup.run([(20.0, startup.log(READY_LINE))])
    assert record.startup_seconds == pytest.approx(20.0, abs=2 * POLL_SECONDS)
    assert startup.probe.asked == 1


def test_without_a_ready_line_the_probe_is_asked_at_its_own_pace(startup: Startup) -> None:
    startup.watcher = startup.node_watcher("generic")
    record = startup.run([(10.0, startup.answer)], wait_for_line=False)
    assert startup.probe is not None
    assert record.startup_seconds == pytest.approx(10.0, abs=0.3)
    assert startup.probe.asked < startup.clock.slept / 5  # not on every poll


def test_a_process_that_exits_fails_at_once_with_its_code_and_root_cause(startup: Startup) -> None:
    assert startup.tree is not None
    tree = startup.tree
    error = startup.fails([(5.0, startup.log(*CRASH)), (5.1, lambda: setattr(tree, "code", 1))])
    assert "server exited during startup" in str(error)
    assert error.diagnosis.exit_code == 1
    assert any("CUDA out of memory" in cause for cause in error.diagnosis.root_causes)
    assert error.elapsed == pytest.approx(5.1, abs=2 * POLL_SECONDS)


def test_a_crash_in_a_live_process_fails_once_it_has_settled(startup: Startup) -> None:
    error = startup.fails([(5.0, startup.log(*CRASH))])
    assert "crashed during startup (its process was still alive" in str(error)
    assert error.elapsed == pytest.approx(5.0 + CRASH_SETTLE_SECONDS, abs=3 * POLL_SECONDS)


def test_a_usage_error_waits_for_the_exit_code(startup: Startup) -> None:
    assert startup.tree is not None
    tree = startup.tree
    error = startup.fails([(1.0, startup.log("usage: launch_server.py [-h]",
                                             "launch_server.py: error: unrecognized arguments: --bogus")),
                           (4.0, lambda: setattr(tree, "code", 2))])
    assert error.diagnosis.exit_code == 2 and 4.0 < USAGE_EXIT_WAIT_SECONDS
    assert "exited" in str(error)


def test_a_crash_is_never_called_ready(startup: Startup) -> None:
    startup.answer()  # the HTTP server still answers while the scheduler's traceback plays out
    error = startup.fails([(5.0, startup.log(*CRASH, READY_LINE))])
    assert "crashed" in str(error)


def test_silence_past_stall_timeout_names_the_phase(startup: Startup) -> None:
    error = startup.fails([(2.0, startup.log("[2026 TP0] Init torch distributed begin."))], stall_timeout=30.0)
    assert "no progress for 30 s in phase initialising torch distributed" in str(error)
    assert error.elapsed == pytest.approx(32.0, abs=2 * POLL_SECONDS)


def test_progress_lines_keep_a_slow_phase_alive_until_the_hard_timeout(startup: Startup) -> None:
    bar = "Loading safetensors checkpoint shards:  {}% Completed | {}/64"
    script = [(float(t), startup.log(bar.format(t, t))) for t in range(1, 64)]
    error = startup.fails(script, stall_timeout=10.0, timeout=60.0)
    assert "not ready within its startup timeout of 60 s" in str(error)
    assert error.elapsed == pytest.approx(60.0, abs=2 * POLL_SECONDS)


def test_a_probe_failing_after_the_ready_line_is_named_at_the_timeout(startup: Startup) -> None:
    error = startup.fails([(5.0, startup.log(READY_LINE))], timeout=20.0)
    assert "startup timeout of 20 s (GET /health got HTTP 503)" in str(error)
    assert startup.probe is not None and startup.probe.asked > 100  # asked on every poll after the line


def test_an_interrupted_wait_reports_its_record_and_goes_on(startup: Startup) -> None:
    def interrupt() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        startup.run([(7.0, interrupt)])
    assert [(r.outcome, r.elapsed) for r in startup.records] == [("interrupted", pytest.approx(7.0, abs=0.05))]


def test_a_server_not_started_here_has_no_startup_seconds(startup: Startup) -> None:
    startup.tree = None
    startup.answer()
    record = startup.run([], watcher=None, wait_for_line=False)
    assert record.outcome == "ready" and record.startup_seconds is None and record.phases == {}


def peer(startup: Startup, name: str) -> Peer:
    return Peer(name=name, watcher=startup.node_watcher(name), probe=FakeProbe(), log_path=startup.tmp / name)


def test_ready_waits_for_every_peer(startup: Startup) -> None:
    node1 = peer(startup, "node 1 (b)")
    assert node1.probe is not None
    probe = node1.probe
    record = startup.run([(5.0, startup.log(READY_LINE)), (5.0, startup.answer),
                          (9.0, lambda: setattr(probe, "answers", True))], peers=[node1])
    assert record.startup_seconds == pytest.approx(9.0, abs=0.3) and node1.up


def test_a_peer_crash_names_the_peer_and_its_log(startup: Startup) -> None:
    node1 = peer(startup, "node 1 (b)")
    error = startup.fails([(3.0, startup.log(*CRASH, watcher=node1.watcher))], peers=[node1])
    assert str(error).startswith("[sglang tiny] node 1 (b) crashed during startup")
    assert error.log_path == node1.log_path


def test_a_silent_peer_behind_rank0_is_named_as_the_stall(startup: Startup) -> None:
    node1 = peer(startup, "node 1 (b)")
    error = startup.fails([(1.0, startup.log("[2026 TP0] Init torch distributed begin."))],
                          peers=[node1], stall_timeout=20.0, node="node 0 (a)")
    assert "node 1 (b) has logged nothing new for 20 s" in str(error)
    assert "rank 0 is waiting in initialising torch distributed" in str(error)


def test_a_rank0_exit_with_an_earlier_peer_crash_blames_the_peer(startup: Startup) -> None:
    assert startup.tree is not None
    tree = startup.tree
    node1 = peer(startup, "node 1 (b)")
    error = startup.fails([(2.0, startup.log(*CRASH, watcher=node1.watcher)),
                           (2.5, lambda: setattr(tree, "code", 1))], peers=[node1])
    assert str(error).startswith("[sglang tiny] node 1 (b) crashed and the server exited during startup")
