"""The agent's readings of the ssh host's GPUs (shipped there: see the package's docstring).

Modes:
    machine    the host's GPUs (nvidia-smi, with the profile's environment) and CPU, for the baseline key.
    gpus       the host's GPU readings for the telemetry (NVML where its python imports pynvml, else nvidia-smi
               with the profile's environment). Protocol GPU_PROTOCOL: first a "gpus" event (the source or why
               there is none, the GPUs the server's tree holds, its CUDA_VISIBLE_DEVICES, the agent's clock);
               then JSON commands on stdin, one a line: {"do": "ping"} -> "pong" (the clock), {"do": "read",
               "gpus": [..] | null} -> one "reading", {"do": "start", "gpus", "interval"} -> a "reading" every
               interval until {"do": "stop"} -> one last "reading" and "stopped". A reading's rows are [index,
               util %, memory MiB, power W, SM clock MHz, temperature C, energy mJ] (protocol 2 added the
               last: NVML's energy counter, null where the GPU has none and always under nvidia-smi). Clocks
               and reading times are time.monotonic() here; the controller maps them onto its own. Ends on
               end-of-file or once the supervisor is gone.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

from pytest_sglang.launch.agent.tree import POLL, alive, emit, owned


def machine(spec: dict[str, Any]) -> int:
    env = {**os.environ, **spec.get("env", {})}
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    gpus = ""
    if exe:
        try:
            gpus = subprocess.run([exe, "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
                                  env=env, capture_output=True, text=True, timeout=20, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            gpus = ""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.lower().startswith("model name")), "")
    except OSError:
        pass
    emit("machine", gpus=gpus, visible=env.get("CUDA_VISIBLE_DEVICES"), cpu=cpu or os.uname().machine,
         cores=os.cpu_count() or 1)
    return 0


GPU_PROTOCOL = 2  # 2: each row ends with the energy counter (mJ or null)
SMI_QUERY = "--query-gpu=index,utilization.gpu,memory.used,power.draw,clocks.sm,temperature.gpu"
SMI_TIMEOUT = 10.0


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):  # nvidia-smi's "[N/A]", a field NVML does not support
        return None


class _Smi:
    """nvidia-smi, one call per reading."""

    name = "nvidia-smi"

    def __init__(self, exe: str, env: dict[str, str]) -> None:
        self.exe, self.env = exe, env

    def _rows(self, *args: str) -> list[list[str]] | None:
        try:
            done = subprocess.run([self.exe, *args, "--format=csv,noheader,nounits"], env=self.env,
                                  capture_output=True, text=True, timeout=SMI_TIMEOUT, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.strip()]

    def read(self, gpus: list[int] | None) -> list[list[Any]] | None:
        rows = self._rows(SMI_QUERY, *(["--id=" + ",".join(map(str, gpus))] if gpus is not None else []))
        if rows is None:
            return None
        return [[int(row[0]), *map(_number, row[1:]), None] for row in rows if len(row) == 6 and row[0].isdigit()]

    def held(self, pids: set[int]) -> list[int]:
        index = {row[1]: int(row[0]) for row in self._rows("--query-gpu=index,pci.bus_id") or []
                 if len(row) == 2 and row[0].isdigit()}
        apps = self._rows("--query-compute-apps=pid,used_memory,gpu_bus_id") or []
        return sorted({index[row[2]] for row in apps if len(row) > 2 and row[0].isdigit() and int(row[0]) in pids
                       and row[2] in index})

    def close(self) -> None:
        pass


class _Nvml:
    """NVML, one session for every reading."""

    name = "nvml"

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def _ask(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except Exception:  # NVMLError_NotSupported on one field: that field is None
            return None

    def read(self, gpus: list[int] | None) -> list[list[Any]] | None:
        nvml = self.nvml
        energy = getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None)  # absent in an old nvidia-ml-py
        try:
            found = []
            for index in range(nvml.nvmlDeviceGetCount()) if gpus is None else gpus:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                util = self._ask(nvml.nvmlDeviceGetUtilizationRates, handle)
                memory = self._ask(nvml.nvmlDeviceGetMemoryInfo, handle)
                power = self._ask(nvml.nvmlDeviceGetPowerUsage, handle)  # milliwatts
                found.append([index, _number(getattr(util, "gpu", None)),
                              memory.used / (1024 * 1024) if memory is not None else None,
                              power / 1000.0 if power is not None else None,
                              _number(self._ask(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)),
                              _number(self._ask(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)),
                              _number(self._ask(energy, handle)) if energy is not None else None])
            return found
        except Exception:  # a GPU that fell off the bus mid-query: no answer rather than a wrong one
            return None

    def held(self, pids: set[int]) -> list[int]:
        nvml, found = self.nvml, set()
        for index in range(self._ask(nvml.nvmlDeviceGetCount) or 0):
            handle = self._ask(nvml.nvmlDeviceGetHandleByIndex, index)
            if any(int(p.pid) in pids for p in self._ask(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []):
                found.add(index)
        return sorted(found)

    def close(self) -> None:
        self._ask(self.nvml.nvmlShutdown)


def _gpu_reader(choice: str | None, env: dict[str, str]) -> tuple[Any, str]:
    """The host's GPU source for ``choice`` (PYTEST_SGLANG_GPU_QUERY's values; None: NVML, else nvidia-smi), or
    None and why there is none."""
    if choice == "off":
        return None, "PYTEST_SGLANG_GPU_QUERY=off"
    nvml_said = "not tried (PYTEST_SGLANG_GPU_QUERY=nvidia-smi)"
    if choice in (None, "nvml"):
        try:
            import pynvml  # type: ignore[import-not-found,unused-ignore]

            pynvml.nvmlInit()
            return _Nvml(pynvml), ""
        except ImportError:
            nvml_said = f"{sys.executable} there cannot import pynvml (nvidia-ml-py)"
        except Exception as exc:  # NVMLError: no driver, no GPU
            nvml_said = f"NVML did not start ({exc})"
        if choice == "nvml":
            return None, f"no NVML: {nvml_said}"
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    if exe is not None:
        return _Smi(exe, env), ""
    return None, f"no NVML ({nvml_said}) and no nvidia-smi on its PATH ({env.get('PATH', '')})"


class _Readings:
    """A thread reading the GPUs every interval until stopped; each reading one "reading" event."""

    def __init__(self, reader: Any, gpus: list[int] | None, interval: float, say: Any) -> None:
        self.reader, self.gpus, self.interval, self.say = reader, gpus, interval, say
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            self.say("reading", readings=self.reader.read(self.gpus), t=time.monotonic())
            if self.halt.wait(self.interval):
                self.say("reading", readings=self.reader.read(self.gpus), t=time.monotonic())
                return

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(SMI_TIMEOUT + 1)


def _obey(line: bytes, reader: Any, sampling: _Readings | None, say: Any) -> _Readings | None:
    """Do one command of the controller's; the readings thread running after it."""
    try:
        command = json.loads(line)
    except ValueError:
        return sampling
    do = command.get("do") if isinstance(command, dict) else None
    if do == "ping":
        say("pong", clock=time.monotonic())
    elif do == "read":
        say("reading", readings=reader.read(command.get("gpus")), t=time.monotonic())
    elif do == "start" and sampling is None:
        return _Readings(reader, command.get("gpus"), float(command.get("interval") or 0.1), say)
    elif do == "stop":
        if sampling is not None:
            sampling.stop()
        say("stopped")
        return None
    return sampling


def gpus(spec: dict[str, Any]) -> int:
    env = {**os.environ, **spec.get("env", {})}
    lock = threading.Lock()

    def say(event: str, **facts: Any) -> None:
        with lock:
            emit(event, **facts)

    reader, why = _gpu_reader(spec.get("query") or env.get("PYTEST_SGLANG_GPU_QUERY"), env)
    if reader is None:
        say("gpus", protocol=GPU_PROTOCOL, source=None, why=why, clock=time.monotonic())
        return 0
    held = reader.held({int(spec["pid"]), *owned(spec["token"])})
    say("gpus", protocol=GPU_PROTOCOL, source=reader.name, held=held, visible=env.get("CUDA_VISIBLE_DEVICES"),
        clock=time.monotonic())
    supervisor, sampling, pending = int(spec.get("supervisor") or 0), None, b""
    try:
        while True:  # stdin by select, so that the supervisor's end is seen between commands too
            readable, _, _ = select.select([0], [], [], POLL)
            if not readable:
                if supervisor and not alive(supervisor):
                    return 0
                continue
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return 0
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                sampling = _obey(line, reader, sampling, say)
    finally:
        if sampling is not None:
            sampling.stop()
        reader.close()


