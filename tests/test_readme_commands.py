"""The README opens with a contributor's three commands (set-up, the tests, the whole flow on the simulator),
and the third works from the repository root."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, die_with_pytest

pytestmark = pytest.mark.timeout(300)


def test_the_readme_opens_with_the_three_commands() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# pytest-sglang" and lines[1] == "", lines[:2]
    commands = [line.split("#", 1)[0].strip() for line in lines[2:5]]
    assert all(line.startswith("    ") for line in lines[2:5]), lines[2:5]  # one indented block, before anything else
    assert commands == ['pip install -e ".[test]"', "pytest", "pytest examples --sglang-profile=eagle3 --sglang-sim"]
    assert "pytest)" in (REPO / ".ci" / "run").read_text(), "CI runs the README's test command, plain pytest"


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


def test_examples_under_url_skip_the_startup_checks_and_pass(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTEST_SGLANG_SIM": '{"startup_seconds": 0.3, "decode_tok_s": 400}'}
    with open(tmp_path / "sim.log", "wb") as log:
        sim = subprocess.Popen([sys.executable, "-m", "pytest_sglang.sim", "--model-path", "m", "--port", str(port)],
                               env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               preexec_fn=die_with_pytest())
    try:
        proc = subprocess.run(
            # examples/test_ab.py launches two servers: under --sglang-url that is an error by design (README)
            [sys.executable, "-m", "pytest", "examples", "--ignore=examples/test_ab.py", "--sglang-profile=baseline",
             f"--sglang-url=http://127.0.0.1:{port}", "-p", "no:cacheprovider", "-rs",
             f"--sglang-baseline={tmp_path / 'baselines.json'}"],
            cwd=REPO, capture_output=True, text=True, timeout=280,
        )
    finally:
        os.killpg(sim.pid, signal.SIGKILL)
        sim.wait()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "3 passed, 4 skipped" in out, out
    assert "SKIPPED [2] examples/test_server.py:10: this run did not start the server (--sglang-url)" in out, out
