"""Interleaved A/B on the simulator: does the paired gate hold under host drift, and how fast does its spread fall?

Each job is its own pytest session (its own two simulator servers, its own PYTEST_SGLANG_SIM_SEED, so its own
session factor and wander) running one ``@pytest.mark.sglang_ab("main", "candidate")`` test:
``sglang_ab(..., rounds=R).check(output_throughput=TOL)``. Jobs where the candidate equals main must never
fail; jobs where the candidate's ``decode_tok_s`` is lower must fail (regressed). The verdict is the gate the
plugin wrote in ``--sglang-report`` (report["ab"]); the spread study re-judges each A-vs-A job's first k pairs
through the plugin's own engine (``judge_paired``), at two round lengths.

    python benchmarks/ab_sim.py --jobs 20 --rounds 12 --write benchmarks/RESULTS-ab.md

Knobs of both profiles: ``session_drift = 0.3, wander = 0.05, jitter = 0.02`` (the issue's). The jobs run one
after another (a shared machine: its own load is part of the noise the gate must survive), or ``--parallel N`` at
a time on a machine with cores to spare (each job is three busy processes: pytest and two simulators).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_sglang.baseline.engine import judge_paired  # noqa: E402

DRIFT = "session_drift = 0.3, wander = 0.05, jitter = 0.02"
BASE_TOK_S = 400.0
SECTION = "## Interleaved A/B"
# Where the plugin is not installed (a GPU host given the source tree alone), name it to pytest.
PLUGIN = [] if importlib.metadata.entry_points(group="pytest11", name="sglang") else ["-p", "pytest_sglang.plugin"]

TEST = '''
import os

import pytest


@pytest.mark.sglang_ab("main", "candidate")
def test_candidate_is_not_slower(sglang_ab):
    r = sglang_ab(num_requests=int(os.environ["AB_REQUESTS"]), concurrency=8, input_len=16, output_len=32,
                  rounds=int(os.environ["AB_ROUNDS"]))
    r.check(output_throughput=os.environ["AB_TOLERANCE"])
'''


def project(folder: Path, candidate_tok_s: float) -> None:
    knobs = f"startup_seconds = 0.2, ttft_ms = 5, {DRIFT}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(
        f'[tool.pytest_sglang.profiles.main]\nmodel = "sim-model"\nsim = {{ decode_tok_s = {BASE_TOK_S}, {knobs} }}\n'
        f'[tool.pytest_sglang.profiles.candidate]\nmodel = "sim-model"\n'
        f'sim = {{ decode_tok_s = {candidate_tok_s}, {knobs} }}\n')
    (folder / "test_ab.py").write_text(TEST)


def run_job(folder: Path, seed: int, *, rounds: int, requests: int, tolerance: str) -> dict[str, Any]:
    report = folder / f"report-{seed}.json"
    env = {**os.environ, "PYTEST_SGLANG_SIM_SEED": str(seed), "AB_ROUNDS": str(rounds),
           "AB_REQUESTS": str(requests), "AB_TOLERANCE": tolerance,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PLUGIN, "--sglang-sim",
                    "--sglang-profile=main,candidate", f"--sglang-report={report}", "test_ab.py"],
                   cwd=folder, env=env, capture_output=True, text=True, timeout=600, check=False)
    (ab,) = json.loads(report.read_text())["ab"]
    ab["seconds"] = time.monotonic() - started
    return ab


def spread_rows(jobs: list[dict[str, Any]], ks: list[int]) -> list[dict[str, Any]]:
    """For the first k pairs of each A-vs-A job: the paired ratios' CV and the 95 % interval's width."""
    rows = []
    for k in ks:
        cvs, widths = [], []
        for ab in jobs:
            a, b = ab["rounds"][ab["first"]][:k], ab["rounds"][ab["second"]][:k]
            if len(a) < k:
                continue
            j = judge_paired("output_throughput", a, b, None)
            if j.spread_cv_pct is not None:
                cvs.append(j.spread_cv_pct)
            if j.ci:
                widths.append((j.ci[1] - j.ci[0]) * 100)
        rows.append({"pairs": k, "jobs": len(cvs), "cv_pct": statistics.median(cvs) if cvs else None,
                     "ci_width_pct": statistics.median(widths) if widths else None})
    return rows


def pairs_needed(sd_log: float, change: float) -> int:
    """Pairs for the gate's test (two-sided at 95 %) to find ``change`` (e.g. 0.05) significant with 80 % power
    (normal approximation; the signed-rank test's efficiency is 0.955 of the t-test's), and never below the 6
    the exact 95 % interval needs. Significance alone: the median must also be past the tolerance."""
    n = ((1.960 + 0.842) * sd_log / abs(math.log(1 - change))) ** 2 / 0.955
    return max(6, math.ceil(n))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--requests", type=int, default=32, help="requests per round (the round length)")
    ap.add_argument("--study-requests", type=int, default=8, help="the other round length of the spread study")
    ap.add_argument("--study-jobs", type=int, default=5, help="A-vs-A jobs at that round length (0: none)")
    ap.add_argument("--tolerance", default="2.5%")
    ap.add_argument("--slower", type=float, default=0.05, help="the candidate's decode_tok_s is this much lower")
    ap.add_argument("--write", type=Path, help="replace the 'Interleaved A/B' section of this markdown file")
    ap.add_argument("--json", type=Path, help="also write every job's A/B result here")
    ap.add_argument("--parallel", type=int, default=1, help="jobs at a time (each its own folder and seed)")
    args = ap.parse_args()

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ab-sim-") as tmp:
        kw = {"rounds": args.rounds, "tolerance": args.tolerance}

        def job(kind: str, candidate_tok_s: float, seed: int, requests: int) -> dict[str, Any]:
            folder = Path(tmp, f"{kind}-{seed}")
            project(folder, candidate_tok_s)
            return run_job(folder, seed, requests=requests, **kw)

        with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
            same = [pool.submit(job, "same", BASE_TOK_S, 1000 + i, args.requests) for i in range(args.jobs)]
            slow = [pool.submit(job, "slow", BASE_TOK_S * (1 - args.slower), 2000 + i, args.requests)
                    for i in range(args.jobs)]
            other = [pool.submit(job, "other", BASE_TOK_S, 3000 + i, args.study_requests)
                     for i in range(args.study_jobs)]
            a_a, a_b, study = ([f.result() for f in futures] for futures in (same, slow, other))
    elapsed = time.monotonic() - started

    ks = sorted({k for k in (6, 8, 10, args.rounds) if k <= args.rounds})
    main_rows, study_rows = spread_rows(a_a, ks), spread_rows(study, ks)
    sd_logs = [statistics.stdev([math.log(y / x) for x, y in zip(ab["rounds"]["main"], ab["rounds"]["candidate"],
                                                                 strict=True)]) for ab in a_a]
    sd_log = statistics.median(sd_logs)

    def gates(jobs: list[dict[str, Any]]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for ab in jobs:
            counts[ab["gate"] or "none"] = counts.get(ab["gate"] or "none", 0) + 1
        return counts

    def ratios(jobs: list[dict[str, Any]]) -> str:
        values = sorted(ab["ratio"]["output_throughput"] for ab in jobs)
        return f"{values[0]:.3f} to {values[-1]:.3f} (median {statistics.median(values):.3f})"

    lines = [
        SECTION, "",
        f"`python benchmarks/ab_sim.py --jobs {args.jobs} --rounds {args.rounds} --requests {args.requests} "
        f"--study-requests {args.study_requests}` "
        f"({platform.node() or 'this machine'}, {os.cpu_count()} cores, {args.parallel} job(s) at a time, load average "
        f"{os.getloadavg()[0]:.1f} at the end; "
        f"{elapsed / 60:.1f} min in all). Simulator knobs of both profiles: `{DRIFT}`, "
        f"`decode_tok_s = {BASE_TOK_S:g}`; each job its own pytest session and `PYTEST_SGLANG_SIM_SEED`; "
        f"`sglang_ab(num_requests={args.requests}, concurrency=8, input_len=16, output_len=32, "
        f"rounds={args.rounds}).check(output_throughput=\"{args.tolerance}\")`.", "",
        "| jobs | candidate | gates | ratio candidate/main over the jobs |", "|---|---|---|---|",
        f"| {len(a_a)} | same as main | {gates(a_a)} | {ratios(a_a)} |",
        f"| {len(a_b)} | decode_tok_s {args.slower:.0%} lower | {gates(a_b)} | {ratios(a_b)} |", "",
        f"Done-when: A-vs-A failures {gates(a_a).get('regressed', 0)} of {len(a_a)} (must be 0); "
        f"{args.slower:.0%} slower caught {gates(a_b).get('regressed', 0)} of {len(a_b)} (must be >= 19 of 20).", "",
        "How the paired spread falls with pairs and round length (A-vs-A jobs, each job's first k pairs judged "
        "again through `judge_paired`; medians over the jobs): CV of the paired ratios and the width of the "
        "95 % Hodges-Lehmann interval of the ratio.", "",
        "| pairs | CV, " + f"{args.requests} req/round | CI width, {args.requests} req/round | "
        f"CV, {args.study_requests} req/round | CI width, {args.study_requests} req/round |", "|---|---|---|---|---|",
    ]
    for s, lrow in zip(main_rows, study_rows, strict=True):
        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f} %"
        lines.append(f"| {s['pairs']} | {f(s['cv_pct'])} | {f(s['ci_width_pct'])} | {f(lrow['cv_pct'])} | "
                     f"{f(lrow['ci_width_pct'])} |")
    lines += ["", f"Sd of the log paired ratio (A-vs-A, {args.requests} req/round): {sd_log:.4f}. Pairs the gate's "
              f"signed-rank test (two-sided 95 %) needs for 80 % power (normal approximation, at least 6): "
              f"5 % change {pairs_needed(sd_log, 0.05)}, 10 % change {pairs_needed(sd_log, 0.10)}. The session "
              "factor (CV 30 %) cancels in the ratio: both servers of a job share it, as two servers on one host "
              "share its state.", ""]
    text = "\n".join(lines)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"same": a_a, "slower": a_b, "study": study}, indent=1))
    if args.write:
        old = args.write.read_text() if args.write.exists() else "# A/B and cross-session gates: evidence\n\n"
        head, found, rest = old.partition(SECTION)
        tail = rest[rest.find("\n## ") + 1:] if found and "\n## " in rest else ""
        args.write.write_text(head.rstrip() + "\n\n" + text + ("\n" + tail if tail else ""))
    ok = gates(a_a).get("regressed", 0) == 0 and gates(a_b).get("regressed", 0) >= math.ceil(0.95 * len(a_b))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
