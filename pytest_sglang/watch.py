"""Incremental log reading and interpretation: readiness, phases, shard progress, crash and root cause.

Pytest-independent. `LogTail` turns a growing log file into lines (new bytes only, bounded memory);
`LogWatcher` applies a `Kind`'s rules to those lines; `extract_root_causes` is the traceback / argparse /
fatal-marker extractor the watcher uses, exposed as a pure function.

The extractor knows no server by name. It understands:

* tracebacks whose header sits mid-line after a log prefix ("[ts TP1] Scheduler hit an exception: Traceback
  (most recent call last):"), whose body is unprefixed until the next prefixed line;
* logs where every line carries a prefix (vLLM's "(EngineCore pid=1) ERROR 11-30 22:19:53 [core.py:700] ",
  cloud exports' "ERROR 2025-04-07T19:13:52.54Z "), with indentation possibly lost;
* interleaved ranks / worker processes (each traceback is tracked per source) and tqdm bars in between;
* chained exceptions, Python 3.11+ caret lines, exception groups;
* tracebacks cut at either end, or exported in reverse order (exception line first, then its frames);
* argparse errors ("launch_server.py: error: unrecognized arguments: ...").

Root causes are deduplicated across ranks (same exception line, numbers ignored) and bounded in number.

Cost: most lines of a long log (decode batches, access lines, progress bars) can change nothing. Every rule's
regex needs one of a few literals (`required_literals`, read off the compiled rules: "Traceback", 'File "',
"Error", the kind's ready/phase/fatal-marker words, ...); while nothing is open in the extractor, a line with
none of them only moves the extractor's owner and previous-line table (`RootCauseExtractor._skip`), the last
lines and the progress bar. The results are the same as running every rule on every line (tests/watch).
"""

from __future__ import annotations

import codecs
import os
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import Diagnosis
from .kinds import SGLANG, VLLM, Kind

__all__ = ["LogTail", "LogWatcher", "Progress", "RootCauseExtractor", "extract_root_causes", "strip_prefixes"]

# --------------------------------------------------------------------------------------------------------
# LogTail
# --------------------------------------------------------------------------------------------------------

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# CSI sequences, OSC sequences (terminated by BEL or ST, or cut), other two-byte escapes, a lone ESC;
# then the C0 control characters that are not whitespace.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# The same characters as bytes: UTF-8 never uses them inside a multibyte sequence, so raw bytes free of them
# decode to text free of them (ESC included).
_CONTROL_BYTES = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
# Line boundaries of str.splitlines() that are not ours (the others, \v \f \x1c-\x1e, are control characters).
_OTHER_SPLITLINES = ("\x85", "\u2028", "\u2029")
_ELLIPSIS = "\u2026"


