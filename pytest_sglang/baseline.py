"""Baseline store and direction-aware comparison. Knows nothing about pytest.

The baseline file (default ``.sglang-baselines.json`` in the rootdir, meant to be committed) holds, per
profile, per test id and per machine fingerprint, the figures one run recorded::

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

Each metric knows which way is worse (:func:`direction`): higher is better for throughputs and the accept
length, lower for latencies (``*_ms``), ``duration``, ``failed`` and ``startup_seconds``. Writes go through a
file lock and an atomic rename, so pytest-xdist workers can record at once; a file that cannot be parsed is
reported with its line and column and is never overwritten.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock, Timeout

from pytest_sglang.errors import BaselineError

FORMAT = "pytest-sglang-baselines"
VERSION = 1
DEFAULT_FILENAME = ".sglang-baselines.json"
MACHINE_ENV = "PYTEST_SGLANG_MACHINE"  # overrides the detected machine name (e.g. a CI runner label)

Direction = Literal["higher", "lower"]

_HIGHER = re.compile(r"(^|_)throughput$|^accept_length$|^completed$|^concurrency$|^max_output_tokens_per_s$")
_LOWER = re.compile(r"_ms$|^duration$|^failed$|^startup_seconds$|_seconds$|^chunk_count_mismatches$")


def direction(metric: str) -> Direction:
    """Which way is better for ``metric``; raises BaselineError for a name whose direction is unknown."""
    if _HIGHER.search(metric):
        return "higher"
    if _LOWER.search(metric):
        return "lower"
    raise BaselineError(
        f"no direction known for metric {metric!r}: baselines compare throughputs (*_throughput, higher is "
        "better), accept_length (higher), latencies (*_ms, lower), duration, failed and startup_seconds "
        "(lower)"
    )


def unit(metric: str) -> str:
    if metric == "request_throughput":
        return "req/s"
    if metric.endswith("_throughput") or metric == "max_output_tokens_per_s":
        return "tok/s"
    if metric.endswith("_ms"):
        return "ms"
    if metric.endswith("seconds") or metric == "duration":
        return "s"
    return ""


def fmt_value(metric: str, value: float) -> str:
    u = unit(metric)
    digits = 1 if abs(value) >= 10 or u in ("tok/s",) else 2
    text = f"{value:.{digits}f}"
    return f"{text} {u}" if u else text


# --------------------------------------------------------------------------------------------------------
# Tolerances


@dataclass(frozen=True)
class Tolerance:
    """``5%`` (relative to the baseline) or an absolute amount in the metric's unit."""

    amount: float
    relative: bool

    @classmethod
    def parse(cls, metric: str, raw: str | float | int) -> Tolerance:
        if isinstance(raw, bool):
            raise BaselineError(f"tolerance for {metric} must be like '5%' or a number, got {raw!r}")
        if isinstance(raw, (int, float)):
            value, relative = float(raw), False
        elif isinstance(raw, str):
            text = raw.strip()
            relative = text.endswith("%")
            try:
                value = float(text[:-1] if relative else text)
            except ValueError:
                raise BaselineError(
                    f"tolerance for {metric} must be like '5%' (relative) or '3' (absolute, in "
                    f"{unit(metric) or 'its unit'}), got {raw!r}") from None
        else:
            raise BaselineError(f"tolerance for {metric} must be like '5%' or a number, got {raw!r}")
        if not math.isfinite(value) or value < 0:
            raise BaselineError(f"tolerance for {metric} must be a finite amount >= 0, got {raw!r}")
        return cls(value, relative)

    def allowed(self, baseline: float) -> float:
        return abs(baseline) * self.amount / 100.0 if self.relative else self.amount

    def __str__(self) -> str:
        return f"{self.amount:g}%" if self.relative else f"{self.amount:g}"


# --------------------------------------------------------------------------------------------------------
# Machine fingerprint


@dataclass(frozen=True)
class Machine:
    """Where a figure was measured. ``key`` selects the baseline; ``name`` is what messages show."""

    name: str  # "8x NVIDIA RTX PRO 6000" or "cpu: AMD EPYC 7B13 (2 cores)"
    driver: str | None = None
    server: str | None = None  # "sglang 0.5.2"

    @property
    def key(self) -> str:
        parts = [self.name]
        if self.driver:
            parts.append(f"driver {self.driver}")
        if self.server:
            parts.append(self.server)
        return " | ".join(parts)


