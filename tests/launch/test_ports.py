"""Free ports handed to servers never collide, even when several pytest processes pick at the same moment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PICK = "from pytest_sglang.launch.ports import free_port\nprint(*[free_port('127.0.0.1') for _ in range(40)])\n"


def test_concurrent_pickers_never_get_the_same_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_SGLANG_STATE_DIR", str(tmp_path / "state"))
    procs = [subprocess.Popen([sys.executable, "-c", PICK], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    picks = [int(p) for proc in procs for p in proc.communicate(timeout=60)[0].split()]
    assert len(picks) == 120
    assert len(set(picks)) == len(picks), "two pickers were handed the same port"
