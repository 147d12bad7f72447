"""benchmarks/calibrate.py as docs/baselines.md tells a user to run it: the test it names exists, and a run that every
later run would repeat (a usage error, no tests collected) stops it at once with pytest's own words."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import REPO

pytestmark = pytest.mark.timeout(120)
CALIBRATE = REPO / "benchmarks" / "calibrate.py"


@pytest.mark.parametrize("text", [(REPO / "docs" / "baselines.md").read_text(), CALIBRATE.read_text()],
                         ids=["docs/baselines.md", "doc"])
def test_the_calibrate_command_names_a_test_that_exists(text: str) -> None:
    named = re.findall(r"calibrate\.py --runs \d+ -- (\S+)::(\w+)", text)
    assert named, "no calibrate command found"
    for path, test in named:
        assert f"def {test}(" in (REPO / path).read_text(), f"{path}::{test} does not exist"


@pytest.mark.parametrize(("args", "words"), [(["--sglang-no-such-option"], "exited 4 (usage error)"),
                                              (["-k", "no_test_has_this_name"], "exited 5 (no tests collected)")])
def test_a_hopeless_run_stops_calibrate_at_once(args: list[str], words: str) -> None:
    proc = subprocess.run([sys.executable, str(CALIBRATE), "--runs", "5", "--", "examples/test_throughput.py", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert words in proc.stderr and "so no run can be calibrated" in proc.stderr, proc.stderr
    assert "run 1/5" not in proc.stdout, "it must not go on to the other runs"