@functools.lru_cache(maxsize=1)
def _gpus() -> tuple[list[str], str | None]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return [], None
    try:
        out = subprocess.run([exe, "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return [], None
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.count(",") >= 2]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and re.fullmatch(r"\s*\d+(\s*,\s*\d+)*\s*", visible):
        wanted = {v.strip() for v in visible.split(",")}
        rows = [r for r in rows if r[0] in wanted]
    names = [r[1] for r in rows]
    drivers = sorted({r[2] for r in rows})
    return names, ",".join(drivers) if drivers else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def detect_machine(server: str | None = None) -> Machine:
    """GPU model, count and driver from nvidia-smi where present, else the CPU model and core count.
    ``PYTEST_SGLANG_MACHINE`` replaces the detected name (the driver is still detected)."""
    names, driver = _gpus()
    if names:
        counts = Counter(names)
        name = " + ".join(f"{n}x {model}" for model, n in sorted(counts.items()))
    else:
        name = f"cpu: {_cpu_model()} ({os.cpu_count() or 1} cores)"
    override = os.environ.get(MACHINE_ENV, "").strip()
    return Machine(name=override or name, driver=driver, server=server)


def git_commit(cwd: str | Path | None = None) -> str | None:
    exe = shutil.which("git")
    if not exe:
        return None
    try:
        proc = subprocess.run([exe, "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


# --------------------------------------------------------------------------------------------------------
# Store


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


# --------------------------------------------------------------------------------------------------------
# Comparison


@dataclass
class Check:
    """One metric compared with its baseline."""

    metric: str
    current: float | None
    baseline: float | None
    tolerance: Tolerance
    direction: Direction
    status: Literal["ok", "regressed", "improved", "no-baseline", "missing"]
    change_pct: float | None = None  # signed: positive is better, negative is worse
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "current": self.current, "baseline": self.baseline,
                "tolerance": str(self.tolerance), "direction": self.direction, "status": self.status,
                "change_pct": self.change_pct, "message": self.message}


@dataclass
class Comparison:
    """All checks of one ``check()`` call, and what the test should make of them."""

    profile: str
    test_id: str
    machine: Machine
    entry: Entry | None
    checks: list[Check] = field(default_factory=list)
    recorded: bool = False
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # failures other than regressions (strict, no baseline)

    @property
    def regressions(self) -> list[Check]:
        return [c for c in self.checks if c.status in ("regressed", "missing")]

    @property
    def failed(self) -> bool:
        return bool(self.regressions or self.errors)

    def failure_message(self) -> str:
        return "\n".join([c.message for c in self.regressions] + self.errors)

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "test_id": self.test_id, "machine": self.machine.key,
                "recorded": self.recorded,
                "baseline_recorded_at": self.entry.recorded_at if self.entry else None,
                "baseline_commit": self.entry.commit if self.entry else None,
                "checks": [c.to_dict() for c in self.checks], "notes": list(self.notes),
                "errors": list(self.errors)}


def _context(profile: str, entry: Entry) -> str:
    when = entry.recorded_at[:10] if entry.recorded_at else "at an unknown date"
    at = f" at {entry.commit}" if entry.commit else ""
    return f"profile {profile}, {entry.machine}, recorded {when}{at}"


def compare_one(metric: str, current: float | None, baseline: float | None, tolerance: Tolerance, *,
                profile: str, entry: Entry | None) -> Check:
    d = direction(metric)
    if baseline is None or entry is None:
        measured = fmt_value(metric, current) if current is not None else "n/a"
        return Check(metric, current, None, tolerance, d, "no-baseline",
                     message=f"{metric}: no baseline yet ({measured} measured)")
    if current is None or (isinstance(current, float) and math.isnan(current)):
        return Check(metric, None, baseline, tolerance, d, "missing",
                     message=f"{metric} regressed: this run has no value for it vs baseline "
                             f"{fmt_value(metric, baseline)} ({_context(profile, entry)})")
    worse_by = (baseline - current) if d == "higher" else (current - baseline)
    pct = (-worse_by / abs(baseline) * 100.0) if baseline else (0.0 if worse_by == 0 else math.copysign(
        math.inf, -worse_by))
    allowed = tolerance.allowed(baseline)
    shown_pct = f"{abs(pct):.1f}%" if math.isfinite(pct) else "from 0"
    versus = (f"{fmt_value(metric, current)} vs baseline {fmt_value(metric, baseline)} "
              f"(tolerance {tolerance}; {_context(profile, entry)})")
    if worse_by > allowed:
        return Check(metric, current, baseline, tolerance, d, "regressed", pct,
                     f"{metric} regressed {shown_pct}: {versus}")
    if -worse_by > allowed:
        return Check(metric, current, baseline, tolerance, d, "improved", pct,
                     f"{metric} improved {shown_pct}: {versus}; record it with --sglang-update-baseline")
    return Check(metric, current, baseline, tolerance, d, "ok", pct,
                 f"{metric} {'+' if pct >= 0 else '-'}{shown_pct} within tolerance: {versus}")


def metric_value(result: Any, metric: str) -> float | None:
    """``result.metric`` or ``result[metric]``: a BenchResult, a server handle, or a mapping."""
    if isinstance(result, Mapping):
        value = result.get(metric)
    else:
        value = getattr(result, metric, None)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise BaselineError(f"{metric} of {type(result).__name__} is {value!r}, not a number") from None


def compare(
    result: Any,
    tolerances: Mapping[str, str | float | int],
    *,
    store: BaselineStore,
    profile: str,
    test_id: str,
    machine: Machine,
    update: bool = False,
    strict: bool = False,
    commit: str | None = None,
    also_record: Iterable[str] = (),
) -> Comparison:
    """Compare ``result``'s figures with the stored baseline (or record them, with ``update``)."""
    parsed = {m: Tolerance.parse(m, t) for m, t in tolerances.items()}
    for metric in parsed:
        direction(metric)
    values = {m: metric_value(result, m) for m in parsed}
    if update:
        to_record = dict(values)
        for extra in also_record:
            if extra not in to_record:
                to_record[extra] = metric_value(result, extra)
        recorded = store.record(profile, test_id, machine,
                                {k: v for k, v in to_record.items() if v is not None}, commit=commit)
        comp = Comparison(profile, test_id, machine, recorded, recorded=True)
        shown = ", ".join(f"{k}={fmt_value(k, v)}" for k, v in to_record.items() if v is not None)
        comp.notes.append(f"recorded baseline for {profile} / {test_id} on {machine.key}: {shown}")
        return comp
    entry = store.lookup(profile, test_id, machine)
    comp = Comparison(profile, test_id, machine, entry)
    for metric, tol in parsed.items():
        baseline = entry.metrics.get(metric) if entry else None
        check = compare_one(metric, values[metric], baseline, tol, profile=profile, entry=entry)
        comp.checks.append(check)
        if check.status == "improved":
            comp.notes.append(check.message)
    missing = [c for c in comp.checks if c.status == "no-baseline"]
    if missing:
        where = f"{profile} / {test_id} on {machine.key}"
        others = [k for k in store.other_keys(profile, test_id) if k != machine.key]
        hint = f" (the file has this test on: {'; '.join(others)})" if others else ""
        names = ", ".join(c.metric for c in missing)
        text = (f"no baseline for {names} of {where} in {store.path}{hint}; "
                "run with --sglang-update-baseline to record one")
        if strict:
            comp.errors.append(f"{text} (--sglang-baseline-strict makes this a failure)")
        else:
            comp.notes.append(text)
    return comp


# --------------------------------------------------------------------------------------------------------
# Session-level checker (what the sglang_baseline fixture calls)


class BaselineChecker:
    """One per session: the store, the mode (compare, update, strict) and the machine per server version."""

    def __init__(self, store: BaselineStore, *, update: bool = False, strict: bool = False,
                 commit: str | None = None) -> None:
        self.store = store
        self.update = update
        self.strict = strict
        self.commit = commit
        self._machines: dict[str | None, Machine] = {}

    def machine(self, server: str | None) -> Machine:
        if server not in self._machines:
            self._machines[server] = detect_machine(server)
        return self._machines[server]

    def check(self, result: Any, tolerances: Mapping[str, str | float | int], *, profile: str, test_id: str,
              server: str | None) -> Comparison:
        """Compare (or record) ``result``. With no tolerances: ``output_throughput="5%"`` for a benchmark
        result, ``startup_seconds="20%"`` for a server handle."""
        if not tolerances:
            if metric_value(result, "output_throughput") is not None:
                tolerances = {"output_throughput": "5%"}
            elif metric_value(result, "startup_seconds") is not None:
                tolerances = {"startup_seconds": "20%"}
            else:
                raise BaselineError("check() needs tolerances, e.g. check(r, output_throughput='5%')")
        also = ["output_throughput"] if metric_value(result, "output_throughput") is not None else []
        return compare(result, tolerances, store=self.store, profile=profile, test_id=test_id,
                       machine=self.machine(server), update=self.update, strict=self.strict,
                       commit=self.commit, also_record=also)
