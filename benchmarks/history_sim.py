"""Change-point detection over a history of runs on the simulator: does the E-divisive search
(pytest_sglang/stats/changepoints.py) find a step of a few per cent among drifting sessions, place it right,
and keep quiet through unchanged ones?

A series is RUNS sessions (pytest runs) of one simulated profile with ``session_drift`` (each session a speed
of its own, lognormal, that CV); from run STEP_AT (1-based) on, the profile's ``decode_tok_s`` is lowered by the
step (0 for the unchanged series). The search runs on each series' output_throughput.

Part 1, real sessions: every run is a real ``pytest --sglang-sim`` subprocess of a throwaway project, its own
PYTEST_SGLANG_SIM_SEED, read back from its --sglang-report (the median of its rounds). The stepped and the
unchanged series of one seed use the same session seeds, so they differ by the step alone. Each session's
figure divided by (pace x the session factor the simulator drew from that seed, drift.session_factor) is what
the rounds, the client and the host added on top of the drift: its spread is the per-session noise that Part 2
adds.

Part 2, Monte Carlo of the search with the simulator's own drift model: each session's value is
pace x (1 - step after STEP_AT) x a lognormal factor of CV session_drift (drift.lognormal_factor, as the
simulator draws it) x the per-session noise: one of Part 1's measured residuals drawn at random (so its
outliers come along), or a lognormal factor of CV --noise, for every drift, step and seed of the grid.
Beside it a reference for where a step can be placed at all: the share of series in which the maximum-likelihood
single split for Gaussian noise (the two-sample t statistic of the logs, maximised over the split; told there
is exactly one step, no significance test) lands within +-NEAR of the true run. A detector that must also decide
whether there is a step can hardly place it better.

    python benchmarks/history_sim.py [--out results.json] [--real-seeds 3] [--seeds 1000] [--jobs 2] [--compare]
    python benchmarks/history_sim.py --real-from results.json --seeds 1000   # search stored real series again
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_sglang.sim.drift import lognormal_factor, session_factor
from pytest_sglang.stats.changepoints import MIN_SEGMENT, PERMUTATIONS, SIGNIFICANCE, find_change_points

RUNS = 35
STEP_AT = 21  # 1-based: the first run after the step
NEAR = 2
PACE = 200.0
DRIFTS = (0.02, 0.04, 0.08)
STEPS = (0.0, 0.02, 0.03, 0.05, 0.10)
PERF = """
def test_throughput(sglang_server, sglang_bench):
    sglang_bench(num_requests=4, concurrency=4, input_len=8, output_len=40, warmup=1, rounds=3)
"""


@dataclass
class Judged:
    """What the search said of one series."""

    found: list[int]  # 1-based runs at which a step was placed
    p_values: list[float]

    @property
    def near(self) -> bool:
        return any(abs(run - STEP_AT) <= NEAR for run in self.found)

    def false_steps(self, stepped: bool) -> int:
        return sum(not (stepped and abs(run - STEP_AT) <= NEAR) for run in self.found)


def judge(values: list[float], **settings: Any) -> Judged:
    points = find_change_points(values, **settings)
    return Judged([c.index + 1 for c in points], [c.p_value for c in points])


# Part 1: real sessions


def project(root: Path, drift: float, pace: float) -> None:
    (root / "pyproject.toml").write_text(
        '[tool.pytest_sglang.profiles.p]\nmodel = "sim-model"\n'
        f"sim = {{ startup_seconds = 0.3, decode_tok_s = {pace}, ttft_ms = 5, jitter = 0.02, "
        f"session_drift = {drift} }}\n")
    (root / "test_perf.py").write_text(PERF)


def session(root: Path, seed: str) -> float:
    """One real pytest run; the output tok/s it reported (the median of its rounds)."""
    report = root / "report.json"
    env = dict(os.environ, PYTEST_SGLANG_SIM_SEED=seed, PYTEST_SGLANG_MACHINE="history-bench")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--sglang-profile=p",
                           "--sglang-sim", f"--sglang-report={report}"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"session {seed} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr}")
    bench = json.loads(report.read_text())["profiles"]["p"]["benchmarks"][0]
    return float(bench["result"]["output_throughput"])


def real_series(drift: float, step: float, seed: int) -> dict[str, Any]:
    """RUNS real sessions; from STEP_AT on the profile's pace is lowered by the step."""
    t0 = time.monotonic()
    values, residuals = [], []
    with tempfile.TemporaryDirectory(prefix="history-sim-") as tmp:
        root = Path(tmp)
        for run in range(1, RUNS + 1):
            pace = PACE * (1.0 - step) if run >= STEP_AT else PACE
            project(root, drift, pace)
            name = f"history-{drift}-{seed}-run{run}"
            tok_s = session(root, name)
            values.append(tok_s)
            residuals.append(tok_s / (pace * session_factor(name, drift)))
    return {"drift": drift, "step": step, "seed": seed, "values": values, "residuals": residuals,
            "judged": asdict(judge(values)), "seconds": time.monotonic() - t0}


