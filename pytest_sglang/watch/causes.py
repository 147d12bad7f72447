"""The extractor's records: a root cause (and how it is shown), an open traceback, a traceback read in reverse
order, an exception line seen on its own.

One job: hold what the extractor (extractor.py) knows about each source between lines, and render a cause as
the block the error message shows: the exception line, "(raised on TP0, TP1)", "caused by: ...", the last
frames with their code lines.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["UNKNOWN", "Cause", "OpenTraceback", "Orphan", "Reversed"]

UNKNOWN = "-"  # key for lines whose writer cannot be told


@dataclass
class Cause:
    headline: str
    norm: str
    tier: int
    order: int
    sources: list[str] = field(default_factory=list)
    frames: list[tuple[str, str | None]] = field(default_factory=list)
    dropped_frames: int = 0
    causes: list[str] = field(default_factory=list)
    count: int = 1
    more_sources: int = 0

    def render(self) -> str:
        out = [self.headline]
        named = [s for s in self.sources if s != UNKNOWN]
        if len(named) > 1 or (named and named[0] != "main"):
            extra = f" and {self.more_sources} more" if self.more_sources else ""
            out.append(f"(raised on {', '.join(named)}{extra})")
        for cause in self.causes:
            out.append(f"caused by: {cause}")
        if self.dropped_frames:
            out.append(f"  ... {self.dropped_frames} earlier frame(s) not shown")
        for frame, code in self.frames:
            out.append("  " + frame.strip())
            if code:
                out.append("    " + code.strip())
        return "\n".join(out)


@dataclass
class OpenTraceback:
    soft: bool
    frames: deque[tuple[str, str | None]]
    nframes: int = 0
    last_was_frame: bool = False
    noise: int = 0
    chain_parent: Cause | None = None


@dataclass
class Reversed:
    cause: Cause
    pending_code: str | None = None
    last_was_frame: bool = True


@dataclass
class Orphan:
    cause: Cause
    lines_since: int = 0
    code: str | None = None
