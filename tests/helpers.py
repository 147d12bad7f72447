"""Helpers for the plugin's own tests: find the samples, find the processes a server left behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]


def samples_dir() -> Path:
    """The real server logs in shared/samples/logs: beside the checkout here and in CI."""
    env = os.environ.get("PYTEST_SGLANG_SAMPLES")
    candidates = [Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "samples" / "logs", REPO / "shared" / "samples" / "logs"]
    for path in candidates:
        if path.is_dir():
            return path
    pytest.skip(f"samples not found (looked in {', '.join(map(str, candidates))}); set PYTEST_SGLANG_SAMPLES")
    raise AssertionError  # unreachable


def marked_processes(mark: str) -> list[psutil.Process]:
    """Live processes whose environment carries TEST_MARK=mark (every server descendant inherits it)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TEST_MARK") == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_for_no_processes(mark: str, timeout: float = 15.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        left = marked_processes(mark)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def profile_toml(name: str, mark: str, body: str = "", sim: str = "startup_seconds = 0.6") -> str:
    return (
        f'[tool.pytest_sglang.profiles.{name}]\nmodel = "/models/sim-model"\n{body}\n'
        f'env = {{ TEST_MARK = "{mark}" }}\nsim = {{ {sim} }}\n'
    )


def reap_marked(mark: str, timeout: float = 15.0) -> list[str]:
    """Wait up to `timeout` for the marked processes to go; SIGKILL those still there and describe them."""
    left = wait_for_no_processes(mark, timeout)
    names = []
    for proc in left:
        try:
            names.append(f"{proc.pid} {proc.name()} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.Error:
            names.append(str(proc.pid))
    return names


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped (a guardian that is gone, a run that ended)."""
    import subprocess

    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid
