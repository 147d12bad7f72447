"""Watching a server's log: incremental reading, line prefixes, root causes, and the rules of its kind.

Pytest-independent; one job per module, data flowing one way:

    tail.py       LogTail: a growing file as blocks of whole raw lines (new bytes only, bounded memory); their text
    prefixes.py   strip_prefixes: which source (rank, worker) wrote a line, at which level, and its own text
    literals.py   LiteralSet: the prefilter, does a line or a block of bytes hold one of the rules' literals
    shapes.py     the shapes of a Python failure's lines (traceback header, frames, ...), literals declared beside
    extractor.py  RootCauseExtractor: the per-source state machine that turns those lines into root causes
    causes.py     the extractor's records (a cause and how it is shown, an open traceback, ...)
    watcher.py    LogWatcher: a Kind's rules (kinds.py) applied as the log grows: ready, phases, progress, failure
"""

from .extractor import RootCauseExtractor, extract_root_causes
from .prefixes import strip_prefixes
from .tail import LogTail, clean_line
from .watcher import LogWatcher, Progress

__all__ = [
    "LogTail",
    "LogWatcher",
    "Progress",
    "RootCauseExtractor",
    "clean_line",
    "extract_root_causes",
    "strip_prefixes",
]
