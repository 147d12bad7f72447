"""Which processes hold GPU memory, and how much, on which GPU; what each GPU reads now (utilisation, memory,
power, SM clock, temperature, and its energy counter where the driver keeps one): NVML if nvidia-ml-py is
installed, else nvidia-smi.

Used after a teardown, to prove the killed server's processes have left the GPUs (a process stuck in the
driver's teardown can hold its memory for tens of seconds after SIGKILL: sglang#31281, #39545). Where there
is no GPU (no NVML, no `nvidia-smi` on PATH, or a driver that does not answer) the answer is None and the
caller skips the check.

Pids are this machine's: in a container without the host's pid namespace the driver reports host pids, none
of which match the server's, and the check passes at once (it never waits for nothing).

``PYTEST_SGLANG_GPU_QUERY`` picks the source: ``nvml``, ``nvidia-smi``, or ``off``; unset, NVML is tried first.
:class:`GpuReader` keeps one NVML session open for a sampler that reads many times a second
(bench/telemetry.py); over nvidia-smi each reading is one call.

The energy counter is NVML's ``nvmlDeviceGetTotalEnergyConsumption``: the millijoules the GPU has used since
the driver was loaded (Volta and newer). A GPU or driver without it (NVMLError_NotSupported), or an
nvidia-ml-py too old to have the function, reads None there, as does every nvidia-smi reading: nvidia-smi's
documented ``--query-gpu`` fields were not found to include an energy counter, so none is asked of it. The
telemetry then integrates the power instead.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_sglang.envknobs import env_knobs

SMI_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class GpuUse:
    """One process's memory on one GPU."""

    pid: int
    used_mib: int | None  # None where the driver does not say (some containers, MIG)
    gpu: str  # "GPU 0" where the index is known, else the PCI bus id

    @property
    def index(self) -> int | None:
        head, _, number = self.gpu.partition(" ")
        return int(number) if head == "GPU" and number.isdigit() else None

    def describe(self) -> str:
        amount = f"{self.used_mib} MiB" if self.used_mib is not None else "memory"
        return f"pid {self.pid} holds {amount} on {self.gpu}"


@dataclass(frozen=True)
class GpuReading:
    """What one GPU reads at one moment; a field the driver does not report is None."""

    index: int
    util_pct: float | None
    memory_used_mib: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    temperature_c: float | None
    energy_mj: float | None = None  # the GPU's energy counter: mJ since the driver loaded (NVML, Volta and newer)


# nvidia-smi's --query-gpu names of GpuReading's fields after the index, in order
SMI_READING_FIELDS = ("utilization.gpu", "memory.used", "power.draw", "clocks.sm", "temperature.gpu")


def pick_gpus(held: Sequence[int], visible: str | None) -> tuple[list[int] | None, str]:
    """A server's GPUs (None: every GPU) from those its processes hold memory on and its CUDA_VISIBLE_DEVICES,
    and how they were found: here (bench/telemetry.py) and on an ssh host (launch/remote_gpus.py) alike."""
    if held:
        return sorted(set(held)), "held by the server's processes"
    indices = _visible_indices(visible)
    if indices is not None:
        return indices, "CUDA_VISIBLE_DEVICES"
    return None, "all GPUs (neither the server's processes nor CUDA_VISIBLE_DEVICES said which)"


def _visible_indices(value: str | None) -> list[int] | None:
    """CUDA_VISIBLE_DEVICES as indices; None where unset or not plain indices (UUIDs, MIG names)."""
    if not value or not value.strip():
        return None
    parts = [p.strip() for p in value.split(",")]
    return [int(p) for p in parts] if all(p.isdigit() for p in parts) else None


def gpu_processes() -> list[GpuUse] | None:
    """Every compute process on every GPU; None where no GPU can be asked."""
    choice = env_knobs().gpu_query
    if choice == "off":
        return None
    if choice in (None, "nvml"):
        found = _nvml()
        if found is not None or choice == "nvml":
            return found
    return _nvidia_smi()


