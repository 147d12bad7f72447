"""A server this session did not start (kept by --sglang-reuse, or another xdist worker's) is watched through its
log as a launched one is: a crash it logs and does not survive is its death, with the root cause."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_sglang.config.kinds import SGLANG
from pytest_sglang.server.handle import WatchedPidLiveness
from pytest_sglang.watch import LogTail, LogWatcher

CRASH = ("[2026-02-04 11:30:20 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
         '  File "/sgl/scheduler.py", line 10, in run\n'
         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")


class Health:
    def __init__(self) -> None:
        self.answers = True
        self.last: str | None = None
        self.url = "http://127.0.0.1:1/health"

    def ok(self, timeout: float = 2.0) -> bool:
        self.last = "HTTP 200" if self.answers else "connection refused"
        return self.answers


@pytest.fixture
def server() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def watched(pid: int, log: Path, health: Health) -> WatchedPidLiveness:
    watcher = LogWatcher(SGLANG, started_at=0.0, tail=LogTail(log))
    return WatchedPidLiveness("kept", pid, log, watcher, health, hint="run again")  # type: ignore[arg-type]


def test_a_logged_crash_that_stops_the_answers_is_its_death(server: subprocess.Popen[bytes], tmp_path: Path) -> None:
    log, health = tmp_path / "kept.log", Health()
    log.write_text("[2026-02-04 11:30:33] The server is fired up and ready to roll!\n")
    liveness = watched(server.pid, log, health)
    assert liveness.death() is None and not liveness.logged_crash()
    with log.open("a") as fh:
        fh.write(CRASH)
    assert liveness.logged_crash()
    assert liveness.death() is None  # it still answers: it may survive
    health.answers = False
    error = liveness.death()
    assert error is not None and "logged a crash and stopped answering" in str(error)
    assert any("CUDA out of memory" in cause for cause in error.diagnosis.root_causes)
    assert error.hints == ["run again"]


def test_a_survived_crash_is_not_seen_again(server: subprocess.Popen[bytes], tmp_path: Path) -> None:
    log = tmp_path / "kept.log"
    log.write_text(CRASH)
    liveness = watched(server.pid, log, Health())
    assert liveness.logged_crash()
    liveness.survived()
    assert not liveness.logged_crash()


def test_its_pid_ending_is_its_death(server: subprocess.Popen[bytes], tmp_path: Path) -> None:
    log = tmp_path / "kept.log"
    log.write_text("")
    liveness = watched(server.pid, log, Health())
    server.kill()
    server.wait()
    error = liveness.death()
    assert error is not None and f"server (pid {server.pid}) died during the session" in str(error)