def clean_line(line: str) -> str:
    """Strip ANSI escape sequences and stray control characters from one line."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return _CONTROL.sub("", line)


class LogTail:
    """Incrementally reads a growing log file: only new bytes each call, never re-reads, bounded memory.

    Lines are split on ``\\r`` and ``\\n`` (tqdm bars redraw with ``\\r``; ``\\r\\n`` counts once), decoded
    as UTF-8 with replacement characters (a multibyte character split across reads survives), stripped of
    ANSI escapes, and cut to ``max_line_chars`` (a cut line ends with "…"). A call reads at most
    ``max_read_bytes`` in ``chunk_size`` pieces; the rest is left for the next call. If the file shrinks or
    is replaced, reading starts again from its beginning.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_line_chars: int = 8192,
        chunk_size: int = 1 << 20,
        max_read_bytes: int = 32 << 20,
    ) -> None:
        self.path = Path(path)
        self.max_line_chars = max(16, int(max_line_chars))
        self._chunk_size = max(1, int(chunk_size))
        self._max_read_bytes = max(self._chunk_size, int(max_read_bytes))
        self._pos = 0
        self._identity: tuple[int, int] | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial: list[str] = []
        self._partial_len = 0
        self._dropped = 0
        self._pending_cr = False
        self.bytes_read = 0  # total bytes ever read from the file (for "never re-reads" checks)

    @property
    def position(self) -> int:
        """Offset of the next byte to read."""
        return self._pos

    def read_lines(self) -> list[str]:
        """Complete lines written since the last call; [] while the file does not exist."""
        return self._read(self._max_read_bytes, skip_excess=False)

    def flush(self) -> list[str]:
        """Everything left, including the last line without a line break. Call once the writer exited.

        If more than ``max_read_bytes`` are left, the middle is skipped (a marker line says so): the end of
        a log is where a crash is told.
        """
        lines = self._read(None, skip_excess=True)
        tail = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        if tail:
            self._consume(tail, lines)
        if self._partial or self._dropped:
            lines.append(self._take_partial())
        self._pending_cr = False
        return lines

    # internals -------------------------------------------------------------------------------------------

    def _restart(self) -> None:
        self._pos = 0
        self._decoder.reset()
        self._partial.clear()
        self._partial_len = 0
        self._dropped = 0
        self._pending_cr = False

    def _read(self, limit: int | None, *, skip_excess: bool) -> list[str]:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            return []
        lines: list[str] = []
        with f:
            try:
                st = os.fstat(f.fileno())
            except OSError:
                return []
            identity = (st.st_dev, st.st_ino)
            if (self._identity is not None and identity != self._identity and st.st_ino) or (
                st.st_size < self._pos
            ):
                self._restart()
            self._identity = identity
            remaining = st.st_size - self._pos
            if remaining <= 0:
                return lines
            if skip_excess and remaining > self._max_read_bytes:
                skipped = remaining - self._max_read_bytes
                if self._partial or self._dropped:
                    lines.append(self._take_partial())
                self._decoder.reset()
                self._pending_cr = False
                lines.append(f"[pytest-sglang: {skipped} bytes of log skipped]")
                self._pos += skipped
                remaining = self._max_read_bytes
            to_read = remaining if limit is None else min(remaining, limit)
            f.seek(self._pos)
            while to_read > 0:
                data = f.read(min(self._chunk_size, to_read))
                if not data:
                    break
                self._pos += len(data)
                self.bytes_read += len(data)
                to_read -= len(data)
                plain = len(data.translate(None, _CONTROL_BYTES)) == len(data)
                self._consume(self._decoder.decode(data), lines, plain=plain)
        return lines

    def _consume(self, text: str, lines: list[str], *, plain: bool = False) -> None:
        """`plain`: the caller knows `text` holds no control character (so no ANSI escape either)."""
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]
        self._pending_cr = False
        if not text:
            return
        self._pending_cr = text.endswith("\r")
        if plain and not any(map(text.__contains__, _OTHER_SPLITLINES)):
            # fast path: str.splitlines() splits exactly on \r\n, \r and \n here, and the lines between the
            # first and the last piece need neither joining nor cleaning
            parts = text.splitlines()
            if text[-1] in "\r\n":
                parts.append("")
            self._append_partial(parts[0])
            if len(parts) > 1:
                lines.append(self._take_partial())
                middle = parts[1:-1]
                if middle:
                    limit = self.max_line_chars
                    if max(map(len, middle)) <= limit:
                        lines.extend(middle)
                    else:
                        lines.extend(p if len(p) <= limit else p[: limit - 1] + _ELLIPSIS for p in middle)
                self._append_partial(parts[-1])
            return
        parts = _LINE_BREAK.split(text)
        for piece in parts[:-1]:
            self._append_partial(piece)
            lines.append(self._take_partial())
        self._append_partial(parts[-1])

    def _append_partial(self, piece: str) -> None:
        if not piece:
            return
        room = self.max_line_chars - self._partial_len
        if room >= len(piece):
            self._partial.append(piece)
            self._partial_len += len(piece)
        else:
            if room > 0:
                self._partial.append(piece[:room])
                self._partial_len += room
            self._dropped += len(piece) - max(room, 0)

    def _take_partial(self) -> str:
        line = "".join(self._partial)
        if self._dropped:
            line = line[: self.max_line_chars - 1] + _ELLIPSIS
        self._partial.clear()
        self._partial_len = 0
        self._dropped = 0
        return clean_line(line)


# --------------------------------------------------------------------------------------------------------
# Line prefixes
# --------------------------------------------------------------------------------------------------------

# vLLM's per-process tag: "(EngineCore_DP0 pid=1) ", "(VllmWorker TP0 pid=9) ",
# "(RayWorkerWrapper pid=3, ip=10.0.0.1) "
_PROC_TAG = re.compile(r"^\((?P<proc>[^()\n]{0,80}?\bpid=\d+[^()\n]{0,60})\)\s+")
# "ERROR 11-30 22:19:53 [core.py:700] ", "INFO 03-07 12:29:02 __init__.py:190] ",
# "ERROR 2025-04-07T19:13:52.541718006Z "
_LEVEL_TS = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\s+"
    r"(?:\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?)"
    r"(?: \[?[\w.\-/]+:\d+\])?"
    r" ?"
)
# SGLang: "[2025-10-16 09:06:10 TP5] ", "[2026-02-20 11:13:52.123 DP0 TP1 EP1] ", "[2025-03-08 12:29:04] "
_SGLANG_TAG = re.compile(
    r"^\[\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?P<tags>(?: [A-Za-z_]+\d+)*)\] ?"
)
# A bare ISO timestamp (container runtimes, python logging), with an optional stream tag and level.
_ISO_TS = re.compile(
    r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+"
    r"(?:(?:stdout|stderr) [FP] )?(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s*(?:[-:|]\s*)?)?"
)
# docker compose: "sglang-1  | "
_COMPOSE = re.compile(r"^[A-Za-z][\w.\-]*-\d+\s+\| ")