class GpuReader:
    """Reads the GPUs again and again from one source: an NVML session opened once, or nvidia-smi per reading.
    :meth:`read` is None where no GPU answers; :attr:`source` says which was asked ("nvml", "nvidia-smi")."""

    def __init__(self) -> None:
        self.source: str | None = None
        self._nvml: Any = None
        self._smi: str | None = None
        choice = env_knobs().gpu_query
        if choice == "off":
            return
        if choice in (None, "nvml"):
            self._nvml = _nvml_session()
            if self._nvml is not None:
                self.source = "nvml"
                return
            if choice == "nvml":
                return
        self._smi = shutil.which("nvidia-smi")
        if self._smi is not None:
            self.source = "nvidia-smi"

    def read(self, indices: Sequence[int] | None = None) -> list[GpuReading] | None:
        """The GPUs ``indices`` (None: all) as they read now."""
        if self.source == "nvml":
            return _nvml_readings(self._nvml, indices)
        if self._smi is not None:
            return _smi_readings(self._smi, indices)
        return None

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

    def __enter__(self) -> GpuReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _nvml_session() -> Any:
    try:
        import pynvml  # nvidia-ml-py: the optional extra `pytest-sglang[gpu]`
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # pynvml.NVMLError: no driver, no GPU
        return None
    return pynvml


def _nvml_readings(nvml: Any, indices: Sequence[int] | None) -> list[GpuReading] | None:
    def ask(call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except Exception:  # NVMLError_NotSupported on one field (MIG, some boards): that field is None
            return None

    try:
        wanted = list(range(nvml.nvmlDeviceGetCount())) if indices is None else list(indices)
        energy = getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None)  # absent in an old nvidia-ml-py
        found = []
        for index in wanted:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            util = ask(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = ask(nvml.nvmlDeviceGetMemoryInfo, handle)
            power = ask(nvml.nvmlDeviceGetPowerUsage, handle)  # milliwatts
            found.append(GpuReading(
                index, float(util.gpu) if util is not None else None,
                memory.used / (1024 * 1024) if memory is not None else None,
                power / 1000.0 if power is not None else None,
                _number(ask(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)),
                _number(ask(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)),
                _number(ask(energy, handle)) if energy is not None else None))
        return found
    except Exception:  # a GPU that fell off the bus mid-query: no answer rather than a wrong one
        return None


def _smi_readings(smi: str, indices: Sequence[int] | None) -> list[GpuReading] | None:
    query = "--query-gpu=" + ",".join(("index", *SMI_READING_FIELDS))
    extra = ["--id=" + ",".join(str(i) for i in indices)] if indices is not None else []
    rows = _smi_rows(smi, query, *extra)
    if rows is None:
        return None
    found = []
    for row in rows:
        if len(row) != 1 + len(SMI_READING_FIELDS) or not row[0].isdigit():
            continue
        found.append(GpuReading(int(row[0]), *(_number(cell) for cell in row[1:])))
    return found


def _number(value: Any) -> float | None:
    """A reading as a float; None for nvidia-smi's "[N/A]" or "[Not Supported]" and anything else not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _nvml() -> list[GpuUse] | None:
    pynvml = _nvml_session()
    if pynvml is None:
        return None
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(proc, "usedGpuMemory", None)
                mib = int(used) // (1024 * 1024) if isinstance(used, int) else None
                found.append(GpuUse(int(proc.pid), mib, f"GPU {index}"))
        return found
    except Exception:  # a GPU that fell off the bus mid-query: no answer rather than a wrong one
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _nvidia_smi() -> list[GpuUse] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    apps = _smi_rows(smi, "--query-compute-apps=pid,used_memory,gpu_bus_id")
    if apps is None:
        return None
    index = {row[1]: f"GPU {row[0]}" for row in _smi_rows(smi, "--query-gpu=index,pci.bus_id") or [] if len(row) == 2}
    found = []
    for row in apps:
        if len(row) < 2 or not row[0].isdigit():
            continue
        bus = row[2] if len(row) > 2 else ""
        used = int(row[1]) if row[1].isdigit() else None
        found.append(GpuUse(int(row[0]), used, index.get(bus) or (f"GPU {bus}" if bus else "a GPU")))
    return found


def _smi_rows(smi: str, query: str, *extra: str) -> list[list[str]] | None:
    try:
        done = subprocess.run([smi, query, *extra, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=SMI_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:  # "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
        return None
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
