"""The members of a running server's process tree, and which of them died first, how.

SGLang's main process outlives a scheduler that was SIGKILLed (by the OOM killer, or by hand) and at best
says "SIGQUIT received ... one child failed"; vLLM's API server says "Server exited unexpectedly". The tree
knows better: :class:`TreeMembers` keeps the members it has seen, and notices the first to vanish, with its
exit status where that is knowable (our own child, the root, is waited for; another member is read while it
is a zombie, from /proc on Linux; otherwise it is only "gone").

Cheap enough to call on every readiness poll: ``check()`` looks at the known members at most every
CHECK_SECONDS (one /proc read each) and looks for new ones (the root's descendants) every RESCAN_SECONDS (more
often in the first seconds).
``ServerProcess.poll()`` calls it, so the readiness loop and every liveness check keep it current.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from dataclasses import dataclass
from typing import Protocol

import psutil

from pytest_sglang.errors import describe_exit

CHECK_SECONDS = 0.05
FIRST_RESCAN_SECONDS = 0.1  # the rescan interval starts here and doubles up to RESCAN_SECONDS: a server
RESCAN_SECONDS = 2.0  # spawns its ranks in its first second, and they are seen before the first test kills one
SIM_WORKER = "pytest_sglang.sim.worker"
TERMINATED = (-signal.SIGTERM, 128 + signal.SIGTERM)  # killed by SIGTERM, or exited as its handler does
KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)
_LINUX = sys.platform.startswith("linux")


class _Root(Protocol):
    pid: int

    def poll(self) -> int | None: ...


@dataclass(frozen=True)
class Member:
    """One process of the tree, as first seen."""

    pid: int
    ident: float  # start time: the same pid later is another process
    role: str | None  # sglang::scheduler_TP1, VLLM::EngineCore_DP0, the simulator's scheduler_TP1, torchrun's rank1
    command: str  # the first words of its command line
    root: bool = False

    @property
    def name(self) -> str:
        return "the server's main process" if self.root else self.role or self.command

    @property
    def label(self) -> str:
        return f"{self.name} (pid {self.pid})"


@dataclass(frozen=True)
class Death:
    """A member that vanished while the server ran."""

    member: Member
    status: int | None  # Popen's convention (negative: killed by that signal); None: not knowable
    after: float  # seconds after launch when it was noticed

    @property
    def notable(self) -> bool:
        """Worth naming: the root, a process with a role, or any other that exited badly (a helper that
        ran `nvidia-smi` and exited is not news)."""
        return self.member.root or self.member.role is not None or self.status not in (None, 0)

    def describe(self) -> str:
        how = describe_exit(self.status) if self.status is not None else "gone (its exit status is not ours to read)"
        return f"{self.member.label}: {how}, noticed {self.after:.1f} s after launch"


class TreeMembers:
    """The server's tree while it runs: who is in it, and who left first."""

    def __init__(self, root: _Root, started_at: float) -> None:
        self._root = root
        self._started_at = started_at
        self._alive: dict[int, Member] = {}
        self._members: dict[int, Member] = {}  # everyone seen, alive or not
        self.deaths: list[Death] = []  # in the order noticed; one check's deaths share their `after`
        self._frozen = False
        self._next_check = 0.0
        self._next_rescan = 0.0
        self._rescan_every = FIRST_RESCAN_SECONDS
        self._add(root.pid, root=True)

    def check(self, now: float | None = None) -> None:
        """Notice members that died since the last check, and (less often) members that joined."""
        now = time.monotonic() if now is None else now
        if self._frozen or now < self._next_check:
            return
        self._next_check = now + CHECK_SECONDS
        if now >= self._next_rescan:
            self._next_rescan = now + self._rescan_every
            self._rescan_every = min(2 * self._rescan_every, RESCAN_SECONDS)
            self._rescan()
        for pid, member in list(self._alive.items()):
            if member.root:  # our own child: waited for, so its status is known
                code = self._root.poll()
                state: tuple[str, int | None] | None = None if code is None else ("exited", code)
            else:
                state = _state(member)
            if state is None:
                continue
            del self._alive[pid]
            self.deaths.append(Death(member, state[1], now - self._started_at))

    def freeze(self) -> None:
        """The teardown begins: members that vanish from now on were killed by us, not news."""
        self._frozen = True

    def pids(self) -> set[int]:
        """Every pid this tree has had (the GPU-release check after the teardown asks about each)."""
        return set(self._members)

    def names(self) -> dict[int, str]:
        """pid -> role (or command line) of every member seen, to name a pid in a message."""
        return {m.pid: m.name for m in self._members.values()}

    def first_deaths(self) -> list[Death]:
        """The notable deaths of the first check that noticed any (several when they went together)."""
        notable = [d for d in self.deaths if d.notable]
        return [d for d in notable if d.after == notable[0].after] if notable else []

    def essential_death(self) -> Death | None:
        """The first member with a role (a scheduler, an engine core, a detokenizer) that died: without it
        the server cannot serve, whether or not its main process has noticed."""
        return next((d for d in self.deaths if d.member.role is not None and not d.member.root), None)

    def describe_first(self) -> str | None:
        """One line for an error: which process of the tree died first and how. None if none has, or if the
        main process went alone (its exit code is in the error already)."""
        self._next_check = 0.0
        self.check()  # a last look: the error is being written now
        batch = self.first_deaths()
        if not batch or (len(batch) == 1 and batch[0].member.root):
            return None
        batch.sort(key=_likelier_first)
        tied = [d for d in batch if _likelier_first(d) == _likelier_first(batch[0])]
        others = batch[len(tied):]
        if len(tied) == 1:
            text = tied[0].describe()
        else:
            text = (f"not knowable: {' and '.join(_brief(d) for d in tied[:4])} were noticed gone together "
                    f"{tied[0].after:.1f} s after launch, with nothing to tell which went first")
        if not others:
            return text
        named = [_brief(d) for d in others[:4]]
        more = f" and {len(others) - 4} more" if len(others) > 4 else ""
        return f"{text}; with it: {', '.join(named)}{more}"

    def _rescan(self) -> None:
        try:
            children = psutil.Process(self._root.pid).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            known = self._members.get(child.pid)
            # A member first seen between its fork and its exec has its parent's command line and environment
            # then: one without a role is looked at again until it has one (its title, its torchrun RANK).
            if known is None or (known.role is None and child.pid in self._alive
                                 and (not _LINUX or _ident(child.pid) == known.ident)):
                self._add(child.pid, proc=child)

    def _add(self, pid: int, *, root: bool = False, proc: psutil.Process | None = None) -> None:
        try:
            proc = proc or psutil.Process(pid)
            cmdline = proc.cmdline()
            ident = _ident(pid) if _LINUX else proc.create_time()
        except psutil.Error:
            return
        if ident is None:
            return
        member = Member(pid, ident, role_of(cmdline) or (None if root else _torchrun_rank(proc)), _short(cmdline),
                        root=root)
        self._members[pid] = self._alive[pid] = member