def strip_prefixes(line: str) -> tuple[str | None, str | None, str]:
    """Split a log line into (source, level, body).

    ``source`` names the process the line came from when the prefix says so ("TP1", "DP0 TP1", "main" for
    SGLang's rank-less prefix, "EngineCore pid=12" for vLLM), else None. ``level`` is a printed log level.
    Leading indentation of the body is kept (one separating space is dropped).
    """
    source: str | None = None
    level: str | None = None
    body = line
    for _ in range(6):
        # Each prefix can only start with certain characters: "(", a level word, "[", a digit, an ASCII letter.
        # Trying only those that can match keeps the order (and so the result) of trying them all.
        c = body[:1]
        if c == "(":
            m = _PROC_TAG.match(body)
            if m:
                if source is None:
                    source = " ".join(m.group("proc").split())
                body = body[m.end():]
                continue
            break
        if c == "[":
            m = _SGLANG_TAG.match(body)
            if m:
                if source is None:
                    source = m.group("tags").strip() or "main"
                body = body[m.end():]
                continue
            break
        if c in _ASCII_LETTERS:
            m = _LEVEL_TS.match(body) if body.startswith(_LEVEL_WORDS) else None
            if m:
                level = level or m.group("level")
                body = body[m.end():]
                continue
            m = _COMPOSE.match(body)
            if m:
                body = body[m.end():]
                continue
            break
        if c.isdecimal():  # what \d matches
            m = _ISO_TS.match(body)
            if m:
                level = level or m.group("level")
                body = body[m.end():]
                continue
        break
    return source, level, body


_ASCII_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_LEVEL_WORDS = ("DEBUG", "INFO", "WARN", "ERROR", "CRITICAL", "FATAL")  # what _LEVEL_TS can start with


def _source_of(line: str) -> str | None:
    """``strip_prefixes(line)[0]``, cheaper: the first prefix that names a source decides it, and most lines
    start with that very prefix (or with none at all)."""
    c = line[:1]
    if c == "[":
        m = _SGLANG_TAG.match(line)
        return (m.group("tags").strip() or "main") if m else None
    if c == "(":
        m = _PROC_TAG.match(line)
        return " ".join(m.group("proc").split()) if m else None
    if c in _ASCII_LETTERS:
        if line.startswith(_LEVEL_WORDS) or ("-" in line and _COMPOSE.match(line)):
            return strip_prefixes(line)[0]
        return None
    if c.isdecimal():
        return strip_prefixes(line)[0]
    return None


# --------------------------------------------------------------------------------------------------------
# Literals a regex needs (for skipping lines that no rule can act on)
# --------------------------------------------------------------------------------------------------------

try:
    from re import _constants as _sre_c  # type: ignore[attr-defined]
    from re import _parser as _sre_p  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_constants as _sre_c  # type: ignore[no-redef]
    import sre_parse as _sre_p  # type: ignore[no-redef]

