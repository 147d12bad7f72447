"""The results exchange of a pytest-xdist run: what one worker measured, for the other workers' comparisons.

A comparison (sglang_results, greedy outputs across profiles) may need a figure that another worker measured.
Each worker publishes its benchmark results and greedy outputs as one file each in the run folder, written
whole and renamed in, so a reader never sees half an entry; every worker reads them all. The two entry types
and their JSON are defined here alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PublishedBench:
    """One benchmark result a worker measured: its profile, its baseline key, its node id, the result's JSON."""

    profile: str
    test_id: str
    nodeid: str
    result: dict[str, Any]


@dataclass(frozen=True)
class PublishedOutputs:
    """Greedy outputs a worker recorded under one profile, as their JSON."""

    profile: str
    outputs: list[dict[str, Any]]


Published = PublishedBench | PublishedOutputs
_KINDS: dict[str, type[PublishedBench] | type[PublishedOutputs]] = {"bench": PublishedBench,
                                                                    "outputs": PublishedOutputs}


class ResultsExchange:
    """The entries of one run, in ``folder`` (the run folder's results/)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def publish(self, entry: Published) -> None:
        self.folder.mkdir(exist_ok=True, mode=0o700)
        kind = next(name for name, cls in _KINDS.items() if isinstance(entry, cls))
        path = self.folder / f"{os.getpid()}-{time.time_ns()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"kind": kind, **vars(entry)}, default=str), encoding="utf-8")
        os.replace(tmp, path)

    def entries(self) -> list[Published]:
        """Every entry published so far, in the order they were written by each worker."""
        found: list[Published] = []
        for path in sorted(self.folder.glob("*.json")):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                data = json.loads(path.read_text(encoding="utf-8"))
                found.append(_KINDS[data.pop("kind")](**data))
        return found