# Part 2: Monte Carlo


def mc_series(drift: float, step: float, seed: int, noise: float | list[float]) -> list[float]:
    """One series: the drift as the simulator draws it, times the per-session noise: a lognormal of that CV,
    or (a list) one of Part 1's measured residuals drawn at random, so their outliers come along."""
    tag = f"mc:{drift}:{seed}"  # the same sessions for every step: the series differ by the step alone
    draw = random.Random(f"{tag}:noise")
    values = []
    for run in range(1, RUNS + 1):
        extra = draw.choice(noise) if isinstance(noise, list) else lognormal_factor(f"{tag}:{run}:noise", noise)
        values.append(PACE * (1.0 - step if run >= STEP_AT else 1.0) * lognormal_factor(f"{tag}:{run}", drift)
                      * extra)
    return values


def best_t_split(values: list[float]) -> int:
    """The 1-based first run after the split that maximises the two-sample t statistic (of the logs)."""
    logs = [math.log(v) for v in values]
    n = len(logs)
    s1, s2 = [0.0], [0.0]
    for x in logs:
        s1.append(s1[-1] + x)
        s2.append(s2[-1] + x * x)
    best, where = -math.inf, 0
    for t in range(MIN_SEGMENT, n - MIN_SEGMENT + 1):
        m, k = t, n - t
        ma, mb = s1[t] / m, (s1[n] - s1[t]) / k
        squares = (s2[t] - m * ma * ma) + (s2[n] - s2[t] - k * mb * mb)
        stat = abs(ma - mb) / math.sqrt(max(squares, 1e-300) / (n - 2) * (1 / m + 1 / k))
        if stat > best:
            best, where = stat, t + 1
    return where


