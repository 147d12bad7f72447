"""Helpers for the plugin's own tests: the vendored samples, the processes a server left behind, and the guard that
makes a server a test starts by hand die with its pytest."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from pytest_sglang.launch.process import die_with_parent

REPO = Path(__file__).resolve().parents[1]

# The real server logs from public bug reports, each with a sidecar saying what must come out: vendored, so a
# fresh clone's tests need nothing beside the checkout.
SAMPLES = REPO / "tests" / "samples" / "logs"


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


def die_with_pytest() -> Callable[[], None] | None:
    """Popen's ``preexec_fn`` for a simulator or server a test starts by hand, outside the plugin's reaper: the
    kernel SIGKILLs the child when this process dies, SIGKILL of pytest included, when no teardown runs
    (the child's own children then go as the simulator's do: end of file on their control pipe)."""
    return die_with_parent(signal.SIGKILL)


def interruptible() -> None:
    """Popen's ``preexec_fn`` for a child pytest a test will Ctrl-C: SIGINT back to its default, so that Python
    installs its KeyboardInterrupt handler even where this suite was started with SIGINT ignored (a shell's
    background job, nohup: the ignore is inherited, and Python then leaves SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped (a guardian that is gone, a run that ended)."""
    import subprocess

    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


FAKE_SMI = r'''#!{python}
"""A stand-in for nvidia-smi: config lines "PID MIB HOLDER_PID"; PID is reported while HOLDER_PID lives.
--query-gpu answers each field asked of two GPUs from FAKE_GPU_READINGS ({{"1": {{"power.draw": 300}}}}), [N/A]
for a field it does not set; --id=0,1 picks GPUs."""
import os, sys
calls = os.environ.get("FAKE_GPU_CALLS")
if calls:
    with open(calls, "a") as fh:
        fh.write(" ".join(sys.argv[1:]) + "\n")
def alive(pid):
    try:
        with open(f"/proc/{{pid}}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
query = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--query-gpu=")), None)
if query is not None:
    gpus = [{{"index": 0, "pci.bus_id": "00000000:1B:00.0"}}, {{"index": 1, "pci.bus_id": "00000000:43:00.0"}}]
    readings = os.environ.get("FAKE_GPU_READINGS")
    if readings and os.path.exists(readings):
        import json
        with open(readings) as fh:
            for index, fields in json.load(fh).items():
                gpus[int(index)].update(fields)
    ids = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--id=")), None)
    for gpu in gpus:
        if ids is None or str(gpu["index"]) in ids:
            print(", ".join(str(gpu.get(name, "[N/A]")) for name in query.split(",")))
    sys.exit(0)
if not any(a.startswith("--query-compute-apps=") for a in sys.argv):
    sys.exit(6)
try:
    lines = open(os.environ["FAKE_GPU_CONFIG"]).read().split("\n")
except OSError:
    lines = []
for line in lines:
    if line.strip():
        pid, mib, holder = line.split()
        if alive(int(holder)):
            print(f"{{pid}}, {{mib}}, 00000000:1B:00.0")
'''


# What a fake GPU reads (nvidia-smi field names): an idle one, and one that a server keeps busy.
IDLE_GPU = {"power.draw": 61.5, "utilization.gpu": 0, "memory.used": 500, "clocks.sm": 345, "temperature.gpu": 31}
BUSY_GPU = {"power.draw": 412.25, "utilization.gpu": 87, "memory.used": 71000, "clocks.sm": 1980,
            "temperature.gpu": 58}


def assert_energy_is_power_over_duration(result: Any, power_w: float) -> None:
    """Each round of a benchmark result: the GPU energy is ``power_w`` (what a fake GPU reads) times the measured
    duration, and per output token that over the round's tokens."""
    for one in result.rounds:
        assert one.gpu_energy_j == pytest.approx(power_w * one.duration, rel=1e-9)
        assert one.energy_per_output_token_j == pytest.approx(power_w * one.duration / one.total_output_tokens,
                                                              rel=1e-9)
        assert one.output_tokens_per_joule == pytest.approx(1 / one.energy_per_output_token_j)


class FakeGpu:
    """A real nvidia-smi on PATH (FAKE_SMI) whose compute apps are what ``hold`` wrote: the plugin's GPU release
    wait, tested without a GPU."""

    def __init__(self, folder: Path) -> None:
        self.bin = folder / "bin"
        self.bin.mkdir()
        self.config = folder / "gpu-config.txt"
        self.calls = folder / "gpu-calls.txt"
        self.readings = folder / "gpu-readings.json"
        smi = self.bin / "nvidia-smi"
        smi.write_text(FAKE_SMI.format(python=sys.executable))
        smi.chmod(0o755)

    def hold(self, pid: int, mib: int = 2048, holder: int | None = None) -> None:
        with open(self.config, "a") as fh:
            fh.write(f"{pid} {mib} {holder or pid}\n")

    def read_as(self, index: int, **fields: float) -> None:
        """What GPU ``index`` reads from now on, by nvidia-smi field name: ``read_as(1, **{"power.draw": 300})``."""
        import json

        current = json.loads(self.readings.read_text()) if self.readings.exists() else {}
        current.setdefault(str(index), {}).update(fields)
        self.readings.write_text(json.dumps(current))

    def queries(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
        """Put this nvidia-smi first for the rest of the test (the variables of :meth:`env`)."""
        for name, value in self.env().items():
            monkeypatch.setenv(name, value)
        return self

    def env(self) -> dict[str, str]:
        """The variables that put this nvidia-smi first and make the plugin ask it."""
        return {"PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}", "PYTEST_SGLANG_GPU_QUERY": "nvidia-smi",
                "FAKE_GPU_CONFIG": str(self.config), "FAKE_GPU_CALLS": str(self.calls),
                "FAKE_GPU_READINGS": str(self.readings)}
