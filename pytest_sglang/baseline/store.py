"""The baseline file: one entry of figures per profile, test id and machine key; safe for concurrent writers.

The file (default ``.sglang-baselines.json`` in the rootdir, meant to be committed)::

    {
      "format": "pytest-sglang-baselines",
      "version": 3,
      "baselines": {
        "eagle3": {
          "tests/test_perf.py::test_throughput": {
            "8x NVIDIA RTX PRO 6000 | driver 580.82.07 | sglang 0.5.2": {
              "machine": "8x NVIDIA RTX PRO 6000",
              "driver": "580.82.07",
              "server": "sglang 0.5.2",
              "recorded_at": "2026-11-30T10:02:11+00:00",
              "commit": "abc1234",
              "metrics": {"output_throughput": 89.5, "median_ttft_ms": 41.2},
              "samples": {"output_throughput": [88.1, 89.5, 90.2], "median_ttft_ms": [40.9, 41.2, 41.9]},
              "spread": {"output_throughput": {"n": 3, "median": 89.5, "cv_pct": 1.2, "min": 88.1, ...}},
              "sessions": {"output_throughput": [92.6, 81.0, 89.5], "median_ttft_ms": [40.1, 44.0, 41.2]}
            }
          }
        }
      },
      "instance_noise": {
        "8x NVIDIA RTX PRO 6000 | driver 580.82.07 | sglang 0.5.2": {
          "concurrency=16 input_len=128 num_requests=64 output_len=128 rounds=10": {
            "output_throughput": [0.0962, -0.2332, 0.2135, 0.1133, -0.1020]
          }
        }
      }
    }

``metrics`` holds each figure's median (what older readers compare), ``samples`` the per-round values it
is the median of (``sglang_bench(rounds=N)``), ``spread`` their n, median, mean, stdev, CV and range, for
people reading the file; all three are of the latest recording. ``sessions`` (version 3) holds each figure's
median of the last SESSIONS_KEPT recording sessions, oldest first: every recording (a run with
--sglang-update-baseline, e.g. each CI run on the main branch) appends one, so the check learns how much
sessions differ (engine/sessions.py). To restart that history (after a deliberate change of speed), delete the entry's
``sessions`` key, or the entry: the next recording starts anew. Version 1 and 2 files (entries without
``samples`` or ``sessions``) still load: each figure is then one sample and one session. Recording into
them rewrites the file as version 3.

``instance_noise`` (optional; readers before it ignore it) holds, per machine key and A/B workload (the
``sglang_ab`` arguments, :func:`workload_key`), each metric's natural log of the ratio second/first of the
last SESSIONS_KEPT A/A runs: ``sglang_ab`` runs whose two profiles launch the same server, recorded with
--sglang-update-baseline. How much two instances of one server differ on the host is what an A/B check then
judges against (engine/instance_noise.py). To restart it, delete the workload's key.

Writes go through a file lock and an atomic rename, so pytest-xdist workers can record at once; a file that
cannot be parsed is reported with its line and column (:func:`validate` names the first bad key path) and is
never overwritten.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import statistics
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from pytest_sglang.baseline.directions import direction
from pytest_sglang.bench.metrics import Spread
from pytest_sglang.errors import BaselineError
from pytest_sglang.machine.facts import Machine

FORMAT = "pytest-sglang-baselines"
VERSION = 3
SESSIONS_KEPT = 20  # recording sessions an entry remembers
DEFAULT_FILENAME = ".sglang-baselines.json"
INSTANCE_NOISE = "instance_noise"


def workload_key(workload: Mapping[str, Any]) -> str:
    """The A/B workload as the instance noise is keyed: its arguments, sorted (``rounds=10`` among them)."""
    return " ".join(f"{k}={workload[k]}" for k in sorted(workload))


@dataclass
class Entry:
    machine: str
    recorded_at: str
    commit: str | None
    metrics: dict[str, float]  # metric -> the median of its samples
    samples: dict[str, list[float]] = field(default_factory=dict)  # metric -> per-round values (may be absent)
    server: str | None = None
    driver: str | None = None
    sessions: dict[str, list[float]] = field(default_factory=dict)  # metric -> recording sessions' medians

    def sessions_of(self, metric: str) -> list[float]:
        """The medians of ``metric``'s recording sessions, oldest first; an older file's figure is one session."""
        if metric in self.sessions:
            return list(self.sessions[metric])
        return [self.metrics[metric]] if metric in self.metrics else []

    def samples_of(self, metric: str) -> list[float] | None:
        """The recorded rounds of ``metric``: its samples, or its one figure (a version 1 entry); None if absent."""
        if metric in self.samples:
            return list(self.samples[metric])
        if metric in self.metrics:
            return [self.metrics[metric]]
        return None

    def to_json(self) -> dict[str, Any]:
        samples = {k: v for k, v in sorted(self.samples.items()) if k in self.metrics}
        return {"machine": self.machine, "driver": self.driver, "server": self.server,
                "recorded_at": self.recorded_at, "commit": self.commit,
                "metrics": dict(sorted(self.metrics.items())), "samples": samples,
                "spread": {k: Spread.of(v).to_dict() for k, v in samples.items()},
                "sessions": {k: self.sessions_of(k) for k in sorted(self.metrics)}}


def _values(raw: float | Sequence[float]) -> list[float]:
    values = [float(raw)] if isinstance(raw, (int, float)) else [float(v) for v in raw]
    return [v for v in values if math.isfinite(v)]


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

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            with self._lock():
                yield
        except Timeout:
            raise BaselineError(
                f"could not lock baseline file {self.path} within {self.lock_timeout:.0f} s "
                f"(lock file {self.lock_path}); is another pytest stuck?") from None

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

    def preflight(self, *, write: bool) -> None:
        """What a check or a recording would run into, told at session start instead of after a GPU startup: a
        file that cannot be read or parsed, and with ``write`` (--sglang-update-baseline) a file or folder that
        cannot be written. BaselineError saying what to do; the file is left as it is."""
        from pytest_sglang.writable import existing_parent, may_write

        if self.path.is_dir():
            raise BaselineError(f"baseline file {self.path} is a folder: point --sglang-baseline (ini "
                                f"sglang_baseline) at a file, e.g. {self.path / DEFAULT_FILENAME}.")
        self.load()
        if not write:
            return
        folder = self.path.parent if self.path.parent.exists() else existing_parent(self.path)
        if self.path.exists() and not may_write(self.path):
            raise BaselineError(f"baseline file {self.path} is read-only, so --sglang-update-baseline could not "
                                "record this run's figures: make it writable (chmod u+w), or point "
                                "--sglang-baseline at a writable copy. It was left as it is.")
        if not may_write(folder):
            raise BaselineError(f"baseline file {self.path} cannot be written: its folder {folder} is read-only "
                                "(a recording replaces the file through a new one beside it). Make the folder "
                                "writable, or point --sglang-baseline at a writable place.")

    def load(self) -> dict[str, Any]:
        if self._cache is None:
            self._cache = self._read()
        return self._cache

    def lookup(self, profile: str, test_id: str, machine: Machine) -> Entry | None:
        raw = self.load()["baselines"].get(profile, {}).get(test_id, {}).get(machine.key)
        if raw is None:
            return None
        return Entry(machine=raw.get("machine", machine.name), recorded_at=raw.get("recorded_at", ""),
                     commit=raw.get("commit"), metrics={k: float(v) for k, v in raw["metrics"].items()},
                     samples={k: [float(x) for x in v] for k, v in (raw.get("samples") or {}).items()},
                     server=raw.get("server", machine.server), driver=raw.get("driver", machine.driver),
                     sessions={k: [float(x) for x in v] for k, v in (raw.get("sessions") or {}).items()})

    def other_keys(self, profile: str, test_id: str) -> list[str]:
        """Machine keys recorded for this profile and test (to explain a miss)."""
        return sorted(self.load()["baselines"].get(profile, {}).get(test_id, {}))

    def record(self, profile: str, test_id: str, machine: Machine,
               metrics: Mapping[str, float | Sequence[float] | None], *, commit: str | None = None,
               when: datetime | None = None) -> Entry:
        """Merge ``metrics`` (a figure, or the samples of its rounds) into the entry, under the lock: each
        recorded metric's samples replace its old ones and its median joins its sessions (the last
        SESSIONS_KEPT kept), other metrics of the entry are kept."""
        clean = {k: vals for k, v in metrics.items() if v is not None and (vals := _values(v))}
        for name in clean:
            direction(name)
        with self._locked():
            data = self._read()
            data["version"] = VERSION
            node = data["baselines"].setdefault(profile, {}).setdefault(test_id, {})
            old = node.get(machine.key, {})
            old_samples = {k: v for k, v in (old.get("samples") or {}).items() if k not in clean}
            old_metrics = old.get("metrics", {})
            sessions = {k: list(v) for k, v in (old.get("sessions") or {}).items()}
            for k in old_metrics:
                sessions.setdefault(k, [old_metrics[k]])  # an older file's figure: one session
            for k, v in clean.items():
                sessions[k] = [*sessions.get(k, []), statistics.median(v)][-SESSIONS_KEPT:]
            entry = Entry(
                machine=machine.name,
                recorded_at=(when or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
                commit=commit,
                metrics={**old_metrics, **{k: statistics.median(v) for k, v in clean.items()}},
                samples={**old_samples, **clean},
                server=machine.server,
                driver=machine.driver,
                sessions=sessions,
            )
            node[machine.key] = entry.to_json()
            self._write(data)
            self._cache = data
            return entry

    def instance_noise(self, machine: Machine, workload: str) -> dict[str, list[float]]:
        """metric -> the log ratios of the A/A runs recorded for this machine and workload, oldest first."""
        raw = self.load().get(INSTANCE_NOISE, {}).get(machine.key, {}).get(workload, {})
        return {k: [float(x) for x in v] for k, v in raw.items()}

    def record_instance_noise(self, machine: Machine, workload: str, log_ratios: Mapping[str, float]) -> None:
        """Append one A/A run's log ratio of each metric (the last SESSIONS_KEPT kept), under the lock."""
        clean = {k: float(v) for k, v in log_ratios.items() if math.isfinite(v)}
        with self._locked():
            data = self._read()
            node = data.setdefault(INSTANCE_NOISE, {}).setdefault(machine.key, {}).setdefault(workload, {})
            for k, v in clean.items():
                node[k] = [*node.get(k, []), v][-SESSIONS_KEPT:]
            self._write(data)
            self._cache = data

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
                _validate_lists(entry, ("samples", "sessions"), where, broken)
    noise = data.get(INSTANCE_NOISE, {})
    if not isinstance(noise, dict):
        raise BaselineError(broken(f'"{INSTANCE_NOISE}" must be an object'))
    for key, workloads in noise.items():
        if not isinstance(workloads, dict):
            raise BaselineError(broken(f"{INSTANCE_NOISE}[{key!r}] must be an object"))
        _validate_lists(workloads, list(workloads), f"{INSTANCE_NOISE}[{key!r}]", broken)


def _validate_lists(node: dict[str, Any], parts: Sequence[str], where: str, broken: Any) -> None:
    """Each ``node[part]`` present is an object of non-empty lists of numbers."""
    for part in parts:
        lists = node.get(part, {})
        if not isinstance(lists, dict):
            raise BaselineError(broken(f"{where}.{part} must be an object of lists of numbers"))
        for metric, values in lists.items():
            if (not isinstance(values, list) or not values
                    or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values)):
                raise BaselineError(broken(f"{where}.{part}.{metric} is {values!r}, not a non-empty "
                                           "list of numbers"))
