"""Where a figure was measured: the machine fingerprint that selects a baseline, and the commit it was made at.

:func:`detect_machine` names the GPUs (model, count and driver, from nvidia-smi, honouring
``CUDA_VISIBLE_DEVICES``) or else the CPU model and core count; ``PYTEST_SGLANG_MACHINE`` replaces the name
(e.g. a CI runner label). The server's version joins the key, so a new SGLang release starts a new baseline.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pytest_sglang.envknobs import env_knobs


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
    return parse_gpus(out, os.environ.get("CUDA_VISIBLE_DEVICES"))


def parse_gpus(out: str, visible: str | None) -> tuple[list[str], str | None]:
    """GPU names and drivers from nvidia-smi's ``index,name,driver_version`` CSV, those CUDA_VISIBLE_DEVICES shows."""
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.count(",") >= 2]
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
    return name_machine(names, driver, cpu=_cpu_model() if not names else "", cores=os.cpu_count() or 1,
                        server=server)


def name_machine(names: list[str], driver: str | None, *, cpu: str, cores: int, server: str | None) -> Machine:
    """The fingerprint of a machine with these GPUs (else this CPU), here or on an ssh host."""
    if names:
        counts = Counter(names)
        name = " + ".join(f"{n}x {model}" for model, n in sorted(counts.items()))
    else:
        name = f"cpu: {cpu} ({cores} cores)"
    return Machine(name=env_knobs().machine or name, driver=driver, server=server)


def run_commit(cwd: str | Path | None = None) -> str | None:
    """The commit a run measured: PYTEST_SGLANG_COMMIT, else GITHUB_SHA (a CI checkout), else the short
    ``git rev-parse HEAD`` of ``cwd``; None where none of them can be read."""
    return env_knobs().commit or os.environ.get("GITHUB_SHA", "").strip() or git_commit(cwd)


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

