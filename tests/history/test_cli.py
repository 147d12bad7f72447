"""``python -m pytest_sglang.history PATH [--json]`` as a user runs it: the series and steps, the JSON list of
steps, and a bad PATH said clearly with exit status 2, the file left as it was."""

from __future__ import annotations

import fnmatch
import json
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_sglang.history.store import BenchRecord, HistoryStore, RunRecord

KEYS = {"profile", "test", "machine", "metric", "index", "commit", "before", "after", "change_pct", "p_value"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_sglang.history", *args], capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.fixture
def history(tmp_path: Path) -> Path:
    """20 runs of one benchmark whose tok/s stepped down 10 % at run 11; runs 3 and 4 lacked the TTFT."""
    rng = random.Random(2)
    path = tmp_path / "h.sqlite"
    with HistoryStore.open(path) as store:
        for i in range(20):
            level = 100.0 if i < 10 else 90.0
            rounds = {"output_throughput": [level * rng.gauss(1, 0.01) for _ in range(3)]}
            if i not in (2, 3):
                rounds["median_ttft_ms"] = [50.0 + i % 3, 50.0 + i % 2, 50.5]  # no step
            bench = BenchRecord(profile="base", test="t.py::test_perf", machine="ci | sglang 0.5.23",
                                workload="input_len=64 rounds=3", rounds=rounds)
            store.append(RunRecord(commit=f"{i:07x}", time=1_800_000_000.0 + 86400 * i, benchmarks=(bench,)))
    return path


def test_it_prints_each_series_its_runs_and_the_steps(history: Path) -> None:
    done = cli(str(history))
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0] == f"history {history}: 20 runs, 2027-01-15 08:00 to 2027-02-03 08:00 UTC"
    assert "base  t.py::test_perf" in out and "  machine: ci | sglang 0.5.23" in out
    header = next(line for line in out if line.strip().startswith("run"))
    assert header.split() == ["run", "commit", "time", "(UTC)", "median_ttft_ms", "output_throughput", "(tok/s)"]
    run3 = next(line for line in out if line.strip().startswith("3 "))
    assert run3.split()[1] == "0000002" and run3.split()[-2] == "-"  # no TTFT in run 3
    steps = [line.strip() for line in out if "stepped" in line]
    assert len(steps) == 1 and steps[0].startswith("output_throughput stepped down ")
    assert "at run 11 (commit 000000a, p=" in steps[0] and steps[0].endswith("regressed [run id 11]")


def test_json_prints_the_steps_with_the_contract_keys(history: Path) -> None:
    done = cli(str(history), "--json")
    assert done.returncode == 0, done.stderr
    (step,) = json.loads(done.stdout)
    assert KEYS <= set(step)
    assert (step["metric"], step["index"], step["commit"], step["status"]) == ("output_throughput", 11, "000000a",
                                                                               "regressed")
    assert step["change_pct"] == pytest.approx(-10, abs=2)


def test_a_metric_outside_the_default_set_can_be_asked_for(history: Path) -> None:
    done = cli(str(history), "--json", "--metric", "median_ttft_ms")
    assert done.returncode == 0 and json.loads(done.stdout) == []
    done = cli(str(history), "--metric", "all")
    assert done.returncode == 0 and "output_throughput stepped down" in done.stdout


def _foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (text TEXT)")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(("make", "message"), [
    (None, "no history store at *missing.sqlite: no such file"),
    (lambda p: p.write_text("run,commit\n1,abc\n"), "*is not a usable pytest-sglang history store*"),
    (_foreign, "*is an SQLite database but not a pytest-sglang history store (its tables: notes)*"),
    (lambda p: p.mkdir(), "*is a folder, not a file*"),
], ids=["missing", "text", "foreign", "folder"])
def test_a_bad_path_is_said_clearly_with_exit_status_2(tmp_path: Path, make: object, message: str) -> None:
    path = tmp_path / "missing.sqlite"
    if callable(make):
        make(path)
    before = path.read_bytes() if path.is_file() else None
    for args in ((str(path),), (str(path), "--json")):
        done = cli(*args)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith("python -m pytest_sglang.history: ")
        assert fnmatch.fnmatch(done.stderr.strip(), f"*{message}*")
    assert (path.read_bytes() if path.is_file() else None) == before
    assert path.exists() == (make is not None)
