"""A simulator a test starts by hand (outside the plugin's reaper) dies with the pytest that started it, even when
that pytest is killed outright and no teardown runs (helpers.die_with_pytest)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO, marked_processes, wait_for_no_processes

HOLDS_A_SIM = """
import sys, time
sys.path.insert(0, {tests!r})
from bench.simproc import run_sim

def test_holds_a_simulator(tmp_path):
    with run_sim(tmp_path, {{}}, "--tp", "2", env={{"TEST_MARK": {mark!r}}}) as sim:
        print("SIM READY", sim.pid, flush=True)
        time.sleep(120)
"""


def test_a_killed_pytest_takes_the_bench_simulator_with_it(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makepyfile(test_holder=HOLDS_A_SIM.format(tests=str(REPO / "tests"), mark=mark))
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q"],
                            cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("SIM READY"):
                break
        else:
            pytest.fail("the inner run never had its simulator ready:\n" + "".join(lines))
        deadline = time.monotonic() + 10
        while len(marked_processes(mark)) < 4:  # the simulator, its two ranks and its detokenizer
            assert time.monotonic() < deadline, f"the simulator's tree never came up: {marked_processes(mark)}"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = wait_for_no_processes(mark, timeout=10)
    assert not left, f"simulator processes outlived the killed pytest: {[p.pid for p in left]}"

