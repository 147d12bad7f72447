"""Who holds GPU memory (pytest_sglang/machine/gpus.py), read from a fake `nvidia-smi` first on PATH: a real
process found by the real PATH lookup (tests/helpers.py FakeGpu)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import FakeGpu

from pytest_sglang.machine.gpus import GpuUse, gpu_processes


@pytest.fixture
def fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    return FakeGpu(tmp_path).install(monkeypatch)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_gpu_processes_come_from_the_nvidia_smi_on_path(fake_gpu: FakeGpu, sleeper: subprocess.Popen[bytes]) -> None:
    fake_gpu.hold(sleeper.pid, 2048)
    assert gpu_processes() == [GpuUse(sleeper.pid, 2048, "GPU 0")]
    assert any("--query-compute-apps=pid,used_memory,gpu_bus_id" in q for q in fake_gpu.queries())


def test_a_driver_that_does_not_answer_is_no_gpu(fake_gpu: FakeGpu) -> None:
    (fake_gpu.bin / "nvidia-smi").write_text("#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't "
                                              "communicate with the NVIDIA driver.\"\nexit 9\n")
    assert gpu_processes() is None
