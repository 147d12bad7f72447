"""A/B against instance noise on the simulator: the within-job rule false-alarms when two instances of one
server differ; the rule calibrated by recorded A/A runs does not, and still sees a large change.

Both profiles carry ``instance_drift`` (each server instance its own lognormal speed factor, as two instances
of one server on the H200 held different speeds for a whole job, docs/gpu.md) and a little ``jitter``. Each
job is its own pytest session with its own PYTEST_SGLANG_SIM_SEED, so its own pair of instance factors:

1. ``--calibrate`` A/A jobs (``main`` vs ``twin``, the same server) with --sglang-update-baseline: each appends
   its log ratio to the baseline file's ``instance_noise``.
2. ``--jobs`` A/A check jobs and ``--jobs`` jobs whose candidate's ``decode_tok_s`` is ``--slower`` lower,
   each ``sglang_ab(..., rounds=R).check(output_throughput=TOL)`` against that file. The calibrated verdict is
   the gate the plugin wrote in ``--sglang-report``; the within-job verdict is the same rounds judged again
   through the plugin's engine (``compare_ab``) without the instance noise.

    python benchmarks/ab_instance_sim.py --write benchmarks/RESULTS-ab.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_sglang.baseline.engine import compare_ab  # noqa: E402
from pytest_sglang.stats.inference import SessionSpread  # noqa: E402

BASE_TOK_S = 400.0
SECTION = "## Instance noise: A/A-calibrated A/B"

TEST = '''
import os

import pytest


@pytest.mark.sglang_ab("main", os.environ["AB_CANDIDATE"])
def test_candidate_is_not_slower(sglang_ab):
    r = sglang_ab(num_requests=16, concurrency=8, input_len=16, output_len=32, rounds=int(os.environ["AB_ROUNDS"]))
    r.check(output_throughput=os.environ["AB_TOLERANCE"], max_cv="off")
'''


def project(folder: Path, knobs: str, slower: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    profiles = {"main": BASE_TOK_S, "twin": BASE_TOK_S, "slow": BASE_TOK_S * (1 - slower)}
    (folder / "pyproject.toml").write_text("".join(
        f'[tool.pytest_sglang.profiles.{name}]\nmodel = "sim-model"\n'
        f'sim = {{ decode_tok_s = {tok_s}, startup_seconds = 0.2, ttft_ms = 5, {knobs} }}\n'
        for name, tok_s in profiles.items()))
    (folder / "test_ab.py").write_text(TEST)


def run_job(folder: Path, seed: int, candidate: str, *, rounds: int, tolerance: str, record: bool) -> dict[str, Any]:
    report = folder / f"report-{seed}.json"
    env = {**os.environ, "PYTEST_SGLANG_SIM_SEED": str(seed), "AB_ROUNDS": str(rounds), "AB_CANDIDATE": candidate,
           "AB_TOLERANCE": tolerance,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--sglang-sim",
                    f"--sglang-profile=main,{candidate}", f"--sglang-report={report}", "test_ab.py",
                    *(["--sglang-update-baseline"] if record else [])],
                   cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False)
    (ab,) = json.loads(report.read_text())["ab"]
    return ab


def within_job_gate(ab: dict[str, Any], tolerance: str) -> str:
    sides = (ab["rounds"][ab["first"]], ab["rounds"][ab["second"]])
    return compare_ab(ab["first"], ab["second"], {"output_throughput": sides}, {"output_throughput": tolerance},
                      max_cv_pct=None).gate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", type=int, default=8, help="A/A jobs recorded first")
    ap.add_argument("--jobs", type=int, default=10, help="A/A check jobs, and as many with a slower candidate")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tolerance", default="5%")
    ap.add_argument("--instance-drift", type=float, default=0.1)
    ap.add_argument("--slower", type=float, default=0.5, help="the candidate's decode_tok_s is this much lower")
    ap.add_argument("--write", type=Path, help="replace this section of that markdown file")
    args = ap.parse_args()
    knobs = f"instance_drift = {args.instance_drift}, jitter = 0.02"

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ab-instance-") as tmp:
        folder = Path(tmp)
        project(folder, knobs, args.slower)
        kw = {"rounds": args.rounds, "tolerance": args.tolerance}
        calibration = [run_job(folder, 5000 + i, "twin", record=True, **kw) for i in range(args.calibrate)]
        same = [run_job(folder, 6000 + i, "twin", record=False, **kw) for i in range(args.jobs)]
        slow = [run_job(folder, 7000 + i, "slow", record=False, **kw) for i in range(args.jobs)]
        noise = json.loads((folder / ".sglang-baselines.json").read_text())["instance_noise"]
    elapsed = time.monotonic() - started
    (workloads,) = noise.values()  # one machine
    (recorded,) = workloads.values()  # one workload
    logs = recorded["output_throughput"]

    def count(jobs: list[dict[str, Any]], gate: str, within: bool) -> int:
        return sum((within_job_gate(ab, args.tolerance) if within else ab["gate"]) == gate for ab in jobs)

    def ratios(jobs: list[dict[str, Any]]) -> str:
        values = sorted(ab["ratio"]["output_throughput"] for ab in jobs)
        return f"{values[0]:.3f} to {values[-1]:.3f}"

    cal_ratios = [ab["ratio"]["output_throughput"] for ab in calibration]
    low, high = SessionSpread.of([math.exp(v) for v in logs]).bounds(0.95)
    tolerance = float(args.tolerance.rstrip("%")) / 100
    lines = [
        SECTION, "",
        f"`python benchmarks/ab_instance_sim.py --calibrate {args.calibrate} --jobs {args.jobs} --rounds "
        f"{args.rounds} --instance-drift {args.instance_drift} --slower {args.slower}` "
        f"({platform.node() or 'this machine'}, {os.cpu_count()} cores shared with other test runs, load average "
        f"{os.getloadavg()[0]:.1f} at the end; {elapsed / 60:.1f} min in all). Knobs of every profile: `{knobs}`, "
        f"`decode_tok_s = {BASE_TOK_S:g}`; each job its own pytest session and seed, so its own pair of instance "
        f"factors; `sglang_ab(num_requests=16, concurrency=8, input_len=16, output_len=32, rounds={args.rounds})"
        f".check(output_throughput=\"{args.tolerance}\", max_cv=\"off\")`.", "",
        f"Calibration: {len(calibration)} A/A jobs recorded with `--sglang-update-baseline`: ratios "
        f"{ratios(calibration)}, CV {statistics.stdev(cal_ratios) / statistics.fmean(cal_ratios) * 100:.1f} % "
        f"({len(logs)} log ratios stored).", "",
        "| jobs | candidate | regressed, within-job rule | regressed, instance-noise rule | ratio over the jobs |",
        "|---|---|---|---|---|",
        f"| {len(same)} | same server (A/A) | {count(same, 'regressed', True)} | {count(same, 'regressed', False)} | "
        f"{ratios(same)} |",
        f"| {len(slow)} | decode_tok_s {args.slower:.0%} lower | {count(slow, 'regressed', True)} | "
        f"{count(slow, 'regressed', False)} | {ratios(slow)} |", "",
        "The within-job rule sees each pair's rounds agree (jitter only) and calls the instances' own difference "
        "a change; the calibrated rule knows how far apart two instances land on this host and flags only what "
        f"lies beyond that plus the tolerance: from these A/A runs an unchanged pair reaches {low:.2f}-{high:.2f}x "
        f"(95 % each side), so with the {args.tolerance} tolerance a candidate is flagged below about "
        f"{low * (1 - tolerance):.2f}x. The price: a change inside the instance noise cannot be seen by one A/B "
        f"job at all (here {args.jobs - count(slow, 'regressed', False)} of {args.jobs} jobs of a "
        f"{args.slower:.0%} slower candidate landed inside it, their own instance factors pulling them up); say "
        "so rather than pretend.", ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        old = args.write.read_text()
        head, found, rest = old.partition(SECTION)
        tail = rest[rest.find("\n## ") + 1:] if found and "\n## " in rest else ""
        args.write.write_text(head.rstrip() + "\n\n" + text + ("\n" + tail if tail else ""))
    return 0 if count(same, "regressed", False) == 0 else 1  # the calibrated rule's false alarms: none allowed


if __name__ == "__main__":
    raise SystemExit(main())
