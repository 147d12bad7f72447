"""Which processes hold GPU memory, and how much, on which GPU: NVML if nvidia-ml-py is installed, else nvidia-smi.

Used after a teardown, to prove the killed server's processes have left the GPUs (a process stuck in the
driver's teardown can hold its memory for tens of seconds after SIGKILL: sglang#31281, #39545). Where there
is no GPU (no NVML, no `nvidia-smi` on PATH, or a driver that does not answer) the answer is None and the
caller skips the check.

Pids are this machine's: in a container without the host's pid namespace the driver reports host pids, none
of which match the server's, and the check passes at once (it never waits for nothing).

``PYTEST_SGLANG_GPU_QUERY`` picks the source: ``nvml``, ``nvidia-smi``, or ``off``; unset, NVML is tried first.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from pytest_sglang.envknobs import env_knobs

SMI_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class GpuUse:
    """One process's memory on one GPU."""

    pid: int
    used_mib: int | None  # None where the driver does not say (some containers, MIG)
    gpu: str  # "GPU 0" where the index is known, else the PCI bus id

    def describe(self) -> str:
        amount = f"{self.used_mib} MiB" if self.used_mib is not None else "memory"
        return f"pid {self.pid} holds {amount} on {self.gpu}"


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


def _nvml() -> list[GpuUse] | None:
    try:
        import pynvml  # nvidia-ml-py: the optional extra `pytest-sglang[gpu]`
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # pynvml.NVMLError: no driver, no GPU
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


def _smi_rows(smi: str, query: str) -> list[list[str]] | None:
    try:
        done = subprocess.run([smi, query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=SMI_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:  # "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
        return None
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