_REPEATS = tuple(
    op for op in (getattr(_sre_c, n, None) for n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")) if op
)
# Characters whose case-insensitive matches (re's IGNORECASE, str patterns) all lower() to the character's own
# lower case: ASCII except i, k, s (matched by dotless i, Kelvin sign, long s).
_FOLD_SAFE = frozenset(
    "abcdefghjlmnopqrtuvwxyzABCDEFGHJLMNOPQRTUVWXYZ0123456789 !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
)


def _required_of(items: Any, fold: bool) -> frozenset[str] | None:
    """For a parsed sequence: a set of literals such that every match contains one of them, or None."""
    found: list[frozenset[str]] = []
    run: list[str] = []

    def end_run() -> None:
        if run:
            found.append(frozenset(("".join(run),)))
            run.clear()

    for op, av in items:
        if op is _sre_c.LITERAL:
            ch = chr(av)
            if not fold:
                run.append(ch)
                continue
            if ch in _FOLD_SAFE:
                run.append(ch.lower())
                continue
            end_run()
            continue
        end_run()
        sub: frozenset[str] | None = None
        if op is _sre_c.SUBPATTERN:
            _group, add_flags, del_flags, body = av
            if not (add_flags or del_flags):
                sub = _required_of(body, fold)
        elif op is _sre_c.BRANCH:
            alternatives = [_required_of(b, fold) for b in av[1]]
            if all(a is not None for a in alternatives):
                sub = frozenset().union(*alternatives)  # type: ignore[arg-type]
        elif op in _REPEATS:
            low, _high, body = av
            if low >= 1:
                sub = _required_of(body, fold)
        elif op is getattr(_sre_c, "ATOMIC_GROUP", None):
            sub = _required_of(av, fold)
        if sub:
            found.append(sub)
    end_run()
    found = [f for f in found if f and all(f)]
    if not found:
        return None
    return max(found, key=lambda f: min(map(len, f)))  # the set whose shortest member is longest


def required_literals(pattern: re.Pattern[str] | str) -> tuple[frozenset[str], bool] | None:
    """(literals, folded): every match of `pattern` contains one of `literals` (in ``line.lower()`` when
    `folded`); None when no such set is known. Sound, not complete: it only ever says less."""
    try:
        if isinstance(pattern, str):
            pattern = re.compile(pattern)
        if not isinstance(pattern.pattern, str):
            return None
        fold = bool(pattern.flags & re.IGNORECASE)
        tree = _sre_p.parse(pattern.pattern, pattern.flags)
        literals = _required_of(list(tree), fold)
    except Exception:  # noqa: BLE001 - an unknown parser shape only costs the fast path
        return None
    if literals is None:
        return None
    return literals, fold


def _needles(patterns: Iterable[re.Pattern[str] | str]) -> tuple[str, ...] | None:
    """Case-sensitive literals such that a line containing none of them matches none of `patterns`; None
    when one pattern has none. Literals containing another one are dropped (the shorter one says enough)."""
    found: set[str] = set()
    for pattern in patterns:
        req = required_literals(pattern)
        if req is None or req[1]:
            return None
        found |= req[0]
    return _minimal(found)


_Needles = tuple[tuple[str, tuple[str, ...]], ...]


def _grouped(literals: Iterable[str]) -> _Needles:
    """Literals grouped under a character each holds (its first capital letter; "" when it has none): a
    one-character test, far cheaper than a substring search, then rules out a whole group for most lines."""
    groups: dict[str, list[str]] = {}
    for lit in literals:
        anchor = next((c for c in lit if "A" <= c <= "Z"), "")
        groups.setdefault(anchor, []).append(lit)
    return tuple((anchor, tuple(groups[anchor])) for anchor in sorted(groups))


def _holds_any(line: str, needles: _Needles) -> bool:
    for anchor, group in needles:
        if anchor in line:  # "" is in every line
            for lit in group:
                if lit in line:
                    return True
    return False


def _minimal(literals: Iterable[str]) -> tuple[str, ...]:
    """The literals, less those that contain another one (finding the shorter one says enough)."""
    out: list[str] = []
    for lit in sorted(set(literals), key=lambda x: (len(x), x)):
        if not any(shorter in lit for shorter in out):
            out.append(lit)
    return tuple(out)


# --------------------------------------------------------------------------------------------------------
# Root-cause extraction
# --------------------------------------------------------------------------------------------------------

_TB_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "')
_CARET = re.compile(r"^\s*[\^~]+\s*$")
_REPEATED = re.compile(r"^\s*\[Previous line repeated \d+ more times?\]")
_CHAIN = re.compile(
    r"^\s*(?:During handling of the above exception, another exception occurred:"
    r"|The above exception was the direct cause of the following exception:)\s*$"
)
_GROUP_BAR = re.compile(r"^\s*\| ?")
# "Name: message" / "pkg.mod.Name: message" / "Name"
_EXC_SHAPE = re.compile(r"^(?P<name>(?:[A-Za-z_]\w*\.)*(?P<last>[A-Za-z_]\w*))(?::(?: (?P<msg>.*))?)?$")
_ERRORISH = re.compile(r"(?:Error|Exception|Exit|Interrupt|Fault|Failure|Timeout|error|exception|timeout)$")
_STRONG_LAST = re.compile(
    r"^[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Fault|Failure)$|^(?:Exception|KeyboardInterrupt|StopIteration)$"
)
_NOT_EXC = frozenset({"None", "True", "False", "Note", "Example", "Usage", "Hint", "Warning"})
_ARGPARSE = re.compile(r"^(?P<prog>[\w.\-/]+(?: [\w.\-]+){0,3}): error: (?P<msg>\S.*)$")
# click/typer (transformers serve, sglang's newer CLIs): a usage error is "Error: <one of click's messages>".
_CLICK_USAGE = re.compile(
    r"^Error: (?:No such (?:option|command)|Missing (?:argument|option|parameter)|Invalid value|"
    r"Got unexpected extra argument|Option '[^']+' requires)"
)
_EXCEPTION_IGNORED = re.compile(r"^\s*Exception ignored (?:in|on)\b")
_CONSEQUENCE = re.compile(r"(?i)\b(?:see|check)\b[^.]{0,40}\babove\b")
_TQDM = re.compile(r"\d+%\|| Completed \| \d+/\d+|\d+(?:\.\d+)?(?:it|s)/s\]")
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")
_SOFT_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "WARN"})
_HARD_LEVELS = frozenset({"ERROR", "CRITICAL", "FATAL"})

# tiers: lower is reported first
_TIER_TRACEBACK = 0
_TIER_ARGPARSE = 1
_TIER_ORPHAN = 2
_TIER_SOFT = 3
_TIER_CONSEQUENCE = 4

_UNKNOWN = "-"  # key for lines whose writer cannot be told


def _exception_line(body: str, *, strong: bool) -> str | None:
    """The body as an exception line ("KeyError: 'x'", "torch.OutOfMemoryError: ...", "KeyboardInterrupt").

    Loose (inside a traceback, after its frames): any dotted name whose last part is capitalised or sounds
    like an error. Strong (a line on its own): the last part must end in Error/Exception/Exit/Interrupt/...
    Indented lines are never exception lines (Python prints them at column 0).
    """
    if not body or body[0].isspace():
        return None
    text = body.rstrip()
    m = _EXC_SHAPE.match(text)
    if not m:
        return None
    last = m.group("last")
    if last in _NOT_EXC:
        return None
    if strong:
        if not _STRONG_LAST.match(last):
            return None
    elif not (last[0].isupper() or _ERRORISH.search(last) or ("." in m.group("name") and m.group("msg"))):
        return None
    return text


