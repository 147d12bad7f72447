"""srun's own lines (PROFILE.srun.log), read: why srun gave up, and each task's end as it reports it, told apart
from the noise of the step's stop."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


def srun_said(path: Path) -> list[str]:
    """srun's own lines (``srun: error: node2: task 1: Killed``), without its PMIx noise."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.startswith("srun: ") and "PMIx" not in line]


def cause(said: list[str]) -> str:
    """srun's line that says why it gave up: its fatal error, else its last error, else its first word."""
    fatal = [line for line in said if line.startswith("srun: fatal")]
    errors = [line for line in said if line.startswith("srun: error")]
    return (fatal or errors or said[:1] or ["srun said nothing"])[-1]


_TASK_END = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+)")
_EXIT_CODE = re.compile(r"Exited with exit code (\d+)")
_SIGNALS = {"Killed": 9, "Terminated": 15, "Interrupt": 2, "Aborted": 6, "Segmentation fault": 11, "Hangup": 1,
            "Bus error": 7, "Floating point exception": 8, "Quit": 3}
# srun's own words once it is stopping the step: its --kill-on-bad-exit after a task's bad exit, or a cancel
# (the plugin's scancel, Ctrl-C). Every task end after one of these may be that stop's doing.
_STOPPING = ("Terminating StepId", "Job step aborted", "forcing job termination", "Force Terminated",
             "CANCELLED", "Cancelled", "interrupt (one more within", "Sending Ctrl-C", "got SIGCONT")


@dataclass(frozen=True)
class TaskEnd:
    """One task's end as srun reports it: ``srun: error: node2: task 1: Exited with exit code 1``."""

    rank: int
    host: str
    what: str  # "Exited with exit code 1", "Killed", "Terminated"
    line: str  # srun's whole line
    after_stop: bool  # reported once srun had begun stopping the step: maybe the stop's doing, not its own

    @property
    def code(self) -> int | None:
        """The task's own exit status, in Popen's convention (negative: killed by that signal); None: unknown."""
        found = _EXIT_CODE.search(self.what)
        if found:
            return int(found.group(1))
        return next((-number for word, number in _SIGNALS.items() if self.what.startswith(word)), None)


def task_ends(said: list[str]) -> list[TaskEnd]:
    """Every task end srun reported, in its order (``tasks 0-1: ...`` is one per task)."""
    ends: list[TaskEnd] = []
    stopping = False
    for line in said:
        found = _TASK_END.match(line)
        if found is None:
            stopping = stopping or any(word in line for word in _STOPPING)
            continue
        for rank in _ranks(found.group(2)):
            ends.append(TaskEnd(rank=rank, host=found.group(1), what=found.group(3), line=line,
                                after_stop=stopping))
        stopping = True  # --kill-on-bad-exit: srun stops the others after the first bad end
    return ends


def _ranks(text: str) -> list[int]:
    ranks: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        if first.isdigit():
            ranks.extend(range(int(first), int(last) + 1 if last.isdigit() else int(first) + 1))
    return ranks


def is_stop_noise(line: str) -> bool:
    """One of srun's lines about the stop itself (its own, or the plugin's cancel): no cause of anything."""
    return _TASK_END.match(line) is None and any(word in line for word in _STOPPING)


def failed_task(said: list[str]) -> tuple[int, str, str] | None:
    """(rank, host, what) of the first task srun saw fail: ``srun: error: node2: task 1: Exited with ...``."""
    ends = task_ends(said)
    return (ends[0].rank, ends[0].host, ends[0].what) if ends else None