def mc_cell(drift: float, step: float, seeds: int, noise: float | list[float],
            settings: dict[str, Any]) -> dict[str, Any]:
    found = near = with_false = 0
    placed: list[int] = []
    oracle = 0
    for seed in range(seeds):
        values = mc_series(drift, step, seed, noise)
        judged = judge(values, **settings)
        found += bool(judged.found)
        near += judged.near
        with_false += judged.false_steps(step > 0) > 0
        if judged.found:
            placed.append(min(judged.found, key=lambda run: abs(run - STEP_AT)))
        if step:
            oracle += abs(best_t_split(values) - STEP_AT) <= NEAR
    placed.sort()
    return {"drift": drift, "step": step, "seeds": seeds, "settings": settings, "found": found / seeds,
            "near": near / seeds, "with_false": with_false / seeds,
            "placed_median": placed[len(placed) // 2] if placed else None,
            "placed_iqr": [placed[len(placed) // 4], placed[(3 * len(placed)) // 4]] if placed else None,
            "oracle_near": oracle / seeds if step else None}


def monte_carlo(seeds: int, noise: float | list[float], jobs: int, settings: list[dict[str, Any]],
                drifts: tuple[float, ...] = DRIFTS) -> list[dict[str, Any]]:
    cells = [(d, s, seeds, noise, st) for st in settings for d in drifts for s in STEPS]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(mc_cell, *zip(*cells, strict=True)))


# Output


def measured_noise(real: list[dict[str, Any]]) -> list[float]:
    """Part 1's per-session noise: each figure over (pace x the drift the simulator drew), over their median."""
    residuals = [r for series in real for r in series["residuals"]]
    middle = statistics.median(residuals) if residuals else 1.0
    return [r / middle for r in residuals]


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values)


def real_lines(real: list[dict[str, Any]]) -> list[str]:
    lines = ["| session drift | step | seed | steps placed at run (p) | within 21 +- 2 | false steps | seconds |",
             "|---|---|---|---|---|---|---|"]
    for s in real:
        j = Judged(**s["judged"])
        placed = ", ".join(f"{run} (p={p:.3f})" for run, p in zip(j.found, j.p_values, strict=True)) or "none"
        near = ("yes" if j.near else "no") if s["step"] else "-"
        lines.append(f"| {s['drift']} | {s['step']:.0%} | {s['seed']} | {placed} | {near} | "
                     f"{j.false_steps(s['step'] > 0)} | {s['seconds']:.0f} |")
    return lines


def mc_lines(table: list[dict[str, Any]]) -> list[str]:
    lines = ["| session drift | step | found (any step) | found at 21 +- 2 | placed (median, IQR) "
             "| series with a false step | best one-step split within 21 +- 2 |",
             "|---|---|---|---|---|---|---|"]
    for c in table:
        placed = f"{c['placed_median']} ({c['placed_iqr'][0]}-{c['placed_iqr'][1]})" if c["placed_median"] else "-"
        oracle = f"{c['oracle_near']:.1%}" if c["oracle_near"] is not None else "-"
        near = f"{c['near']:.1%}" if c["step"] else "-"
        lines.append(f"| {c['drift']} | {c['step']:.0%} | {c['found']:.1%} | {near} | {placed} | "
                     f"{c['with_false']:.1%} | {oracle} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--real-seeds", type=int, default=3, help="real series per (drift 0.04, step 5 %% / 0)")
    parser.add_argument("--real-drift", type=float, default=0.04)
    parser.add_argument("--real-step", type=float, default=0.05)
    parser.add_argument("--real-from", type=Path, default=None,
                        help="the real series of an earlier --out, searched again instead of new sessions")
    parser.add_argument("--seeds", type=int, default=1000, help="Monte Carlo series per cell")
    parser.add_argument("--noise", type=float, default=None,
                        help="per-session noise CV for the Monte Carlo (default: measured in Part 1)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--compare", action="store_true",
                        help="also the Monte Carlo at drift 0.04: defaults, significance 0.01, min_segment 3, 5")
    parser.add_argument("--compare-seeds", type=int, default=None, help="series per cell of --compare (--seeds)")
    args = parser.parse_args()
    if args.real_from:
        real = [dict(s, judged=asdict(judge(s["values"]))) for s in json.loads(args.real_from.read_text())["real"]]
    else:
        real = []
        for seed in range(args.real_seeds):
            for step in (args.real_step, 0.0):
                real.append(real_series(args.real_drift, step, seed))
                if args.out:  # kept as they come: a long run stopped half-way keeps what it measured
                    args.out.write_text(json.dumps({"real": real}, indent=2))
    residuals = measured_noise(real)
    noise: float | list[float] = args.noise if args.noise is not None else residuals
    if len(residuals) < 2 and args.noise is None:
        parser.error("--noise is needed without real sessions (--real-seeds 0)")
    defaults = {"significance": SIGNIFICANCE, "permutations": PERMUTATIONS, "min_segment": MIN_SEGMENT}
    table = monte_carlo(args.seeds, noise, args.jobs, [defaults])
    compared: list[dict[str, Any]] = []
    if args.compare:
        others = [defaults, dict(defaults, significance=0.01), dict(defaults, min_segment=3),
                  dict(defaults, min_segment=5)]
        compared = monte_carlo(args.compare_seeds or args.seeds, noise, args.jobs, others, drifts=(0.04,))
    if args.out:
        args.out.write_text(json.dumps({"real": real, "noise": noise, "table": table, "compared": compared},
                                       indent=2))
    if len(residuals) >= 2:
        inner = sorted(residuals)[len(residuals) // 20: len(residuals) - len(residuals) // 20]
        print(f"per-session noise measured over {len(residuals)} real sessions: CV {cv(residuals):.2%}, "
              f"{cv(inner):.2%} without the 5 % at either end, {min(residuals):.3f}-{max(residuals):.3f} "
              f"of the median")
    print("Monte Carlo noise:", "Part 1's residuals, drawn at random" if isinstance(noise, list)
          else f"lognormal, CV {noise}")
    print("\n".join(real_lines(real)))
    print()
    print("\n".join(mc_lines(table)))
    for c in compared:
        print(c["settings"], " ".join(mc_lines([c])[2:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