def _trim(table: dict[str, Any], size: int) -> None:
    while len(table) > size:
        del table[next(iter(table))]


def _norm(headline: str) -> str:
    return " ".join(_NUMBERS.sub("#", headline).split())


def _frame_text(frame: str) -> str:
    return "  " + frame.strip()


def _code_text(code: str) -> str:
    return "    " + code.strip()


@dataclass
class _Cause:
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
        named = [s for s in self.sources if s != _UNKNOWN]
        if len(named) > 1 or (named and named[0] != "main"):
            extra = f" and {self.more_sources} more" if self.more_sources else ""
            out.append(f"(raised on {', '.join(named)}{extra})")
        for cause in self.causes:
            out.append(f"caused by: {cause}")
        if self.dropped_frames:
            out.append(f"  ... {self.dropped_frames} earlier frame(s) not shown")
        for frame, code in self.frames:
            out.append(_frame_text(frame))
            if code:
                out.append(_code_text(code))
        return "\n".join(out)


@dataclass
class _OpenTraceback:
    source: str
    soft: bool
    frames: deque[tuple[str, str | None]]
    nframes: int = 0
    last_was_frame: bool = False
    noise: int = 0
    chain_parent: _Cause | None = None


@dataclass
class _Reversed:
    cause: _Cause
    pending_code: str | None = None
    last_was_frame: bool = True


@dataclass
class _Orphan:
    cause: _Cause
    lines_since: int = 0
    code: str | None = None


