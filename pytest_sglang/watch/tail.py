"""Tailing: a growing log file as runs of whole raw lines (new bytes only, bounded memory), and their text.

One job: bytes in, lines out. `LogTail.read_blocks` hands out what was written since the last call as *blocks*:
raw bytes holding whole lines only, each ending with its line break, the line still being written kept back
(at most a few times ``max_line_chars`` of it). Nothing is decoded there, so the watcher can look at a block
with a few byte scans and decode only the lines it needs (`decode`, `split`). `read_lines` / `flush` are the
same through `split`, for callers that want every line.

Line breaks are ``\\n``, ``\\r`` and ``\\r\\n`` (tqdm redraws its bar with ``\\r``; ``\\r\\n`` counts once, also
across reads). Text is UTF-8 with replacement characters (a multibyte character split across reads survives,
since a block never ends inside a line), stripped of ANSI escapes and control characters (`clean_line`) and cut
to ``max_line_chars`` (a cut line ends with "…", cut before it is cleaned).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["LogTail", "clean_line"]

LINE_BREAK = re.compile(r"\r\n|\r|\n")
# CSI sequences, OSC sequences (terminated by BEL or ST, or cut), other two-byte escapes, a lone ESC;
# then the C0 control characters that are not whitespace.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# The same characters as bytes: UTF-8 never uses them inside a multibyte sequence, so raw bytes free of them
# decode to text free of them (ESC included), and `clean_line` leaves such text as it is.
CONTROL_BYTES = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
# Line boundaries of str.splitlines() that are not ours (the others, \v \f \x1c-\x1e, are control characters).
_OTHER_SPLITLINES = ("\x85", "\u2028", "\u2029")
_ELLIPSIS = "\u2026"


def clean_line(line: str) -> str:
    """Strip ANSI escape sequences and stray control characters from one line."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return _CONTROL.sub("", line)


def is_plain(data: bytes) -> bool:
    """`data` holds no control character (so no ANSI escape either): its text needs no cleaning."""
    return len(data.translate(None, CONTROL_BYTES)) == len(data)


