"""Start the bundled simulator as a subprocess for the bench tests (own session; the group dies in teardown, and
with pytest if it is killed)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from helpers import die_with_pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SimServer:
    """Quacks like sglang_server for run_bench (pytest_sglang.bench.runner.ServerLike)."""

    base_url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    api_key: str | None = None
    kind: str = "sglang"
    model: str | None = "sim-model"
    profile: str = "sim"
    startup_seconds: float = 0.0
    host: str = "127.0.0.1"

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextmanager
def run_sim(tmp: Path, knobs: dict[str, Any], *args: str, api_key: str | None = None,
            env: dict[str, str] | None = None) -> Iterator[SimServer]:
    port = free_port()
    env = dict(os.environ, **(env or {}), PYTEST_SGLANG_SIM=json.dumps({"startup_seconds": 0.2, **knobs}))
    cmd = [sys.executable, "-m", "pytest_sglang.sim", "--model-path", "sim-model", "--port", str(port), *args]
    if api_key:
        cmd += ["--api-key", api_key]
    log_path = tmp / f"sim-{port}.log"
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=die_with_pytest())
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"simulator exited {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"simulator not ready in 30 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        yield SimServer(f"http://127.0.0.1:{port}", proc, log_path, api_key=api_key,
                        startup_seconds=time.monotonic() - t0)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
