"""Issue 24's H200 evidence, from the rounds the device calls kept (run_h200.sh GB and AB3; results/gb, results/ab3):
the A/A instance noise and the job-to-job and instance-to-instance spread of each regime, the controlled
slowdowns (what was injected, what the A/B measured, the verdict of the README's default check and what the same
rounds give at tighter tolerances), the 160M recipe's verdicts (each A/A run also judged against the other
four, offline), and what a short history of runs would find, by simulation with the change-point detector the
plugin uses (pytest_sglang/stats/changepoints.py) beside the power formula of engine/power.py.

    python benchmarks/gpu_h200/gb_study.py [--seeds 100] OUT.json

Everything is judged again through the plugin's own engine (compare_ab, judge_instance_noise); nothing is
re-measured. The history simulation: series of N runs whose medians are lognormal with the given per-run CV and
step down by s % at run N/2 (0-based index N/2); found = a step in the bad direction within 2 runs of it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pytest_sglang.baseline.engine import compare_ab  # noqa: E402
from pytest_sglang.baseline.engine.power import detectable_pct, history_se  # noqa: E402
from pytest_sglang.stats.changepoints import find_change_points  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
METRIC = "output_throughput"


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cv_pct(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) * 100.0


def log_sd(values: list[float]) -> float:
    return statistics.stdev([math.log(v) for v in values])


def job_row(job: dict[str, Any]) -> dict[str, Any]:
    a, b = job["rounds"][job["first"]], job["rounds"][job["second"]]
    paired = [y / x for x, y in zip(a, b, strict=True)]
    check = job["outcome"]["checks"][0]
    util = [u for side in job["gpu_util"].values() for u in side if u is not None]
    return {"name": job["name"], "ratio": job["ratio"][METRIC], "ci": job["ci"][METRIC],
            "p": job["p_value"][METRIC], "pairs": job["pairs"], "pair_cv_pct": cv_pct(paired),
            "side_median": job["side_median"], "gate": job["gate"], "method": check.get("method"),
            "message": check.get("message"), "aa_runs_stored": job["aa_runs_stored"],
            "detectable_pct": check.get("detectable_pct"),
            "history_detectable_pct": check.get("history_detectable_pct"),
            "gpu_util_median_pct": statistics.median(util) if util else None,
            "round_seconds_median": {p: statistics.median(v) for p, v in job["duration"].items()},
            "job_seconds": job.get("job_seconds")}


def injected(job: dict[str, Any]) -> dict[str, Any] | None:
    """The patch's own account of the slowed side: the wait it queued against the GPU time the forwards took, and
    that wait per round against the unslowed side's round (what a fully GPU-bound round would lose)."""
    patch = job.get("patch") or {}
    slowed, ref = patch.get(job["second"]), patch.get(job["first"])
    if not slowed or not ref:
        return None  # (the counters are written at most every 0.5 s, so a job's share is good to about that)
    rounds = job["pairs"] + 1  # the warmup round (32 requests, as a measured round) is slowed too
    per_round_s = slowed["injected_ms"] / 1000.0 / rounds
    ref_round_s = statistics.median(job["duration"][job["first"]])
    return {"pct_of_forward_gpu_time": 100.0 * slowed["injected_ms"] / slowed["measured_ms"],
            "wait_s_per_round": per_round_s, "round_s": ref_round_s,
            "nominal_slowdown_pct": 100.0 * per_round_s / (ref_round_s + per_round_s),
            "forwards": slowed["forwards"], "slowed": slowed["slowed"]}


def rejudge(job: dict[str, Any], noise: list[float], tolerances: list[str]) -> dict[str, Any]:
    """The same rounds through compare_ab with the stored A/A log ratios, at each tolerance."""
    sides = (job["rounds"][job["first"]], job["rounds"][job["second"]])
    out = {}
    for tol in tolerances:
        cmp = compare_ab(job["first"], job["second"], {METRIC: sides}, {METRIC: tol},
                         instance_noise={METRIC: noise})
        j = cmp.judgements[0]
        out[tol] = {"gate": cmp.gate, "p_past_tolerance": j.p_value, "detectable_pct": j.detectable_pct}
    return out


