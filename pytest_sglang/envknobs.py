"""The user's PYTEST_SGLANG_* environment knobs: each one's name and parser in one table, read only here.

The session checks them once at its start (a bad value is a usage error, as a bad option is); the modules that use
one read it through :func:`env_knobs` at the moment they need it, so none parses a variable on its own terms.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_sglang.errors import EnvKnobError

RELEASE_TIMEOUT_ENV = "PYTEST_SGLANG_RELEASE_TIMEOUT"
HEARTBEAT_TIMEOUT_ENV = "PYTEST_SGLANG_SSH_HEARTBEAT_TIMEOUT"  # seconds of silence before the host tears down
GPU_QUERY_ENV = "PYTEST_SGLANG_GPU_QUERY"
MACHINE_ENV = "PYTEST_SGLANG_MACHINE"  # overrides the detected machine name (e.g. a CI runner label)
STATE_DIR_ENV = "PYTEST_SGLANG_STATE_DIR"
COMMIT_ENV = "PYTEST_SGLANG_COMMIT"  # names the run's commit (over GITHUB_SHA and git rev-parse HEAD)
HISTORY_TIMEOUT_ENV = "PYTEST_SGLANG_HISTORY_TIMEOUT"  # seconds a history write waits for another writer's lock
GPU_QUERIES = ("nvml", "nvidia-smi", "off")


@dataclass(frozen=True)
class EnvKnobs:
    """The knobs that are set; None where a variable is unset or empty (the caller's default applies)."""

    release_timeout: float | None = None
    ssh_heartbeat_timeout: float | None = None
    gpu_query: str | None = None  # one of GPU_QUERIES
    machine: str | None = None
    state_dir: Path | None = None
    commit: str | None = None
    history_timeout: float | None = None


def _seconds(raw: str) -> float:
    value = float(raw)
    if not value > 0 or value == float("inf"):
        raise ValueError(raw)
    return value


def _gpu_query(raw: str) -> str:
    if raw.lower() not in GPU_QUERIES:
        raise ValueError(raw)
    return raw.lower()


_KNOBS: tuple[tuple[str, str, Callable[[str], object], str], ...] = (
    ("release_timeout", RELEASE_TIMEOUT_ENV, _seconds, "a number of seconds above 0, e.g. 120"),
    ("ssh_heartbeat_timeout", HEARTBEAT_TIMEOUT_ENV, _seconds, "a number of seconds above 0, e.g. 30"),
    ("gpu_query", GPU_QUERY_ENV, _gpu_query, "one of " + ", ".join(GPU_QUERIES)),
    ("machine", MACHINE_ENV, str, "a machine name, e.g. ci-8xh200"),
    ("state_dir", STATE_DIR_ENV, Path, "a folder path"),
    ("commit", COMMIT_ENV, str, "a commit name, e.g. abc1234"),
    ("history_timeout", HISTORY_TIMEOUT_ENV, _seconds, "a number of seconds above 0, e.g. 60"),
)


def env_knobs(environ: Mapping[str, str] | None = None) -> EnvKnobs:
    """The knobs set in ``environ`` (default: os.environ); EnvKnobError naming every bad one and what it expects."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    problems = []
    for field_name, var, parse, expected in _KNOBS:
        raw = environ.get(var, "").strip()
        if not raw:
            continue
        try:
            values[field_name] = parse(raw)
        except ValueError:
            problems.append(f"{var}={raw!r} is not {expected}: set it to that, or unset it")
    if problems:
        raise EnvKnobError("; ".join(problems) + ".")
    return EnvKnobs(**values)  # type: ignore[arg-type]
