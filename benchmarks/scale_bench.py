"""Launch counts and wall time of one test project run as a user runs it: serial, under pytest-xdist, with
--sglang-reuse, and with a pytest-timeout shorter than the startup. The simulator stands in for a slow server.

    python benchmarks/scale_bench.py [--startup 8] [--tests 16] [--test-seconds 0.5] [--workers 4] [--runs 3]
                                     [--profiles 3] [--plugin-path DIR]

Each run is a real `python -m pytest` in a temp project; launches are counted from the server pids the tests
saw (one line per test), and every run checks that no server process is left. The last row runs the tests under
--profiles profiles with -n 2, so the workers switch servers (profiles-1 times). --plugin-path puts another
checkout of the plugin first on PYTHONPATH (an older commit, for a before/after). Prints a markdown table of the
medians, for benchmarks/RESULTS-scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

TESTS = """
import json, os, time, pytest

@pytest.mark.parametrize("n", range({tests}))
def test_uses_the_server(sglang_server, n):
    time.sleep({test_seconds})
    with open(os.environ["SEEN"], "a") as fh:
        fh.write(json.dumps(sglang_server.pid) + "\\n")
"""


def project(folder: Path, mark: str, startup: float, tests: int, test_seconds: float, profiles: int = 1) -> str:
    """The test project; returns its --sglang-profile value."""
    names = ["p"] if profiles == 1 else [f"p{i}" for i in range(profiles)]
    (folder / "pyproject.toml").write_text("".join(
        f"[tool.pytest_sglang.profiles.{name}]\nmodel = \"sim-model\"\n"
        f"env = {{ TEST_MARK = \"{mark}\" }}\nsim = {{ startup_seconds = {startup} }}\n" for name in names))
    (folder / "test_scale.py").write_text(TESTS.format(tests=tests, test_seconds=test_seconds))
    return ",".join(names)


def run(folder: Path, *args: str, profile: str = "p") -> tuple[float, int, int]:
    seen = folder / "seen.txt"
    seen.unlink(missing_ok=True)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--sglang-profile={profile}", "--sglang-sim", *args], cwd=folder,
                          env={**os.environ, "SEEN": str(seen)},
                          capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    pids = {json.loads(line) for line in seen.read_text().splitlines()}
    return wall, len(pids), len(pids)


def left(mark: str) -> int:
    count = 0
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TEST_MARK") == mark and proc.status() != psutil.STATUS_ZOMBIE:
                count += 1
        except psutil.Error:
            continue
    return count


def wait_none_left(mark: str, name: str) -> None:
    deadline = time.monotonic() + 15
    while left(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left(mark), f"{name}: server processes left"


def single_profile_runs(a: argparse.Namespace, rows: dict[str, list[tuple[float, int, int]]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder, mark = Path(tmp), uuid.uuid4().hex
        project(folder, mark, a.startup, a.tests, a.test_seconds)
        os.environ["PYTEST_SGLANG_STATE_DIR"] = str(folder / "state")
        for name, args in (
            ("serial (-n 0)", ()),
            (f"pytest-xdist -n {a.workers}", ("-n", str(a.workers))),
            (f"--timeout=2 (startup {a.startup:g} s)", ("--timeout=2",)),
            ("--sglang-reuse, first run", ("--sglang-reuse",)),
            ("--sglang-reuse, second run", ("--sglang-reuse",)),
        ):
            rows.setdefault(name, []).append(run(folder, *args))
            if "reuse" not in name:
                wait_none_left(mark, name)
        subprocess.run([sys.executable, "-m", "pytest", "--sglang-stop"], cwd=folder, capture_output=True,
                       check=True)
        assert not left(mark), "--sglang-stop left processes"


def switching_run(a: argparse.Namespace, rows: dict[str, list[tuple[float, int, int]]]) -> None:
    """The tests under several profiles, -n 2: the workers take turns, one server at a time."""
    with tempfile.TemporaryDirectory() as tmp:
        folder, mark = Path(tmp), uuid.uuid4().hex
        names = project(folder, mark, a.startup, a.tests, a.test_seconds, profiles=a.profiles)
        name = f"{a.profiles} profiles, -n 2 ({a.profiles - 1} server switches)"
        rows.setdefault(name, []).append(run(folder, "-n", "2", profile=names))
        wait_none_left(mark, name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--startup", type=float, default=8.0)
    ap.add_argument("--tests", type=int, default=16)
    ap.add_argument("--test-seconds", type=float, default=0.5)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profiles", type=int, default=3)
    ap.add_argument("--plugin-path", help="a checkout of the plugin to measure instead of the installed one")
    ap.add_argument("--switches-only", action="store_true", help="only the row with several profiles")
    a = ap.parse_args()
    if a.plugin_path:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [a.plugin_path, os.environ.get("PYTHONPATH")]))
    rows: dict[str, list[tuple[float, int, int]]] = {}
    for _ in range(a.runs):
        if not a.switches_only:
            single_profile_runs(a, rows)
        switching_run(a, rows)
    print(f"{a.tests} tests of {a.test_seconds:g} s each, simulator startup {a.startup:g} s, medians of {a.runs}:\n")
    print("| run | launches | wall s (median) | wall s (each) |")
    print("|---|---|---|---|")
    for name, results in rows.items():
        walls = [w for w, _, _ in results]
        launches = sorted({n for _, n, _ in results})
        print(f"| {name} | {', '.join(map(str, launches))} | {statistics.median(walls):.1f} | "
              f"{' / '.join(f'{w:.1f}' for w in walls)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