def leave_one_out(aa: list[dict[str, Any]], tolerance: str) -> list[dict[str, Any]]:
    """Each A/A job judged against the other A/A runs' log ratios (offline: 4 of them, under the plugin's 5)."""
    from pytest_sglang.baseline.engine.instance_noise import judge_instance_noise

    logs = [math.log(j["ratio"][METRIC]) for j in aa]
    out = []
    for i, job in enumerate(aa):
        sides = (job["rounds"][job["first"]], job["rounds"][job["second"]])
        paired = compare_ab(job["first"], job["second"], {METRIC: sides}, {METRIC: tolerance}).judgements[0]
        j = judge_instance_noise(paired, logs[:i] + logs[i + 1:], statistics.median(sides[0]))
        out.append({"name": job["name"], "ratio": job["ratio"][METRIC], "status": j.status, "p": j.p_value,
                    "message": j.message})
    return out


def simulate(run_cv: float, runs: int, step_pct: float, seeds: int) -> dict[str, float]:
    sd = math.log(1 + run_cv)
    at = runs // 2
    found = false = 0
    for seed in range(seeds):
        rng = random.Random(seed * 7919 + runs)
        values = [1000.0 * math.exp(rng.gauss(0.0, sd)) * (1 - step_pct / 100.0 if i >= at else 1.0)
                  for i in range(runs)]
        steps = find_change_points(values, seed=seed)
        down = []
        for cp in steps:
            before, after = values[:cp.index], values[cp.index:]
            if statistics.median(after) < statistics.median(before):
                down.append(cp.index)
        if step_pct > 0:
            found += any(abs(i - at) <= 2 for i in down)
            false += any(abs(i - at) > 2 for i in down)
        else:
            false += bool(steps)
    return {"found_pct": 100.0 * found / seeds, "false_pct": 100.0 * false / seeds}


