"""Start a server process in its own session with its log in a file, and tear down its whole tree.

No process may outlive a test session. Three nets catch descendants:
1. the process group (SGLang's schedulers and vLLM's workers stay in it unless they call setsid);
2. an owner token in every descendant's environment, so processes that left the group and were reparented
   to init are still found (psutil reads /proc/PID/environ);
3. a reaper process (pytest_sglang.launch.reaper) that kills the tree if pytest itself is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import psutil

from pytest_sglang.errors import CpuAffinityError
from pytest_sglang.launch.logdir import open_log
from pytest_sglang.launch.members import TreeMembers, leader_exited

OWNER_ENV = "PYTEST_SGLANG_OWNER"

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> Callable[[], None] | None:
    """Popen's ``preexec_fn`` for a process started outside the reaper's nets (a test's or a benchmark's own
    simulator): the kernel sends it ``sig`` when the caller dies, however it dies, SIGKILL included.

    The kernel watches the calling thread, not the process, so the guard applies only from the main thread;
    elsewhere, and off Linux, it is None: no guard."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def guard() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:  # the parent died before the request took: nobody would signal
            os.kill(os.getpid(), sig)

    return guard



class ProcessTree(Protocol):
    """What the readiness loop and a launched server's liveness ask of its process tree, wherever it runs:
    :class:`ServerProcess` here, :class:`pytest_sglang.launch.remote.RemoteServer` on an ssh host."""

    pid: int
    token: str  # the owner token in every descendant's environment
    started_at: float  # time.monotonic() at launch

    def poll(self) -> int | None: ...

    def stop(self, grace: float = 30.0) -> int | None: ...


LEADER_EXIT_WAIT_SECONDS = 3.0


class ServerProcess:
    """One launched server: its process, its log file, and everything it spawned."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        reap_on_parent_death: bool = True,
        guardian_pid: int | None = None,
        token: str | None = None,
        reaper_scancel: Sequence[str] = (),
        cpus: Sequence[int] | None = None,
    ) -> None:
        """``guardian_pid``: the process whose death means nobody will tear this server down (default: this
        one; under pytest-xdist, the controller that owns the shared server). ``reaper_scancel``: scancel's
        arguments that end this server's SLURM job, which the reaper runs too (launch/slurm.py). ``cpus``: the
        tree's CPU affinity, set before the server runs a line, so every worker it forks inherits it."""
        self.argv = list(argv)
        self.log_path = log_path
        self.token = token or uuid.uuid4().hex
        # Truncate: a previous run's log in a reused --sglang-log-dir holds a ready line of its own. Private (0600):
        # servers log their arguments, an --api-key included.
        with open_log(log_path) as log, pinned(cpus):
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**env, OWNER_ENV: self.token, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
                close_fds=True,
            )
        self.started_at = time.monotonic()
        self.pid = self.popen.pid
        self.members = TreeMembers(self.popen, self.started_at)  # who is in the tree; who died first
        self._reaper: subprocess.Popen[bytes] | None = None
        if reap_on_parent_death:
            self._reaper = subprocess.Popen(
                [sys.executable, "-m", "pytest_sglang.launch.reaper", str(guardian_pid or os.getpid()), str(self.pid),
                 self.token, *reaper_scancel],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )

    def poll(self) -> int | None:
        self.members.check()
        code = self.popen.poll()
        if code is None and leader_exited(self.pid):
            # SIGKILLed: its main thread is a zombie while its other threads unwind (0.5-1 s for SGLang's
            # launcher), and waitpid says nothing until they have; a check in that window must not see it alive
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.popen.wait(timeout=LEADER_EXIT_WAIT_SECONDS)
        return code

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def stop(self, grace: float = 30.0) -> int | None:
        """SIGTERM the group, wait up to `grace` s, SIGKILL the group, then sweep escaped descendants.

        The reaper is dismissed only once the tree is gone: a stop cut short (pytest-timeout's signal, a
        second Ctrl-C) leaves it on guard, and it kills the tree when pytest exits."""
        self.members.freeze()
        kill_tree(self.pid, self.token, grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        if self._reaper is not None and self._reaper.poll() is None:
            self._reaper.kill()
            self._reaper.wait()
        return self.popen.returncode


@contextlib.contextmanager
def pinned(cpus: Sequence[int] | None) -> Iterator[None]:
    """This thread on ``cpus`` while the block runs: a child forked here starts with that affinity, and no
    other thread of pytest is moved (Linux keeps the mask per thread)."""
    if cpus is None:
        yield
        return
    if not hasattr(os, "sched_setaffinity"):
        raise CpuAffinityError(f"cpus {list(cpus)} cannot be applied: this platform ({sys.platform}) has no CPU "
                               "affinity; drop `cpus` here.")
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        raise CpuAffinityError(
            f"cpus {list(cpus)} cannot be applied on this machine ({exc.strerror}): it has {os.cpu_count()} CPUs "
            f"(0-{(os.cpu_count() or 1) - 1}), not all of them ours to use ({len(before)} are this process's); "
            "name CPUs that `taskset -pc $$` shows.") from None
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def owned_processes(token: str) -> list[psutil.Process]:
    """Every live process whose environment carries this owner token."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(OWNER_ENV) == token:
                found.append(proc)
    return found


def kill_tree(pid: int, token: str, grace: float) -> None:
    """Stop a server's whole tree: polite first, the root before its children, then certain.

    The root alone is asked first: a server shuts its own children down in order. SGLang's launcher, sent
    SIGTERM, drains and tells its schedulers to exit; a scheduler that got SIGTERM itself dies with -15 first,
    and SGLang's subprocess watchdog takes that for a crash (it logs "Subprocess scheduler_0 crashed with exit
    code -15" and SIGQUITs the tree). What is left once the root has gone, or the grace half spent, gets SIGTERM
    too; what is left after the grace, SIGKILL."""
    members = _tree(pid, token)
    deadline = time.monotonic() + grace
    root = [p for p in members if p.pid == pid]
    with contextlib.suppress(psutil.Error):
        for proc in root:
            proc.terminate()
    _wait_gone(root, grace / 2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    for proc in members:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _wait_gone(members, max(deadline - time.monotonic(), 0.0))
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    # A descendant may have spawned more processes during the grace period: look again.
    for _ in range(3):
        alive = _tree(pid, token)
        if not alive:
            return
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)


def _wait_gone(procs: list[psutil.Process], timeout: float) -> None:
    """psutil.wait_procs, with a zombie counted as gone: the root of a tree that another process started (an
    xdist worker's server, a kept one) stays a zombie until that parent reaps it, and would hold the whole grace.
    Our own children are still reaped on the way."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _is_running(p)]
    while alive and time.monotonic() < deadline:
        psutil.wait_procs(alive, timeout=0.05)
        alive = [p for p in alive if _is_running(p)]


def _tree(pid: int, token: str) -> list[psutil.Process]:
    members: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        members[root.pid] = root
        for child in root.children(recursive=True):
            members[child.pid] = child
    for proc in owned_processes(token):
        members.setdefault(proc.pid, proc)
    return [p for p in members.values() if _is_running(p)]


def _is_running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
