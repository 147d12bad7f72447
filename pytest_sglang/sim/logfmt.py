"""SGLang's log line format, written straight to the file descriptors so every line is flushed at once.

SGLang's logger writes `[YYYY-MM-DD HH:MM:SS<prefix>] message` to stderr, where the prefix is ` TP<n>` for
scheduler ranks when tp > 1 and empty otherwise; uvicorn's access log goes to stdout. tqdm bars go to stderr
with no prefix at all. One os.write per line keeps lines from different processes and threads whole.
"""

from __future__ import annotations

import os
import threading
import time

STDOUT = 1
STDERR = 2

_lock = threading.Lock()


def timestamp(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))


def write_raw(text: str, fd: int = STDERR) -> None:
    data = text.encode("utf-8", "replace")
    with _lock:
        try:
            while data:
                n = os.write(fd, data)
                data = data[n:]
        except OSError:  # log file gone or pipe closed: the simulated server keeps running, like SGLang
            pass


class Logger:
    """`[ts<prefix>] msg` lines; prefix is " TP1" for a rank of a tp>1 server, "" for the main process."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def line(self, msg: str, fd: int = STDERR) -> None:
        write_raw(f"[{timestamp()}{self.prefix}] {msg}\n", fd)

    def block(self, first: str, rest: list[str], fd: int = STDERR) -> None:
        """A multi-line message (a traceback): only the first line carries the prefix, as in SGLang."""
        write_raw(f"[{timestamp()}{self.prefix}] {first}\n" + "".join(r + "\n" for r in rest), fd)

    def uvicorn(self, msg: str) -> None:
        # uvicorn's levelprefix is "INFO:" padded to 9 characters: five spaces before the message.
        self.line(f"INFO:     {msg}", STDERR)

    def access(self, client: str, method: str, path: str, status: int, phrase: str) -> None:
        self.line(f'INFO:     {client} - "{method} {path} HTTP/1.1" {status} {phrase}', STDOUT)


def rank_prefix(rank: int, tp_size: int) -> str:
    return f" TP{rank}" if tp_size > 1 else ""


def tqdm_bar(desc: str, n: int, total: int, elapsed: float, *, shard_style: bool) -> str:
    """One tqdm update. shard_style: SGLang's `{desc}: {pct:3.0f}% Completed | n/total [...]` BAR_FORMAT."""
    pct = 100.0 * n / total if total else 100.0
    rate = n / elapsed if elapsed > 0 and n else 0.0
    remaining = (total - n) / rate if rate else None
    rate_s = f"{rate:.2f}it/s" if rate else "?it/s"
    times = f"[{_mmss(elapsed)}<{_mmss(remaining) if remaining is not None else '?'}, {rate_s}]"
    if shard_style:
        return f"{desc}: {pct:3.0f}% Completed | {n}/{total} {times}"
    width = 10
    filled = int(width * n / total) if total else width
    bar = "\u2588" * filled + " " * (width - filled)
    return f"{desc}: {pct:3.0f}%|{bar}| {n}/{total} {times}"


def _mmss(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60:02d}:{s % 60:02d}"