def history_table(run_cvs: dict[str, float], seeds: int) -> list[dict[str, Any]]:
    rows = []
    for label, cv in run_cvs.items():
        for runs in (10, 20, 30):
            row: dict[str, Any] = {"regime": label, "run_cv_pct": 100 * cv, "runs": runs}
            steps = [0.5, 1, 2, 3, 5, 10] if cv < 0.05 else [5, 10, 20, 30, 50]
            row["by_step"] = {str(s): simulate(cv, runs, s, seeds) for s in steps}
            row["no_step_false_pct"] = simulate(cv, runs, 0.0, seeds)["false_pct"]
            caught = [s for s in steps if row["by_step"][str(s)]["found_pct"] >= 80.0]
            row["smallest_found_80pct"] = min(caught) if caught else None
            se = history_se(math.log(1 + cv), runs)
            row["power_formula_pct"] = detectable_pct(se, 0.0, "higher", alpha=0.05)
            rows.append(row)
            print(f"history {label}: CV {100 * cv:.1f} %, {runs} runs: found (>=80 % of series, +-2 runs) "
                  f"from {row['smallest_found_80pct']} %; formula {row['power_formula_pct']:.2f} %; false steps "
                  f"{row['no_step_false_pct']:.0f} %; " + ", ".join(f"{s}%: {v['found_pct']:.0f}"
                                                               for s, v in row["by_step"].items()), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seeds", type=int, default=100)
    args = ap.parse_args()
    gb, ab3 = load(RESULTS / "gb" / "figures.jsonl"), load(RESULTS / "ab3" / "figures.jsonl")
    gb_noise = json.loads((RESULTS / "gb" / "baselines-gb.json").read_text())
    machine = next(iter(gb_noise["instance_noise"]))
    workload = next(iter(gb_noise["instance_noise"][machine]))
    noise = gb_noise["instance_noise"][machine][workload][METRIC]

    out: dict[str, Any] = {"gb": {"machine": machine, "workload": workload, "aa_log_ratios": noise}}
    aa = [j for j in gb if j["name"].startswith("aa-")]
    slow = [j for j in gb if j["name"].startswith("slow-")]
    first, second = aa[0]["first"], aa[0]["second"]
    main_medians = [j["side_median"][first] for j in gb]  # g-main is never slowed
    twin_medians = [j["side_median"][second] for j in aa]
    out["gb"]["aa"] = [job_row(j) for j in aa]
    out["gb"]["aa_ratio_cv_pct"] = 100 * statistics.stdev(noise)
    out["gb"]["job_to_job_cv_pct"] = {first: cv_pct(main_medians), second: cv_pct(twin_medians)}
    out["gb"]["instances"] = {first: statistics.median(main_medians), second: statistics.median(twin_medians)}
    out["gb"]["slowdowns"] = [{**job_row(j), "injected_pct": j["slowdown_pct"], "patch": injected(j),
                               "rejudged": rejudge(j, noise, ["1%", "2%", "3%", "5%"])} for j in slow]
    a3 = [j for j in ab3 if j["name"].startswith("aa-")]
    a3_logs = [math.log(j["ratio"][METRIC]) for j in a3]
    out["ab3"] = {"aa": [job_row(j) for j in a3], "aa_ratio_cv_pct": 100 * statistics.stdev(a3_logs),
                  "candidates": [job_row(j) for j in ab3 if not j["name"].startswith("aa-")],
                  "aa_leave_one_out": leave_one_out(a3, "5%"),
                  "job_to_job_cv_pct": {p: cv_pct([j["side_median"][p] for j in a3]) for p in a3[0]["side_median"]}}
    # m8's --max-running-requests 12 rounds (results/ab: same workload and rounds, another machine and session),
    # judged again here: paired alone, as a job with no A/A runs recorded is now, and against AB3's five
    m8 = next(j for j in load(RESULTS / "ab" / "figures.jsonl") if j["name"] == "a-vs-mrr12")
    m8_sides = (m8["rounds"][m8["first"]], m8["rounds"][m8["second"]])
    ab3_noise = next(iter(json.loads((RESULTS / "ab3" / "baselines-ab3.json").read_text())["instance_noise"]
                          .values()))
    ab3_noise = next(iter(ab3_noise.values()))[METRIC]
    out["ab3"]["m8_mrr12_rejudged"] = {
        label: compare_ab(m8["first"], m8["second"], {METRIC: m8_sides}, {METRIC: "5%"},
                          instance_noise=noise_arg).judgements[0].to_dict()
        for label, noise_arg in (("paired", None), ("ab3_aa_runs", {METRIC: ab3_noise}))}
    for label, j in out["ab3"]["m8_mrr12_rejudged"].items():
        print(f"m8 a-vs-mrr12 {label}: {j['status']} ({j['message']})")
    for row in out["gb"]["aa"] + out["gb"]["slowdowns"] + out["ab3"]["aa"] + out["ab3"]["candidates"]:
        print(f"{row['name']}: {row['ratio']:.3f}x CI {row['ci'][0]:.3f}-{row['ci'][1]:.3f}, pair CV "
              f"{row['pair_cv_pct']:.1f} %, {row['gate']} ({row['method']}), GPU util {row['gpu_util_median_pct']}")
    for s in out["gb"]["slowdowns"]:
        print(f"  injected {s['injected_pct']} %: {json.dumps(s['patch'])}\n  rejudged {json.dumps(s['rejudged'])}")
    for r in out["ab3"]["aa_leave_one_out"]:
        print(f"  160M {r['name']} against the other four: {r['status']} ({r['message']})")
    print(json.dumps({k: out["gb"][k] for k in ("aa_ratio_cv_pct", "job_to_job_cv_pct", "instances")}),
          json.dumps({k: out["ab3"][k] for k in ("aa_ratio_cv_pct", "job_to_job_cv_pct")}))
    run_cvs = {"GPU-bound 3B, 1 %": 0.01, "GPU-bound 3B, 2 %": 0.02, "160M, 18 %": 0.18, "160M, 30 %": 0.30}
    if args.seeds == 0:
        run_cvs = {}
    out["history"] = history_table(run_cvs, args.seeds)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