class RootCauseExtractor:
    """Incremental root-cause extraction; feed lines in log order, ask `root_causes()` any time."""

    MAX_NOISE = 200  # unrelated lines tolerated inside an open traceback before it is given up
    MAX_KEYS = 64  # sources with state at a time

    def __init__(
        self,
        fatal_markers: Sequence[re.Pattern[str]] = (),
        *,
        max_causes: int = 8,
        max_frames: int = 12,
        max_line_chars: int = 8192,
    ) -> None:
        self.fatal_markers = tuple(fatal_markers)
        self._any_marker = (
            re.compile("|".join(f"(?:{m.pattern})" for m in self.fatal_markers)) if self.fatal_markers else None
        )
        self.max_causes = max_causes
        self.max_frames = max_frames
        self.max_line_chars = max_line_chars
        self._causes: dict[str, _Cause] = {}
        self._order = 0
        self.dropped_causes = 0
        self._markers: list[str] = []
        self._open: dict[str, _OpenTraceback] = {}
        self._reversed: dict[str, _Reversed] = {}
        self._orphan: dict[str, _Orphan] = {}
        self._last_closed: dict[str, _Cause] = {}
        self._chain: dict[str, _Cause] = {}
        self._prev_body: dict[str, str] = {}
        self._owner = _UNKNOWN
        # Fast path. While no traceback, orphan exception line, chain marker or reversed block is open, a line
        # containing none of these literals (each rule's regex needs one of them) changes nothing but the
        # owner and the previous-line table: `_skip` does just that. None: a rule without known literals.
        self.needles = _needles(
            [re.escape(_TB_HEADER), _FRAME, _CHAIN, _STRONG_LAST, _ARGPARSE, _CLICK_USAGE, _EXCEPTION_IGNORED,
             *self.fatal_markers]
        )
        self._grouped_needles = _grouped(self.needles) if self.needles is not None else None
        self._skip_prefix = ""
        self._skip_source: str | None = None

    # public -----------------------------------------------------------------------------------------------

    def feed_line(self, line: str) -> bool:
        """Take one line; True when it makes a failure evident (a traceback ended, an argparse error, a
        fatal marker)."""
        line = line[: self.max_line_chars]
        if "\x1b" in line:
            line = clean_line(line)
        if self._grouped_needles is not None and self.idle and not _holds_any(line, self._grouped_needles):
            self._skip(line)
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

    @property
    def idle(self) -> bool:
        """No traceback, orphan exception line, chain marker or reversed block is open for any source."""
        return not (self._open or self._reversed or self._orphan or self._chain)

    # internals ---------------------------------------------------------------------------------------------

    def _add_cause(
        self,
        headline: str,
        source: str,
        tier: int,
        frames: Iterable[tuple[str, str | None]] = (),
        dropped_frames: int = 0,
        causes: Sequence[str] = (),
    ) -> _Cause | None:
        if _CONSEQUENCE.search(headline) and tier < _TIER_CONSEQUENCE:
            tier = _TIER_CONSEQUENCE
        norm = _norm(headline)
        frames = list(frames)
        cause = self._causes.get(norm)
        if cause is None:
            if len(self._causes) >= self.max_causes:
                self.dropped_causes += 1
                return None
            self._order += 1
            cause = _Cause(headline, norm, tier, self._order, frames=frames, dropped_frames=dropped_frames)
            self._causes[norm] = cause
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

    def _retract(self, cause: _Cause) -> None:
        """One occurrence of `cause` turned out to be the earlier link of a chain."""
        cause.count -= 1
        if cause.count <= 0 and self._causes.get(cause.norm) is cause:
            del self._causes[cause.norm]

    def _bound_keys(self) -> None:
        for table in (self._open, self._reversed, self._orphan, self._last_closed, self._chain):
            _trim(table, self.MAX_KEYS)
        _trim(self._prev_body, self.MAX_KEYS)

    def _skip(self, line: str) -> None:
        """What `_feed` does with a line when `idle` and the line holds none of `needles`: `_dispatch` would
        change nothing, so only the owner and the previous-line table move (the table's value only ever
        matters as "an 'Exception ignored' line or not", and such a line holds a needle)."""
        # the source, from the previous skipped line's when this line starts with the same bracketed prefix
        # (the prefix up to its first "]" decides an SGLang tag's match)
        cached = self._skip_prefix
        if cached and line.startswith(cached):
            source = self._skip_source
        else:
            source = _source_of(line)
            if line[:1] == "[":
                end = line.find("]")
                if end > 0:
                    self._skip_prefix, self._skip_source = line[: end + 1], source
        if source is not None:
            self._owner = source  # nothing is open, so the owner follows every prefixed line
            key = source
        else:
            key = self._owner
        prev_body = self._prev_body
        if key in prev_body:
            prev_body[key] = ""
        else:
            prev_body[key] = ""
            self._bound_keys()

    def _feed(self, line: str) -> bool:
        source, level, body = strip_prefixes(line)
        if _GROUP_BAR.match(body):
            body = _GROUP_BAR.sub("", body, count=1)
        stripped = body.strip()

        # whose line is it?
        if source is not None:
            key = source
            if key != self._owner and (self._owner not in self._open or _TB_HEADER in body):
                self._owner = key
        else:
            key = self._owner
            if (
                stripped.startswith(_TB_HEADER)
                and not body[:1].isspace()
                and self._owner not in self._chain
                and self._owner not in self._reversed
            ):
                # a traceback printed straight to stderr by some process without a log prefix
                key = self._owner = _UNKNOWN
        prev = self._prev_body.get(key)
        self._prev_body[key] = stripped
        if prev is None:  # a new source: keep the per-source tables bounded
            self._bound_keys()
            prev = ""
        return self._dispatch(key, level, body, stripped, prev)

    def _dispatch(self, key: str, level: str | None, body: str, stripped: str, prev: str) -> bool:
        # a reversed traceback (exception line first, then code/frame pairs, header last)
        rev = self._reversed.get(key)
        if rev is not None:
            if self._feed_reversed(key, rev, body, stripped):
                return False

        if _TB_HEADER in body:
            self._orphan.pop(key, None)
            parent = self._chain.pop(key, None)
            soft = (level in _SOFT_LEVELS) or bool(_EXCEPTION_IGNORED.match(prev))
            self._open[key] = _OpenTraceback(
                source=key, soft=soft, frames=deque(maxlen=self.max_frames), chain_parent=parent
            )
            self._owner = key
            return False

        tb = self._open.get(key)
        if tb is not None:
            return self._feed_forward(key, tb, body, stripped)

        if _CHAIN.match(body):
            last = self._last_closed.get(key)
            if last is not None:
                self._chain[key] = last
            return False

        orphan = self._orphan.get(key)
        if _FRAME.match(body):
            if orphan is not None and orphan.code is not None and orphan.lines_since <= 2:
                # exception line, code line, frame: the log runs backwards
                del self._orphan[key]
                cause = orphan.cause
                cause.tier = min(cause.tier, _TIER_TRACEBACK)
                cause.frames.append((stripped, orphan.code))
                self._reversed[key] = _Reversed(cause)
                return True
            self._orphan.pop(key, None)
            # a traceback whose header was cut off
            tb = _OpenTraceback(source=key, soft=False, frames=deque(maxlen=self.max_frames))
            self._open[key] = tb
            return self._feed_forward(key, tb, body, stripped)

        if orphan is not None:
            orphan.lines_since += 1
            if orphan.code is None and stripped and not _TQDM.search(stripped):
                orphan.code = stripped
            if orphan.lines_since > 2:
                del self._orphan[key]

        exc = _exception_line(body, strong=True)
        if exc is not None:
            orphan_cause = self._add_cause(exc, key, _TIER_ORPHAN)
            # on its own it is weak evidence, unless the logger said ERROR
            evident = level in _HARD_LEVELS
            if orphan_cause is not None:
                cause = orphan_cause
                self._orphan[key] = _Orphan(cause)
                # a chain read backwards: "During handling ..." was just seen after a reversed block
                parent = self._chain.pop(key, None)
                if parent is not None and parent is not cause and cause.norm != parent.norm:
                    if cause.headline not in parent.causes:
                        parent.causes.append(cause.headline)
                    self._retract(cause)
            return evident

        m = _ARGPARSE.match(stripped) or _CLICK_USAGE.match(stripped)
        if m and not body[:1].isspace():
            self._add_cause(stripped, key, _TIER_ARGPARSE)
            return True
        return False

    def _feed_forward(self, key: str, tb: _OpenTraceback, body: str, stripped: str) -> bool:
        if not stripped or _CARET.match(body) or _REPEATED.match(body):
            return False
        if _FRAME.match(body):
            tb.frames.append((stripped, None))
            tb.nframes += 1
            tb.last_was_frame = True
            return False
        exc = _exception_line(body, strong=False) if tb.nframes else None
        if exc is not None:
            del self._open[key]
            parent = tb.chain_parent
            causes: list[str] = []
            if parent is not None and parent.norm != _norm(exc):
                causes = [*parent.causes, parent.headline]
                self._retract(parent)
            tier = _TIER_SOFT if tb.soft else _TIER_TRACEBACK
            dropped = max(0, tb.nframes - len(tb.frames))
            cause = self._add_cause(exc, key, tier, tb.frames, dropped, causes)
            if cause is not None:
                self._last_closed[key] = cause
            return not tb.soft
        if tb.last_was_frame and not (not body[:1].isspace() and _TQDM.search(stripped)):
            frame, _ = tb.frames[-1]
            tb.frames[-1] = (frame, stripped)
            tb.last_was_frame = False
            return False
        tb.noise += 1
        if tb.noise > self.MAX_NOISE:
            del self._open[key]
        return False

    def _feed_reversed(self, key: str, rev: _Reversed, body: str, stripped: str) -> bool:
        """Returns True when the line was consumed by the reversed traceback."""
        cause = rev.cause
        if _FRAME.match(body):
            if len(cause.frames) < self.max_frames:
                cause.frames.insert(0, (stripped, rev.pending_code))
            else:
                cause.dropped_frames += 1
            rev.pending_code = None
            rev.last_was_frame = True
            return True
        if stripped and rev.last_was_frame and _TB_HEADER not in body and not _CHAIN.match(body):
            rev.pending_code = stripped
            rev.last_was_frame = False
            return True
        # the block is over; a header is its (chronological) start, a chain marker links it to an earlier one
        del self._reversed[key]
        self._last_closed[key] = cause
        return _TB_HEADER in body


