"""The root-cause extractor: which exception (or usage error) a failing server's log is about.

One job: a state machine over log lines, one state per source (rank, worker process), that turns tracebacks and
error lines into deduplicated root-cause blocks. It knows no server by name. It understands:

* tracebacks whose header sits mid-line after a log prefix ("[ts TP1] Scheduler hit an exception: Traceback
  (most recent call last):"), whose body is unprefixed until the next prefixed line;
* logs where every line carries a prefix (vLLM's "(EngineCore pid=1) ERROR 11-30 22:19:53 [core.py:700] ",
  cloud exports' "ERROR 2025-04-07T19:13:52.54Z "), with indentation possibly lost;
* interleaved ranks / worker processes (each traceback is tracked per source) and tqdm bars in between;
* chained exceptions, Python 3.11+ caret lines, exception groups;
* tracebacks cut at either end, or exported in reverse order (exception line first, then its frames);
* argparse and click usage errors ("launch_server.py: error: unrecognized arguments: ...");
* a kind's fatal markers, the fallback when no exception was printed.

Root causes are deduplicated across ranks (same exception line, numbers ignored) and bounded in number.

Prefilter: while the extractor is `idle` (nothing open), a line holding none of `literals` changes nothing but
the owner of the unprefixed lines that follow (the last source seen); `feed_line` then does just that, and a
caller that skipped such lines itself says so with `pass_over`.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from ..config.kinds import SGLANG, VLLM, Kind, LinePattern
from .causes import UNKNOWN, Cause, OpenTraceback, Orphan, Reversed
from .literals import LiteralSet
from .prefixes import source_of, strip_prefixes
from .shapes import (
    ARGPARSE,
    CARET,
    CHAIN,
    CLICK_USAGE,
    CONSEQUENCE,
    EXCEPTION_IGNORED,
    FRAME,
    GROUP_BAR,
    LITERALS,
    NO_MODULE,
    REPEATED,
    STOPPED_BY_LAUNCHER,
    TB_HEADER,
    TQDM,
    exception_line,
    norm,
)
from .tail import LINE_BREAK, clean_line

__all__ = ["RootCauseExtractor", "extract_root_causes"]

_SOFT_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "WARN"})
_HARD_LEVELS = frozenset({"ERROR", "CRITICAL", "FATAL"})

# tiers: lower is reported first
_TIER_TRACEBACK = 0
_TIER_ARGPARSE = 1
_TIER_ORPHAN = 2
_TIER_SOFT = 3
_TIER_CONSEQUENCE = 4

class RootCauseExtractor:
    """Incremental root-cause extraction; feed lines in log order, ask `root_causes()` any time.

    `fatal_markers`: a kind's markers (a bare regex is taken too, with no literals: the prefilter is then off).
    `prefilter=False` runs every rule on every line (the reference the prefilter is tested against).
    """

    MAX_NOISE = 200  # unrelated lines tolerated inside an open traceback before it is given up
    MAX_KEYS = 64  # sources with state at a time, per table

    def __init__(
        self,
        fatal_markers: Sequence[LinePattern | re.Pattern[str]] = (),
        *,
        max_causes: int = 8,
        max_frames: int = 12,
        max_line_chars: int = 8192,
        prefilter: bool = True,
    ) -> None:
        markers = [m if isinstance(m, LinePattern) else LinePattern(m) for m in fatal_markers]
        self.fatal_markers = tuple(m.pattern for m in markers)
        self._any_marker = (
            re.compile("|".join(f"(?:{m.pattern})" for m in self.fatal_markers)) if self.fatal_markers else None
        )
        self.max_causes = max_causes
        self.max_frames = max_frames
        self.max_line_chars = max_line_chars
        self.dropped_causes = 0
        self._causes: dict[str, Cause] = {}
        self._order = 0
        self._markers: list[str] = []
        self._open: dict[str, OpenTraceback] = {}
        self._reversed: dict[str, Reversed] = {}
        self._orphan: dict[str, Orphan] = {}
        self._last_closed: dict[str, Cause] = {}
        self._chain: dict[str, Cause] = {}
        self._ignored: dict[str, None] = {}  # sources whose last line was "Exception ignored in ..."
        self._owner = UNKNOWN
        declared = prefilter and all(m.literals for m in markers)
        self._literals = LiteralSet([*LITERALS, *(lit for m in markers for lit in m.literals)]) if declared else None

    # public -----------------------------------------------------------------------------------------------

    @property
    def literals(self) -> tuple[str, ...] | None:
        """While `idle`, a line holding none of these changes nothing but the owner; None: no prefilter."""
        return self._literals.literals if self._literals is not None else None

    @property
    def idle(self) -> bool:
        """Nothing is open for any source: no traceback, orphan exception line, chain marker, reversed block
        or "Exception ignored" line waiting for what follows it."""
        return not (self._open or self._reversed or self._orphan or self._chain or self._ignored)

    def pass_over(self, source: str | None) -> None:
        """Lines holding none of `literals` went by while `idle`, unfed; `source` is that of the last of them
        that names one (None: none did). The same as feeding them."""
        if source is not None:
            self._owner = source  # nothing is open, so the owner follows every prefixed line

    def feed_line(self, line: str) -> bool:
        """Take one line; True when it makes a failure evident (a traceback ended, an argparse error, a
        fatal marker)."""
        line = line[: self.max_line_chars]
        if "\x1b" in line:
            line = clean_line(line)
        if self._literals is not None and self.idle and not self._literals.holds_any(line):
            self.pass_over(source_of(line))
            return False
        evident = False
        if self._any_marker is not None and self._any_marker.search(line):
            text = " ".join(strip_prefixes(line)[2].split())
            if text not in self._markers and len(self._markers) < self.max_causes:
                self._markers.append(text)
            evident = True
        return self._feed(line) or evident

    def root_causes(self) -> list[str]:
        """Blocks, most likely root cause first; fatal-marker lines only when nothing better was seen."""
        causes = sorted(self._causes.values(), key=lambda c: (c.tier, c.order))
        blocks = [c.render() for c in causes]
        if not blocks:
            blocks = list(self._markers)
        return blocks

    @property
    def has_exception(self) -> bool:
        return bool(self._causes)

    @property
    def only_usage_errors(self) -> bool:
        """Every cause is a command-line usage error (argparse, click): the process will exit with code 2."""
        return bool(self._causes) and all(c.tier == _TIER_ARGPARSE for c in self._causes.values())

    # internals ---------------------------------------------------------------------------------------------

    def _put(self, table: dict[str, Any], key: str, value: Any) -> None:
        table[key] = value
        while len(table) > self.MAX_KEYS:  # the oldest source goes
            del table[next(iter(table))]

    def _add_cause(
        self,
        headline: str,
        source: str,
        tier: int,
        frames: Iterable[tuple[str, str | None]] = (),
        dropped_frames: int = 0,
        causes: Sequence[str] = (),
    ) -> Cause | None:
        if CONSEQUENCE.search(headline) and tier < _TIER_CONSEQUENCE:
            tier = _TIER_CONSEQUENCE
        key = norm(headline)
        frames = list(frames)
        cause = self._causes.get(key)
        if cause is None:
            if len(self._causes) >= self.max_causes:
                self.dropped_causes += 1
                return None
            self._order += 1
            cause = Cause(headline, key, tier, self._order, frames=frames, dropped_frames=dropped_frames)
            self._causes[key] = cause
        else:
            cause.count += 1
            cause.tier = min(cause.tier, tier)
            if frames and not cause.frames:
                cause.frames = frames
                cause.dropped_frames = dropped_frames
        if source not in cause.sources:
            if len(cause.sources) < 8:
                cause.sources.append(source)
            else:
                cause.more_sources += 1
        for c in causes:
            if c not in cause.causes and len(cause.causes) < 4:
                cause.causes.append(c)
        return cause

    def _retract(self, cause: Cause) -> None:
        """One occurrence of `cause` turned out to be the earlier link of a chain."""
        cause.count -= 1
        if cause.count <= 0 and self._causes.get(cause.norm) is cause:
            del self._causes[cause.norm]

    def _feed(self, line: str) -> bool:
        source, level, body = strip_prefixes(line)
        if GROUP_BAR.match(body):
            body = GROUP_BAR.sub("", body, count=1)
        stripped = body.strip()

        # whose line is it?
        if source is not None:
            key = source
            if key != self._owner and (self._owner not in self._open or TB_HEADER in body):
                self._owner = key
        else:
            key = self._owner
            if (
                stripped.startswith(TB_HEADER)
                and not body[:1].isspace()
                and self._owner not in self._chain
                and self._owner not in self._reversed
            ):
                # a traceback printed straight to stderr by some process without a log prefix
                key = self._owner = UNKNOWN
        after_ignored = key in self._ignored
        if EXCEPTION_IGNORED.match(stripped):
            self._put(self._ignored, key, None)
        elif after_ignored:
            del self._ignored[key]
        return self._dispatch(key, level, body, stripped, after_ignored)

    def _dispatch(self, key: str, level: str | None, body: str, stripped: str, after_ignored: bool) -> bool:
        # a reversed traceback (exception line first, then code/frame pairs, header last)
        rev = self._reversed.get(key)
        if rev is not None:
            if self._feed_reversed(key, rev, body, stripped):
                return False

        if TB_HEADER in body:
            self._orphan.pop(key, None)
            parent = self._chain.pop(key, None)
            soft = (level in _SOFT_LEVELS) or after_ignored
            self._put(self._open, key, OpenTraceback(soft, deque(maxlen=self.max_frames), chain_parent=parent))
            self._owner = key
            return False

        tb = self._open.get(key)
        if tb is not None:
            return self._feed_forward(key, tb, body, stripped)

        if CHAIN.match(body):
            last = self._last_closed.get(key)
            if last is not None:
                self._put(self._chain, key, last)
            return False

        orphan = self._orphan.get(key)
        if FRAME.match(body):
            return self._stray_frame(key, orphan, body, stripped)

        if orphan is not None:
            orphan.lines_since += 1
            if orphan.code is None and stripped and not TQDM.search(stripped):
                orphan.code = stripped
            if orphan.lines_since > 2:
                del self._orphan[key]

        return self._loose_line(key, level, body, stripped)

    def _stray_frame(self, key: str, orphan: Orphan | None, body: str, stripped: str) -> bool:
        """A frame line outside any open traceback: a traceback read backwards, or one whose header was cut off."""
        if orphan is not None and orphan.code is not None and orphan.lines_since <= 2:
            # exception line, code line, frame: the log runs backwards
            del self._orphan[key]
            cause = orphan.cause
            cause.tier = min(cause.tier, _TIER_TRACEBACK)
            cause.frames.append((stripped, orphan.code))
            self._put(self._reversed, key, Reversed(cause))
            return True
        self._orphan.pop(key, None)
        # a traceback whose header was cut off
        tb = OpenTraceback(False, deque(maxlen=self.max_frames))
        self._put(self._open, key, tb)
        return self._feed_forward(key, tb, body, stripped)

    def _loose_line(self, key: str, level: str | None, body: str, stripped: str) -> bool:
        """A line in no traceback: an exception line on its own, a usage error, a module the interpreter lacks."""
        exc = exception_line(body, strong=True)
        if exc is not None:
            orphan_cause = self._add_cause(exc, key, _TIER_ORPHAN)
            # on its own it is weak evidence, unless the logger said ERROR
            evident = level in _HARD_LEVELS
            if orphan_cause is not None:
                cause = orphan_cause
                self._put(self._orphan, key, Orphan(cause))
                # a chain read backwards: "During handling ..." was just seen after a reversed block
                parent = self._chain.pop(key, None)
                if parent is not None and parent is not cause and cause.norm != parent.norm:
                    if cause.headline not in parent.causes:
                        parent.causes.append(cause.headline)
                    self._retract(cause)
            return evident

        m = ARGPARSE.match(stripped) or CLICK_USAGE.match(stripped)
        if m and not body[:1].isspace() and not STOPPED_BY_LAUNCHER.match(stripped):
            self._add_cause(stripped, key, _TIER_ARGPARSE)
            return True
        m = NO_MODULE.match(stripped)
        if m:  # the interpreter could not even start the server: the exit follows at once
            self._add_cause(m.group("exc") or f"ModuleNotFoundError: {m.group('bare')}", key, _TIER_ORPHAN)
            return True
        return False

    def _feed_forward(self, key: str, tb: OpenTraceback, body: str, stripped: str) -> bool:
        if not stripped or CARET.match(body) or REPEATED.match(body):
            return False
        if FRAME.match(body):
            tb.frames.append((stripped, None))
            tb.nframes += 1
            tb.last_was_frame = True
            return False
        exc = exception_line(body, strong=False) if tb.nframes else None
        if exc is not None:
            del self._open[key]
            parent = tb.chain_parent
            causes: list[str] = []
            if parent is not None and parent.norm != norm(exc):
                causes = [*parent.causes, parent.headline]
                self._retract(parent)
            tier = _TIER_SOFT if tb.soft else _TIER_TRACEBACK
            dropped = max(0, tb.nframes - len(tb.frames))
            cause = self._add_cause(exc, key, tier, tb.frames, dropped, causes)
            if cause is not None:
                self._put(self._last_closed, key, cause)
            return not tb.soft
        if tb.last_was_frame and not (not body[:1].isspace() and TQDM.search(stripped)):
            frame, _ = tb.frames[-1]
            tb.frames[-1] = (frame, stripped)
            tb.last_was_frame = False
            return False
        tb.noise += 1
        if tb.noise > self.MAX_NOISE:
            del self._open[key]
        return False

    def _feed_reversed(self, key: str, rev: Reversed, body: str, stripped: str) -> bool:
        """Returns True when the line was consumed by the reversed traceback."""
        cause = rev.cause
        if FRAME.match(body):
            if len(cause.frames) < self.max_frames:
                cause.frames.insert(0, (stripped, rev.pending_code))
            else:
                cause.dropped_frames += 1
            rev.pending_code = None
            rev.last_was_frame = True
            return True
        if stripped and rev.last_was_frame and TB_HEADER not in body and not CHAIN.match(body):
            rev.pending_code = stripped
            rev.last_was_frame = False
            return True
        # the block is over; a header is its (chronological) start, a chain marker links it to an earlier one
        del self._reversed[key]
        self._put(self._last_closed, key, cause)
        return TB_HEADER in body


def extract_root_causes(lines: Iterable[str], *, kind: Kind | None = None) -> list[str]:
    """Root-cause blocks of a log: first line is the exception (or argparse error) line as printed, then
    "(raised on ...)" when it came from named ranks/processes, "caused by: ..." for chained exceptions, then
    the last frames. Fatal-marker lines (of `kind`, or of SGLang and vLLM) are the fallback."""
    markers = kind.fatal_markers if kind is not None else SGLANG.fatal_markers + VLLM.fatal_markers
    ex = RootCauseExtractor(markers)
    for line in lines:
        for piece in LINE_BREAK.split(line) if ("\n" in line or "\r" in line) else (line,):
            ex.feed_line(piece)
    return ex.root_causes()
