"""An inner pytest run that a fault benchmark starts (fault_matrix.py, fleet_faults.py): its output lines, each
with the monotonic time it arrived, read by a thread as they come, and its exit."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Run:
    """One inner pytest run: its output lines with the monotonic time each arrived, and its exit status."""

    started: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    returncode: int | None = None
    ended: float | None = None
    reader: threading.Thread | None = field(default=None, repr=False)

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, pattern: str) -> tuple[float, str] | None:
        rx = re.compile(pattern)
        return next(((t, line) for t, line in list(self.lines) if rx.search(line)), None)

    def marker(self, name: str) -> float | None:
        """The monotonic time an inner test printed after NAME (e.g. KILLED-AT 12345.6)."""
        hit = self.first(rf"{name} \d")
        return float(hit[1].split(name, 1)[1].split()[0]) if hit else None


def follow(proc: subprocess.Popen[str]) -> Run:
    """The Run of ``proc`` (started with its stdout piped, as text), its lines read by a thread as they come."""
    run = Run(started=time.monotonic())

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            run.lines.append((time.monotonic(), line.rstrip("\n")))

    run.reader = threading.Thread(target=read, daemon=True)
    run.reader.start()
    return run
