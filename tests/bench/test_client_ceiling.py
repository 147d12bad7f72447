"""benchmarks/client_ceiling.py leaves no simulator behind, however its run ends, and says what was wrong."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pytest_sglang.bench import expected_throughput

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "client_ceiling.py"


def sim_tree(script: psutil.Process, timeout: float = 30.0) -> list[psutil.Process]:
    """The script's simulators and their children, once a simulator has started its own children."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sims = [p for p in script.children() if "pytest_sglang.sim" in " ".join(p.cmdline())]
        workers = [w for s in sims for w in s.children()]
        if sims and workers:
            return sims + workers
        time.sleep(0.1)
    raise AssertionError("the script started no simulator")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_no_simulator_outlives_the_script(signum: int) -> None:
    # A run that would take a minute: 2 streams of 400 tokens at 5 tok/s, on 2 simulators sharing the port.
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--levels", "2", "--decode-tok-s", "5", "--output-len",
                             "400", "--waves", "1", "--sim-processes", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    tree = sim_tree(psutil.Process(proc.pid))
    proc.send_signal(signum)
    assert proc.wait(15) == (128 + signum if signum != signal.SIGKILL else -signal.SIGKILL)
    gone, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive, f"survived {signal.Signals(signum).name}: {alive}"


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--sim-processes", "0", "must be a number of simulators (1 or more) or 'auto', got '0'"),
    ("--levels", "64,x", "must be a comma-separated list of integers >= 1, got '64,x'"),
])
def test_bad_arguments_say_what_was_wrong(flag: str, value: str, says: str) -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), flag, value], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and says in run.stderr, run.stderr


def test_total_pace_is_shared_by_each_levels_streams(tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--levels", "2,4", "--total-tok-s", "400", "--output-len",
                          "8,16", "--waves", "1", "--json-out", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(out.read_text())
    assert summary["paces"] == {"2": 200.0, "4": 100.0}
    rows = summary["rows"]
    assert [(r["concurrency"], r["output_len"]) for r in rows] == [(2, 8), (4, 8), (2, 16), (4, 16)]
    for r in rows:
        assert r["decode_tok_s"] == 400 / r["concurrency"]
        assert r["paced_tok_s"] == expected_throughput(num_requests=r["concurrency"], concurrency=r["concurrency"],
                                                       output_len=r["output_len"], ttft_s=0.02,
                                                       decode_tok_s=r["decode_tok_s"])
        assert r["ours_p1_failed"] == 0 and r["ours_p1_tok_s"] > 0
        assert r["ours_p1_ratio"] == r["ours_p1_tok_s"] / r["paced_tok_s"]
    assert set(summary["ceilings_tok_s"]["ours_p1"]) == {"8", "16"}
