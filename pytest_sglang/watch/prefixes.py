"""Line prefixes: which process wrote a log line, at which level, and the line's own text.

One job: `strip_prefixes` peels the prefixes that loggers, launchers and log exporters put before a line
(SGLang's "[2025-10-16 09:06:10 TP5] ", torch.distributed's "[rank1]: ", vLLM's "(EngineCore pid=1) ERROR
11-30 22:19:53 [core.py:700] ", cloud exports' "ERROR 2025-04-07T19:13:52.54Z ", docker compose's "sglang-1  | "),
in any order and nesting, and says which source (rank, worker process) the line came from. `source_of` is its
first part, cheaper.

A source is only ever named by an SGLang tag ("[" and a date), a torch rank tag ("[rank1]:") or a process tag
("(" ... "pid=N" ... ")"), so a line that holds neither "[" nor "(" names none: the watcher relies on that to
find the last line of a long stretch that names its source without reading the stretch line by line
(`SOURCE_LITERALS`).
"""

from __future__ import annotations

import re

__all__ = ["SOURCE_LITERALS", "source_of", "strip_prefixes"]

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
# torch.distributed's excepthook (distributed_c10d.py, _set_excepthook: every line of an uncaught exception as
# "[rank1]: ...", torchrun's workers) and per-rank loggers in its style ("[rank 1] ..."): the source is "rank1".
_TORCH_RANK = re.compile(r"^\[rank ?(?P<rank>\d+)\]:? ?")
# A bare ISO timestamp (container runtimes, python logging), with an optional stream tag and level.
_ISO_TS = re.compile(
    r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+"
    r"(?:(?:stdout|stderr) [FP] )?(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s*(?:[-:|]\s*)?)?"
)
# docker compose: "sglang-1  | "
_COMPOSE = re.compile(r"^[A-Za-z][\w.\-]*-\d+\s+\| ")


_ASCII_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
# What _LEVEL_TS can start with: its literals, tested with str.startswith before the regex.
_LEVEL_WORDS = ("DEBUG", "INFO", "WARN", "ERROR", "CRITICAL", "FATAL")
# Every line with a source holds one of these (the first characters of _SGLANG_TAG and _PROC_TAG).
SOURCE_LITERALS = ("[", "(")


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
            m = _TORCH_RANK.match(body)
            if m:
                if source is None:
                    source = f"rank{m.group('rank')}"
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




def source_of(line: str) -> str | None:
    """``strip_prefixes(line)[0]``, cheaper: the first prefix that names a source decides it, and most lines
    start with that very prefix (or with none at all)."""
    c = line[:1]
    if c == "[":
        m = _SGLANG_TAG.match(line)
        if m:
            return m.group("tags").strip() or "main"
        m = _TORCH_RANK.match(line)
        return f"rank{m.group('rank')}" if m else None
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