class LogTail:
    """Incrementally reads a growing log file: only new bytes each call, never re-reads, bounded memory.

    A call reads at most ``max_read_bytes`` in ``chunk_size`` pieces; the rest is left for the next call. If
    the file shrinks or is replaced, reading starts again from its beginning; if it is deleted, reading goes on
    from the file last opened (the server still writes to it).
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
        # The line being written, raw. Four bytes per character and one more character are enough to know
        # that a line is longer than max_line_chars (every character, a replacement one too, takes at least
        # one byte and at most four), so the rest of a line that never ends is dropped.
        self._carry = b""
        self._carry_cap = 4 * self.max_line_chars + 4
        self._pending_cr = False  # the last block ended with "\r": a "\n" that follows belongs to it
        self.bytes_read = 0  # total bytes ever read from the file (for "never re-reads" checks)
        self._file: BinaryIO | None = None  # the log as last opened: read on from it if its path is deleted

    @property
    def position(self) -> int:
        """Offset of the next byte to read."""
        return self._pos

    def read_blocks(self, *, final: bool = False) -> Iterator[bytes]:
        """Whole lines written since the last call, as raw blocks, each ending with a line break; nothing
        while the file does not exist. Consume each block before asking for the next (one piece is read per
        block, so memory stays at ``chunk_size`` however much was written).

        `final`: the writer has exited: read everything left, the last line without a line break included (as
        a block of its own, a "\\n" added). If more than ``max_read_bytes`` are left, the middle is skipped and
        a marker line says so: the end of a log is where a crash is told.
        """
        yield from self._read(None if final else self._max_read_bytes, skip_excess=final)
        if final:
            if self._carry:
                yield self._carry + b"\n"
            self._carry = b""
            self._pending_cr = False

    def read_lines(self) -> list[str]:
        """Complete lines written since the last call; [] while the file does not exist."""
        return [line for block in self.read_blocks() for line in self.split(block)]

    def flush(self) -> list[str]:
        """Everything left, including the last line without a line break. Call once the writer exited."""
        return [line for block in self.read_blocks(final=True) for line in self.split(block)]

    def decode(self, raw: bytes) -> str:
        """One raw line (no line break in it) as text: decoded, cut to ``max_line_chars``, cleaned."""
        line = raw.decode("utf-8", "replace")
        if len(line) > self.max_line_chars:
            line = line[: self.max_line_chars - 1] + _ELLIPSIS
        return clean_line(line)

    def split(self, block: bytes) -> list[str]:
        """The lines of a block (whole lines, ending with a line break) as text, as `decode` makes them."""
        if not block:
            return []
        text = block.decode("utf-8", "replace")
        limit = self.max_line_chars
        if is_plain(block) and not any(map(text.__contains__, _OTHER_SPLITLINES)):
            # str.splitlines() splits exactly on \r\n, \r and \n here, and no line needs cleaning
            lines = text.splitlines()
            if max(map(len, lines), default=0) <= limit:
                return lines
            return [p if len(p) <= limit else p[: limit - 1] + _ELLIPSIS for p in lines]
        parts = LINE_BREAK.split(text)
        parts.pop()  # the block ends with a line break: the last part is empty
        return [clean_line(p if len(p) <= limit else p[: limit - 1] + _ELLIPSIS) for p in parts]

    # internals -------------------------------------------------------------------------------------------

    def _restart(self) -> None:
        self._pos = 0
        self._carry = b""
        self._pending_cr = False

    def close(self) -> None:
        """Let go of the file kept open (see `_open`)."""
        f = getattr(self, "_file", None)  # None too in __del__ of an instance whose __init__ failed
        if f is not None:
            self._file = None
            f.close()

    __del__ = close

    def _open(self) -> BinaryIO | None:
        """The file at `path` now; once it was deleted (a cleanup job, the log folder removed), the one last
        opened: the server still writes to it, so it is read on, not taken as a log gone silent."""
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - kept in self._file, closed by close()
        except OSError:
            return self._file
        if self._file is not None:
            self._file.close()
        self._file = f
        return f

    def _read(self, limit: int | None, *, skip_excess: bool) -> Iterator[bytes]:
        f = self._open()
        if f is None:
            return
        try:
            st = os.fstat(f.fileno())
        except OSError:
            return
        identity = (st.st_dev, st.st_ino)
        if (self._identity is not None and identity != self._identity and st.st_ino) or (
            st.st_size < self._pos
        ):
            self._restart()
        self._identity = identity
        remaining = st.st_size - self._pos
        if remaining <= 0:
            return
        if skip_excess and remaining > self._max_read_bytes:
            skipped = remaining - self._max_read_bytes
            head = self._carry + b"\n" if self._carry else b""
            self._carry = b""
            self._pending_cr = False
            yield head + f"[pytest-sglang: {skipped} bytes of log skipped]\n".encode()
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
            block = self._whole_lines(data)
            if block:
                yield block

    def _whole_lines(self, data: bytes) -> bytes:
        """The carried line and `data` up to its last line break; the rest becomes the carried line."""
        if self._pending_cr and data[:1] == b"\n":
            data = data[1:]
        self._pending_cr = False
        if not data:
            return b""
        last = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if last < 0:
            self._carry_more(data)
            return b""
        block = self._carry + data[: last + 1] if self._carry else data[: last + 1]
        self._carry = b""
        self._pending_cr = last == len(data) - 1 and data[last] == 0x0D
        if last + 1 < len(data):
            self._carry_more(data[last + 1:])
        return block

    def _carry_more(self, piece: bytes) -> None:
        room = self._carry_cap - len(self._carry)
        if room > 0:
            self._carry += piece[:room]
