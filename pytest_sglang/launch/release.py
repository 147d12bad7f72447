"""A stopped server lets go of its GPUs and its port, or the plugin says which pid still holds what.

After a teardown, :func:`wait_released` waits (bounded) until none of the killed tree's pids holds GPU memory
(machine/gpus.py; skipped where there is no GPU) and nothing of the tree listens on its port. A process can
sit in the GPU driver's teardown for tens of seconds after SIGKILL (sglang#31281, #39545); the next server
launched on that GPU would fail to allocate memory, far from the cause.

Before a launch, :func:`wait_for_dying_holder` waits out a port still held by a predecessor that is on its
way out (stopped by this run, SIGKILL pending, exiting, or torn down by the reaper of a pytest that died),
and names it if the bound passes; a port held by anything else is check_port_free's "busy" error at once.

The bound is RELEASE_TIMEOUT_SECONDS (120 s, as SGLang's own SGLANG_WAIT_PORT_TIMEOUT); the environment
variable PYTEST_SGLANG_RELEASE_TIMEOUT overrides it.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import psutil

from pytest_sglang.envknobs import RELEASE_TIMEOUT_ENV, env_knobs
from pytest_sglang.errors import PortInUseError, ResourcesHeldWarning
from pytest_sglang.launch.members import TreeMembers, pid_alive
from pytest_sglang.launch.ports import listeners, port_is_open
from pytest_sglang.launch.process import OWNER_ENV, kill_tree, owned_processes
from pytest_sglang.machine.gpus import gpu_processes

RELEASE_TIMEOUT_SECONDS = 120.0
POLL_SECONDS = 0.5
NOTE_AFTER_SECONDS = 3.0  # a wait longer than this is said on the status line
REAPER_MODULE = "pytest_sglang.launch.reaper"
_SIGKILL_BIT = 1 << 8  # bit n-1 of /proc/PID/status's SigPnd and ShdPnd masks is signal n pending

_stopped: set[int] = set()  # pids of trees this process has torn down


def release_timeout() -> float:
    return env_knobs().release_timeout or RELEASE_TIMEOUT_SECONDS


class _Tree(Protocol):
    pid: int
    token: str

    def stop(self, grace: float = 30.0) -> int | None: ...


def stop_and_release(process: _Tree, *, grace: float, profile: str, host: str, port: int | None,
                     on_status: Callable[[str], None] | None = None) -> list[str]:
    """Stop the server's tree, then wait until its processes have left the GPUs and its port is free; warn
    (ResourcesHeldWarning) naming each pid and what it still holds once the bound passes. A tree that is not
    tracked here (on an ssh host: its pids and port are not this machine's) is only stopped."""
    members = getattr(process, "members", None)
    if not isinstance(members, TreeMembers):
        process.stop(grace=grace)
        return []
    pids = tree_pids(process.pid, process.token) | members.pids()
    names = members.names()
    process.stop(grace=grace)
    started = time.monotonic()
    held = wait_released(pids, host=host, port=port, names=names, on_status=on_status)
    if held:
        warnings.warn(ResourcesHeldWarning(held_message(profile, held, time.monotonic() - started)), stacklevel=2)
    return held


def kill_and_release(pid: int, token: str, *, grace: float, profile: str, host: str, port: int | None) -> list[str]:
    """:func:`stop_and_release` for a tree this process did not start (kept by --sglang-reuse, shared by xdist
    workers): found by its root pid and owner token."""
    pids = tree_pids(pid, token)
    kill_tree(pid, token, grace)
    started = time.monotonic()
    held = wait_released(pids, host=host, port=port)
    if held:
        warnings.warn(ResourcesHeldWarning(held_message(profile, held, time.monotonic() - started)), stacklevel=2)
    return held


def tree_pids(pid: int, token: str) -> set[int]:
    """The live pids of a server's tree: the root, its descendants, and whatever carries its owner token.
    Take them before the teardown; after it there is nothing left to ask."""
    pids = {pid}
    with contextlib.suppress(psutil.Error):
        pids.update(child.pid for child in psutil.Process(pid).children(recursive=True))
    pids.update(proc.pid for proc in owned_processes(token))
    return pids


def wait_released(pids: Iterable[int], *, host: str, port: int | None, names: Mapping[int, str] | None = None,
                  timeout: float | None = None, on_status: Callable[[str], None] | None = None) -> list[str]:
    """Wait until none of ``pids`` holds GPU memory and none listens on ``port``; return what each that still
    does holds when the bound passes (empty once all is released)."""
    pids = set(pids)
    _stopped.update(pids)
    bound = release_timeout() if timeout is None else timeout
    started = time.monotonic()
    noted = False
    while True:
        held = _held(pids, host, port, names or {})
        waited = time.monotonic() - started
        if not held or waited >= bound:
            return held
        if on_status is not None and not noted and waited >= NOTE_AFTER_SECONDS:
            on_status(f"waiting up to {bound:.0f} s for the stopped server to let go: {'; '.join(held)}")
            noted = True
        time.sleep(min(POLL_SECONDS, max(0.0, bound - waited)))


def held_message(profile: str, held: list[str], waited: float) -> str:
    return (f"[sglang {profile}] {waited:.0f} s after its server was stopped, it still holds resources: "
            f"{'; '.join(held)}. The next server on that GPU or port may fail to start. Look for the pid with "
            f"`nvidia-smi` or `ps -o pid,stat,cmd -p PID` (state D: stuck in the driver); "
            f"{RELEASE_TIMEOUT_ENV}=SECONDS changes how long the plugin waits.")


def wait_for_dying_holder(host: str, port: int, *, on_status: Callable[[str], None] | None = None,
                          timeout: float | None = None) -> None:
    """If the port is held only by processes on their way out, wait for them (bounded); raise PortInUseError
    naming them if they still hold it then. Any other holder is left to check_port_free's error."""
    if not port_is_open(host, port):
        return
    holders = listeners(port)
    why = [_dying(proc) for proc in holders]
    if not holders or not all(why):
        return
    bound = release_timeout() if timeout is None else timeout
    said = "; ".join(f"pid {proc.pid} ({reason})" for proc, reason in zip(holders, why, strict=True))
    if on_status is not None:
        on_status(f"port {host}:{port} is held by a server on its way out, {said}: waiting up to {bound:.0f} s")
    deadline = time.monotonic() + bound
    while port_is_open(host, port, timeout=0.2):
        if time.monotonic() >= deadline:
            raise PortInUseError(
                f"Port {host}:{port} is still held {bound:.0f} s later by a server that is on its way out: {said}"
                f"{_commands(holders)}. A process stuck in the GPU driver's teardown can take minutes; raise "
                f"{RELEASE_TIMEOUT_ENV}, or leave `port` out of the profile so a free port is chosen.")
        time.sleep(0.2)


def _held(pids: set[int], host: str, port: int | None, names: Mapping[int, str]) -> list[str]:
    held = []
    for use in gpu_processes() or []:
        if use.pid in pids:
            name = names.get(use.pid)
            held.append(use.describe().replace(f"pid {use.pid}", f"pid {use.pid} ({name})", 1) if name
                        else use.describe())
    if port and port_is_open(host, port, timeout=0.2):
        holders = listeners(port)
        ours = [proc for proc in holders if proc.pid in pids]
        if ours:
            held.append(f"port {port} is still listened on by pid {', '.join(str(p.pid) for p in ours)}")
        elif not holders and any(psutil.pid_exists(pid) for pid in pids):
            held.append(f"port {port} is still listened on (by a process of the stopped tree, it seems)")
    return held


def _dying(proc: psutil.Process) -> str | None:
    """Why this process is on its way out, or None if it is not known to be."""
    if proc.pid in _stopped:
        return "its server was stopped by this run"
    try:
        status = proc.status()
        if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return "exiting"
        if _sigkill_pending(proc.pid):
            return "SIGKILL pending" + (" in uninterruptible sleep" if status == psutil.STATUS_DISK_SLEEP else "")
        token = proc.environ().get(OWNER_ENV)
    except psutil.Error:
        return "exiting"
    if token and _reaper_tearing_down(token):
        return "the pytest that launched it is gone and its reaper is tearing the tree down"
    return None


def _sigkill_pending(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & _SIGKILL_BIT:
                    return True
    except (OSError, ValueError, IndexError):
        return False
    return False


def _reaper_tearing_down(token: str) -> bool:
    """A reaper (launch/reaper.py) for this owner token runs, and the pytest it guards is gone."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if REAPER_MODULE in cmdline and cmdline[-1:] == [token] and len(cmdline) >= 3:
            with contextlib.suppress(ValueError):
                if not pid_alive(int(cmdline[-3])):
                    return True
    return False


def _commands(holders: list[psutil.Process]) -> str:
    parts = []
    for proc in holders:
        with contextlib.suppress(psutil.Error):
            parts.append(f"pid {proc.pid}: {' '.join(proc.cmdline()[:6])}")
    return f" ({'; '.join(parts)})" if parts else ""
