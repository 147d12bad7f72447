"""Cross-session baselines on the simulator: does the session-spread rule (baseline/engine/sessions.py judge_sessions)
keep quiet through unchanged sessions that drift, and see a real regression?

Part 1, real sessions: a throwaway project with one simulated profile (``session_drift``, so each pytest run
is a session at its own speed). It records RECORDINGS sessions with ``--sglang-update-baseline`` (each its
own PYTEST_SGLANG_SIM_SEED), then checks UNCHANGED fresh sessions at a 10 % tolerance, then one session at
half the pace; every run is a real ``pytest --sglang-sim`` subprocess, read back from its --sglang-report.

Part 2, the rule itself (Monte Carlo): for each session drift and regression, the share of new sessions the
rule flags (tolerance 0 %: statistics alone) after n past sessions; "needed" is the fewest past sessions
(5 to 20) at which it flags at least 90 %.

    python benchmarks/sessions_sim.py [--out results.json] [--drift 0.15] [--recordings 10] [--unchanged 20]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_sglang.baseline.directions import Tolerance
from pytest_sglang.baseline.engine import judge_sessions

PERF = """
def test_throughput(sglang_server, sglang_bench, sglang_baseline):
    r = sglang_bench(num_requests=4, concurrency=4, input_len=8, output_len=40, warmup=1, rounds=3)
    sglang_baseline.check(r, output_throughput="10%", max_cv="off")
"""
DRIFTS = (0.05, 0.15, 0.30)
REGRESSIONS = (0.05, 0.10, 0.25, 0.50)
PAST = (5, 6, 8, 10, 15, 20)
DETECTED = 0.9


def project(root: Path, drift: float, pace: float) -> None:
    (root / "pyproject.toml").write_text(
        '[tool.pytest_sglang.profiles.p]\nmodel = "sim-model"\n'
        f"sim = {{ startup_seconds = 0.3, decode_tok_s = {pace}, ttft_ms = 5, jitter = 0.02, "
        f"session_drift = {drift} }}\n")
    (root / "test_perf.py").write_text(PERF)


def session(root: Path, seed: str, *extra: str) -> dict[str, Any]:
    """One real pytest run (one session); its baseline view of output_throughput."""
    report = root / f"report-{seed}.json"
    env = dict(os.environ, PYTEST_SGLANG_SIM_SEED=seed, PYTEST_SGLANG_MACHINE="sessions-bench")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--sglang-profile=p",
                           "--sglang-sim", f"--sglang-report={report}", *extra], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    bench = json.loads(report.read_text())["profiles"]["p"]["benchmarks"][0]
    view = bench["baseline"]["output_throughput"]
    return {"seed": seed, "exit": proc.returncode, "status": view["status"], "tok_s": view["current"],
            "change_pct": view["change_pct"], "p_value": view.get("p_value"), "method": view.get("method"),
            "sessions": view.get("sessions")}


def real_sessions(drift: float, recordings: int, unchanged: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sessions-sim-") as tmp:
        root = Path(tmp)
        project(root, drift, 200.0)
        t0 = time.monotonic()
        recorded = [session(root, f"record-{i}", "--sglang-update-baseline") for i in range(recordings)]
        checked = [session(root, f"check-{i}") for i in range(unchanged)]
        project(root, drift, 100.0)
        half = session(root, "half-pace")
        return {"drift": drift, "recorded": recorded, "unchanged": checked, "half_pace": half,
                "seconds": time.monotonic() - t0}


def flagged_share(drift: float, regression: float, past: int, trials: int, rng: random.Random) -> float:
    sigma = math.sqrt(math.log1p(drift * drift))
    tolerance = Tolerance.parse("output_throughput", "0%")
    hits = 0
    for _ in range(trials):
        sessions = [100.0 * math.exp(rng.gauss(0, sigma)) for _ in range(past)]
        new = 100.0 * (1 - regression) * math.exp(rng.gauss(0, sigma))
        hits += judge_sessions("output_throughput", new, sessions, tolerance).status == "regressed"
    return hits / trials


def rule_table(trials: int) -> list[dict[str, Any]]:
    rng = random.Random(17)
    rows = []
    for drift in DRIFTS:
        for regression in REGRESSIONS:
            shares = {n: flagged_share(drift, regression, n, trials, rng) for n in PAST}
            needed = next((n for n in PAST if shares[n] >= DETECTED), None)
            rows.append({"drift": drift, "regression": regression, "flagged": shares, "needed": needed})
    return rows


def markdown(real: dict[str, Any], table: list[dict[str, Any]], trials: int) -> str:
    unchanged = real["unchanged"]
    failed = [s for s in unchanged if s["status"] == "regressed"]
    changes = sorted(s["change_pct"] for s in unchanged)
    rec = [s["tok_s"] for s in real["recorded"]]
    mean = sum(rec) / len(rec)
    cv = (sum((v - mean) ** 2 for v in rec) / (len(rec) - 1)) ** 0.5 / mean * 100
    half = real["half_pace"]
    lines = [
        f"Real sessions (session_drift = {real['drift']}, jitter 0.02, 3 rounds of 4 requests each, "
        f"{real['seconds']:.0f} s): {len(rec)} recordings, {min(rec):.0f} to {max(rec):.0f} tok/s (CV {cv:.1f} %); "
        f"{len(unchanged)} unchanged sessions checked at a 10 % tolerance: {len(failed)} failed, their change "
        f"{changes[0]:+.1f} to {changes[-1]:+.1f} % (median {changes[len(changes) // 2]:+.1f} %); "
        f"the session at half the pace: {half['status']} ({half['change_pct']:+.1f} %, p={half['p_value']:.4f}, "
        f"method {half['method']}, {half['sessions']} sessions).",
        "",
        f"Share of new sessions flagged by the rule (tolerance 0 %, 95 % confidence, {trials} trials a cell), "
        f"and the fewest past sessions (of {', '.join(map(str, PAST))}) that flag at least {DETECTED:.0%}:",
        "",
        "| session drift | regression | " + " | ".join(f"n={n}" for n in PAST) + " | needed |",
        "|---|---|" + "---|" * len(PAST) + "---|",
    ]
    for row in table:
        shares = " | ".join(f"{row['flagged'][n]:.0%}" for n in PAST)
        needed = str(row["needed"]) if row["needed"] else "not within 20"
        lines.append(f"| {row['drift']:.0%} | {row['regression']:.0%} | {shares} | {needed} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--drift", type=float, default=0.15)
    parser.add_argument("--recordings", type=int, default=10)
    parser.add_argument("--unchanged", type=int, default=20)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--skip-real", action="store_true", help="only the Monte Carlo table")
    args = parser.parse_args()
    real = {} if args.skip_real else real_sessions(args.drift, args.recordings, args.unchanged)
    table = rule_table(args.trials)
    if args.out:
        args.out.write_text(json.dumps({"real": real, "table": table}, indent=2, default=str))
    if real:
        print(markdown(real, table, args.trials))
    else:
        print(json.dumps(table, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