def extract_root_causes(lines: Iterable[str], *, kind: Kind | None = None) -> list[str]:
    """Root-cause blocks of a log: first line is the exception (or argparse error) line as printed, then
    "(raised on ...)" when it came from named ranks/processes, "caused by: ..." for chained exceptions, then
    the last frames. Fatal-marker lines (of `kind`, or of SGLang and vLLM) are the fallback."""
    markers = kind.fatal_markers if kind is not None else SGLANG.fatal_markers + VLLM.fatal_markers
    ex = RootCauseExtractor(markers)
    for line in lines:
        for piece in _LINE_BREAK.split(line) if ("\n" in line or "\r" in line) else (line,):
            ex.feed_line(piece)
    return ex.root_causes()


# --------------------------------------------------------------------------------------------------------
# LogWatcher
# --------------------------------------------------------------------------------------------------------


@dataclass
class Progress:
    label: str  # the bar's description, e.g. "Loading safetensors checkpoint shards"
    percent: int | None
    done: int | None
    total: int | None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class LogWatcher:
    """Applies a Kind's rules to log lines: readiness, phases, shard progress, failure and its root cause."""

    LAST_LINES = 30
    SILENCE_NOTE_S = 60.0

    def __init__(
        self, kind: Kind, *, ready_pattern: str | None = None, started_at: float, tail: LogTail | None = None
    ) -> None:
        self.kind = kind
        self.tail = tail  # where `poll` reads from
        pattern = ready_pattern if ready_pattern is not None else kind.ready_pattern
        self._ready_re = re.compile(pattern) if pattern else None
        self.started_at = started_at
        self.ready_at: float | None = None
        self.phases: dict[str, float] = {}
        self.phase_label: str | None = None
        self.progress: Progress | None = None
        self.failing_since: float | None = None
        self.last_line_at: float | None = None
        self.lines_seen = 0
        self._progress_phase: str | None = None  # phase label current when progress was last seen
        self._last: deque[str] = deque(maxlen=self.LAST_LINES)
        self._extractor = RootCauseExtractor(kind.fatal_markers)
        self._pending_rules = list(kind.phases)
        # progress lines must hold these (in line.lower() when folded): a cheap test before the regex
        self._progress_literals = (
            required_literals(kind.progress_pattern) if kind.progress_pattern is not None else None
        )
        self._needles = self._watch_needles()

    def _watch_needles(self) -> _Needles | None:
        """Literals one of which every line that any rule could act on holds (the extractor's, the ready
        pattern's while not ready, the pending phase rules'); None: no fast path."""
        ex = self._extractor.needles
        if ex is None:
            return None
        patterns: list[re.Pattern[str]] = [r.pattern for r in self._pending_rules]
        if self._ready_re is not None and self.ready_at is None:
            patterns.append(self._ready_re)
        own = _needles(patterns)
        if own is None:
            return None
        return _grouped(_minimal((*ex, *own)))

    def poll(self, now: float, *, final: bool = False) -> None:
        """Read whatever is new from `tail` and apply the rules. `final`: the writer has exited, so also
        take everything left, the last line without a line break included."""
        tail = self.tail
        if tail is None:
            raise ValueError("LogWatcher.poll needs a tail: LogWatcher(..., tail=LogTail(path))")
        lines = tail.read_lines()
        if final:
            lines += tail.flush()
        self.feed(lines, now)

    def feed(self, lines: Sequence[str], now: float) -> None:
        ex = self._extractor
        limit = ex.max_line_chars
        last = self._last
        # ex.idle, spelled out: these tables are only ever changed in place
        opened, reversed_, orphans, chains = ex._open, ex._reversed, ex._orphan, ex._chain
        for line in lines:
            if "\n" in line or "\r" in line:
                for piece in _LINE_BREAK.split(line):
                    self._feed_one(piece, now)
                continue
            # the fast path: no rule can act on this line (see RootCauseExtractor._skip)
            needles = self._needles
            if needles is None or opened or reversed_ or orphans or chains:
                self._feed_one(line, now)
                continue
            if len(line) > limit:
                line = line[:limit]
            if "\x1b" in line:
                line = clean_line(line)
            if _holds_any(line, needles):
                self._feed_one(line, now)
                continue
            self.lines_seen += 1
            if line and not line.isspace():
                last.append(line)
            ex._skip(line)
            if "%" in line and self.kind.progress_pattern is not None:
                self._progress(line)
        if lines:
            self.last_line_at = now

    def _feed_one(self, line: str, now: float) -> None:
        line = line[: self._extractor.max_line_chars]
        if "\x1b" in line:
            line = clean_line(line)
        self.lines_seen += 1
        self.last_line_at = now
        if line.strip():
            self._last.append(line)
        if self._extractor.feed_line(line) and self.failing_since is None:
            self.failing_since = now
        if self._ready_re is not None and self.ready_at is None and self._ready_re.search(line):
            self.ready_at = now
            self.phases.setdefault("ready", now - self.started_at)
            self.phase_label = "ready"
            self._needles = self._watch_needles()
        if self._pending_rules:
            matched = False
            for rule in self._pending_rules:
                if rule.pattern.search(line):
                    matched = True
                    self.phases[rule.name] = now - self.started_at
                    if self.ready_at is None:
                        self.phase_label = rule.label
            if matched:
                self._pending_rules = [r for r in self._pending_rules if r.name not in self.phases]
                self._needles = self._watch_needles()
        if self.kind.progress_pattern is not None and "%" in line:
            self._progress(line)

    def _progress(self, line: str) -> None:
        pp = self.kind.progress_pattern
        assert pp is not None
        req = self._progress_literals
        if req is not None:
            literals, folded = req
            text = line.lower() if folded else line
            if not any(map(text.__contains__, literals)):
                return
        m = pp.search(line)
        if m:
            groups = m.groups()
            desc = line[: m.start(1)].rsplit(":", 1)[0]
            label = re.split(r"[\]|]", strip_prefixes(desc)[2])[-1].strip()
            self.progress = Progress(
                label=label,
                percent=_int(groups[0]) if len(groups) > 0 else None,
                done=_int(groups[1]) if len(groups) > 1 else None,
                total=_int(groups[2]) if len(groups) > 2 else None,
            )
            self._progress_phase = self.phase_label

    def status(self, now: float) -> str:
        """One line for a live status display, e.g. "loading weights 75% (48/64 shards)"."""
        if self.ready_at is not None:
            return "ready"
        if self.failing_since is not None:
            causes = self._extractor.root_causes()
            return f"failing: {causes[0].splitlines()[0]}" if causes else "failing"
        label = self.phase_label or "starting"
        p = self.progress
        if p is not None and self._progress_phase == self.phase_label and p.percent is not None:
            label = f"{self.phase_label or p.label} {p.percent}%"
            if p.done is not None and p.total is not None:
                label += f" ({p.done}/{p.total} shards)"
        if self.last_line_at is not None and now - self.last_line_at >= self.SILENCE_NOTE_S:
            label += f" (no log output for {now - self.last_line_at:.0f} s)"
        return label

    def root_causes(self) -> list[str]:
        return self._extractor.root_causes()

    @property
    def failure_is_usage_error(self) -> bool:
        return self._extractor.only_usage_errors

    def diagnosis(self, exit_code: int | None = None) -> Diagnosis:
        return Diagnosis(
            root_causes=self._extractor.root_causes(),
            last_lines=list(self._last),
            phase=self.phase_label,
            exit_code=exit_code,
        )