def _likelier_first(death: Death) -> tuple[int, int]:
    """Of deaths noticed in one look, the lower the likelier first. A member with a role comes before the main
    process, and both before a helper without a role (a resource tracker): such helpers die with the tree.
    Then by status: one that could not be read (its parent reaped it at once, as SGLang's launcher and
    torchrun's agent do with the child that failed) before a failure of its own (an exit code, a SIGSEGV),
    before a SIGKILL (what a launcher sends the rest of the tree, or the OOM killer), before a SIGTERM (what a
    supervisor sends the survivors)."""
    member, status = death.member, death.status
    kind = 2 if member.role is None and not member.root else 1 if member.root else 0
    if status is None:
        how = 0
    elif status in TERMINATED:
        how = 3
    elif status in KILLED:
        how = 2
    else:
        how = 1
    return kind, how


def _brief(death: Death) -> str:
    how = f", {describe_exit(death.status)}" if death.status is not None else ", gone"
    return f"{death.member.name} (pid {death.member.pid}{how})"


def died_first(process: object) -> str | None:
    """:meth:`TreeMembers.describe_first` of a process tree that is tracked here (a local ServerProcess);
    None for one that is not (a tree on an ssh host)."""
    members = getattr(process, "members", None)
    return members.describe_first() if isinstance(members, TreeMembers) else None


def essential_death(process: object) -> Death | None:
    """:meth:`TreeMembers.essential_death` of a process tree tracked here; None for one that is not."""
    members = getattr(process, "members", None)
    return members.essential_death() if isinstance(members, TreeMembers) else None


def role_of(cmdline: list[str]) -> str | None:
    """The role a server gave a process: its setproctitle title (``sglang::scheduler_TP0``,
    ``VLLM::EngineCore_DP0``), or the simulator worker's role argument."""
    if not cmdline:
        return None
    first = cmdline[0].split(" ")[0]
    if "::" in first and "/" not in first:
        return first
    for i, part in enumerate(cmdline[:-1]):
        if part == SIM_WORKER:
            return cmdline[i + 1]
    return None


def _torchrun_rank(proc: psutil.Process) -> str | None:
    """A torchrun worker's rank, "rank1", from the environment torch's elastic agent starts it with (RANK beside
    TORCHELASTIC_RUN_ID): its ranks share one command line, so that alone cannot tell them apart."""
    with contextlib.suppress(psutil.Error):
        env = proc.environ()
        rank = env.get("RANK", "")
        if "TORCHELASTIC_RUN_ID" in env and rank.isdigit():
            return f"rank{rank}"
    return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs (a zombie has ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def leader_exited(pid: int) -> bool:
    """Whether the main thread of a process that has not been reaped has exited (Linux shows it as a zombie
    while the process's other threads still unwind); False where /proc cannot tell."""
    stat = _proc_stat(pid)
    return stat is not None and stat[0] in ("Z", "X")


def _short(cmdline: list[str]) -> str:
    text = " ".join(cmdline[:6])
    return text if len(text) <= 100 else text[:99] + "\u2026"


def _state(member: Member) -> tuple[str, int | None] | None:
    """None while the member runs; else ("zombie", its exit status) or ("gone", None)."""
    if not _LINUX:
        try:
            proc = psutil.Process(member.pid)
            if proc.create_time() != member.ident:
                return "gone", None
            return ("gone", None) if proc.status() == psutil.STATUS_ZOMBIE else None
        except psutil.Error:
            return "gone", None
    stat = _proc_stat(member.pid)
    if stat is None or float(stat[19]) != member.ident:
        return "gone", None
    if stat[0] not in ("Z", "X"):
        return None
    raw = int(stat[49]) if len(stat) > 49 and stat[49].isdigit() else None
    if raw is None:
        return "zombie", None
    return "zombie", -(raw & 0x7F) if raw & 0x7F else (raw >> 8) & 0xFF


def _ident(pid: int) -> float | None:
    stat = _proc_stat(pid)
    return float(stat[19]) if stat is not None else None


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, ...]; index 19 is the start time, 49 the exit
    code (in waitpid's form, for a zombie)."""
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
        return data[data.rindex(")") + 2:].split()
    return None


__all__ = ["Death", "Member", "TreeMembers", "died_first", "essential_death", "leader_exited", "pid_alive",
           "role_of"]
