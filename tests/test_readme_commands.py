"""The README's third command, the whole flow on the simulator, works from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.timeout(300)


def test_examples_run_on_the_simulator(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "examples", "--sglang-profile=baseline,eagle3", "--sglang-sim",
         "-p", "no:cacheprovider", f"--sglang-baseline={tmp_path / 'baselines.json'}",
         f"--sglang-report={report}", f"--sglang-log-dir={tmp_path / 'logs'}"],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "14 passed" in out, out  # the A/B example of baseline vs eagle3 among them
    for line in ("baseline: ready in", "eagle3: ready in", "draft_cuda_graph", "sglang benchmarks"):
        assert line in out, out
    assert report.is_file() and report.with_suffix(".html").is_file()
    assert (tmp_path / "logs" / "eagle3.log").read_text().count("The server is fired up and ready to roll!") == 1
