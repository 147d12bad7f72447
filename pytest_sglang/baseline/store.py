"""The baseline file: one entry of figures per profile, test id and machine key; safe for concurrent writers.

The file (default ``.sglang-baselines.json`` in the rootdir, meant to be committed)::

    {
      "format": "pytest-sglang-baselines",
      "version": 1,
      "baselines": {
        "eagle3": {
          "tests/test_perf.py::test_throughput": {
            "8x NVIDIA RTX PRO 6000 | driver 580.82.07 | sglang 0.5.2": {
              "machine": "8x NVIDIA RTX PRO 6000",
              "recorded_at": "2026-11-30T10:02:11+00:00",
              "commit": "abc1234",
              "metrics": {"output_throughput": 89.5, "median_ttft_ms": 41.2}
            }
          }
        }
      }
    }

Writes go through a file lock and an atomic rename, so pytest-xdist workers can record at once; a file that
cannot be parsed is reported with its line and column (:func:`validate` names the first bad key path) and is
never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from pytest_sglang.baseline.directions import direction
from pytest_sglang.baseline.machine import Machine
from pytest_sglang.errors import BaselineError

FORMAT = "pytest-sglang-baselines"
VERSION = 1
DEFAULT_FILENAME = ".sglang-baselines.json"


@dataclass
class Entry:
    machine: str
    recorded_at: str
    commit: str | None
    metrics: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"machine": self.machine, "recorded_at": self.recorded_at, "commit": self.commit,
                "metrics": dict(sorted(self.metrics.items()))}


def _empty() -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "baselines": {}}


class BaselineStore:
    """The baseline file. Reads are cached; :meth:`record` re-reads under the lock and replaces atomically."""

    def __init__(self, path: str | Path, *, lock_timeout: float = 120.0) -> None:
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self._cache: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"BaselineStore({str(self.path)!r})"

    @property
    def lock_path(self) -> Path:
        # In the temp dir, not beside the committed file: no lock file to ignore in git.
        digest = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"pytest-sglang-baseline-{digest}.lock"

    def _lock(self) -> FileLock:
        return FileLock(str(self.lock_path), timeout=self.lock_timeout)

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return _empty()
        except OSError as exc:
            raise BaselineError(f"cannot read baseline file {self.path}: {exc}") from exc
        if not text.strip():
            raise BaselineError(self._broken("it is empty"))
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BaselineError(self._broken(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
                                ) from None
        validate(data, self._broken)
        return data  # type: ignore[no-any-return]

    def _broken(self, what: str) -> str:
        return (f"baseline file {self.path} is broken: {what}. It was left as it is. Fix it by hand "
                f"(`git diff {self.path.name}` shows what changed) or delete it and record anew with "
                "--sglang-update-baseline.")

    def load(self) -> dict[str, Any]:
        if self._cache is None:
            self._cache = self._read()
        return self._cache

    def lookup(self, profile: str, test_id: str, machine: Machine) -> Entry | None:
        raw = self.load()["baselines"].get(profile, {}).get(test_id, {}).get(machine.key)
        if raw is None:
            return None
        return Entry(machine=raw.get("machine", machine.name), recorded_at=raw.get("recorded_at", ""),
                     commit=raw.get("commit"), metrics={k: float(v) for k, v in raw["metrics"].items()})

    def other_keys(self, profile: str, test_id: str) -> list[str]:
        """Machine keys recorded for this profile and test (to explain a miss)."""
        return sorted(self.load()["baselines"].get(profile, {}).get(test_id, {}))

    def record(self, profile: str, test_id: str, machine: Machine, metrics: Mapping[str, float], *,
               commit: str | None = None, when: datetime | None = None) -> Entry:
        """Merge ``metrics`` into the entry (other metrics of the entry are kept), under the lock."""
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        for name in clean:
            direction(name)
        try:
            with self._lock():
                data = self._read()
                node = data["baselines"].setdefault(profile, {}).setdefault(test_id, {})
                old = node.get(machine.key, {})
                entry = Entry(
                    machine=machine.name,
                    recorded_at=(when or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
                    commit=commit,
                    metrics={**old.get("metrics", {}), **clean},
                )
                node[machine.key] = entry.to_json()
                self._write(data)
                self._cache = data
                return entry
        except Timeout:
            raise BaselineError(
                f"could not lock baseline file {self.path} within {self.lock_timeout:.0f} s "
                f"(lock file {self.lock_path}); is another pytest stuck?") from None

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=2, sort_keys=True)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        finally:
            if tmp.exists():
                tmp.unlink()


def validate(data: Any, broken: Any = lambda what: what) -> None:
    """Raise BaselineError naming the first key path whose shape is wrong."""
    if not isinstance(data, dict):
        raise BaselineError(broken(f"the top level is a {type(data).__name__}, not an object"))
    if data.get("format") != FORMAT:
        raise BaselineError(broken(f'"format" is {data.get("format")!r}, expected {FORMAT!r}'))
    if not isinstance(data.get("version"), int) or data["version"] > VERSION:
        raise BaselineError(broken(f'"version" is {data.get("version")!r}; this pytest-sglang reads '
                                   f"version {VERSION} or older"))
    baselines = data.get("baselines")
    if not isinstance(baselines, dict):
        raise BaselineError(broken('"baselines" must be an object'))
    for profile, tests in baselines.items():
        if not isinstance(tests, dict):
            raise BaselineError(broken(f"baselines.{profile} must be an object"))
        for test_id, machines in tests.items():
            if not isinstance(machines, dict):
                raise BaselineError(broken(f"baselines.{profile}[{test_id!r}] must be an object"))
            for key, entry in machines.items():
                where = f"baselines.{profile}[{test_id!r}][{key!r}]"
                if not isinstance(entry, dict) or not isinstance(entry.get("metrics"), dict):
                    raise BaselineError(broken(f'{where} must be an object with a "metrics" object'))
                for metric, value in entry["metrics"].items():
                    if isinstance(value, bool) or not isinstance(value, (int, float)):
                        raise BaselineError(broken(f"{where}.metrics.{metric} is {value!r}, not a number"))

