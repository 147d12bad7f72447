"""How the paired spread of an A/B falls with the number of pairs and the round length, and whether pinning each
server to its own cores (profile key `cpus`, run_h200.sh AB2) takes away the per-server state that made an A-vs-A
read 0.79x on the H200; from run_h200.sh AB/AB2's $FIGURES (one JSON line per A/B run, test_ab.py).

    python benchmarks/gpu_h200/ab_study.py FIGURES.jsonl [LABEL=FIGURES.jsonl ...] OUT.json

Each file's runs carry its label (default: the file's folder name), e.g. the unpinned first call's
``call-ab1=benchmarks/gpu_h200/results/ab1/figures.jsonl`` beside this call's. For each A/B run: pinned or not
(the servers' CPU masks disjoint, from its ``affinity``), its round length, the CV of its paired ratios and the
width of the 95 % Hodges-Lehmann interval over its first k pairs (judged again through the plugin's engine), the
sd of the log paired ratio, how much one pair's ratio predicts the next (lag-1 autocorrelation: a server's state
that outlasts a pair) with the pairs that leaves effectively, each side's own autocorrelation, and the pairs a
5 % and a 10 % change need at that spread (also corrected for the autocorrelation). ``groups``: the same by
source, pinning and round length, A vs A only (a ratio's CI leaving 1 there is a false regression).
``sampler_cost``: a study run without the telemetry sampler ("n" in test_ab.py) against those with it.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ab_sim import pairs_needed, spread_rows  # noqa: E402


def autocorr(xs: list[float], lag: int = 1) -> float | None:
    if len(xs) <= lag + 2:
        return None
    mean = statistics.fmean(xs)
    den = sum((x - mean) ** 2 for x in xs)
    return sum((xs[i] - mean) * (xs[i + lag] - mean) for i in range(len(xs) - lag)) / den if den else None


def effective_pairs(n: int, rho: float | None) -> float:
    """n pairs whose ratios follow each other with lag-1 autocorrelation rho count as this many independent ones."""
    if rho is None or rho <= 0:
        return float(n)
    return n * (1 - rho) / (1 + rho)


def pinned(ab: dict[str, Any]) -> bool:
    if ab.get("unpinned"):
        return False
    masks = [set(v) for k, v in (ab.get("affinity") or {}).items() if k.startswith("server")]
    return len(masks) >= 2 and all(not (a & b) for i, a in enumerate(masks) for b in masks[i + 1:])


def study(runs: list[dict]) -> list[dict]:
    out = []
    for ab in runs:
        a, b = ab["rounds"][ab["first"]], ab["rounds"][ab["second"]]
        if len(a) < 2:
            continue
        logs = [math.log(y / x) for x, y in zip(a, b, strict=True)]
        sd = statistics.stdev(logs)
        rho = autocorr(logs)
        n_eff = effective_pairs(len(logs), rho)
        inflate = len(logs) / n_eff if n_eff else 1.0
        ks = sorted({k for k in (4, 6, 8, 10, 12, 16, 20, 24, len(a)) if 2 <= k <= len(a)})
        seconds = [d for side in (ab.get("duration") or {}).values() for d in side]
        out.append({"label": ab.get("label"), "name": ab["name"], "pair": f"{ab['second']} vs {ab['first']}",
                    "a_vs_a": ab["name"].startswith(("a-vs-a", "study")), "pinned": pinned(ab),
                    "telemetry": ab.get("telemetry", True),
                    "side_median": {p: statistics.median(v) for p, v in ab["rounds"].items()},
                    "affinity": ab.get("affinity"), "num_requests": ab["num_requests"], "pairs": len(a),
                    "round_seconds": statistics.median(seconds) if seconds else None,
                    "ratio": ab["ratio"].get("output_throughput"), "ci": ab["ci"].get("output_throughput"),
                    "p_value": ab["p_value"].get("output_throughput"), "gate": ab.get("gate"),
                    "sd_log_ratio": sd, "ratio_autocorr_lag1": rho, "effective_pairs": n_eff,
                    "side_autocorr_lag1": {p: autocorr([math.log(x) for x in ab["rounds"][p]]) for p in ab["rounds"]},
                    "side_cv_pct": {p: 100 * statistics.stdev(v) / statistics.fmean(v)
                                    for p, v in ab["rounds"].items()},
                    "by_pairs": spread_rows([ab], ks),
                    "pairs_for_5pct": pairs_needed(sd, 0.05), "pairs_for_10pct": pairs_needed(sd, 0.10),
                    "pairs_for_5pct_autocorr": math.ceil(pairs_needed(sd, 0.05) * inflate),
                    "pairs_for_10pct_autocorr": math.ceil(pairs_needed(sd, 0.10) * inflate)})
    return out


def groups(rows: list[dict]) -> list[dict]:
    """A vs A runs by source, pinning and round length: the spread, the bias, and which called a false change."""
    keyed: dict[tuple[str, bool, int], list[dict]] = {}
    for row in rows:
        if row["a_vs_a"] and row["telemetry"]:
            keyed.setdefault((str(row["label"]), row["pinned"], row["num_requests"]), []).append(row)
    out = []
    for (label, is_pinned, n), members in sorted(keyed.items()):
        sd = statistics.median(r["sd_log_ratio"] for r in members)
        false = [r["name"] for r in members if r["ci"] and not r["ci"][0] <= 1.0 <= r["ci"][1]]
        out.append({"label": label, "pinned": is_pinned, "num_requests": n, "runs": len(members),
                    "pairs": sum(r["pairs"] for r in members), "median_sd_log_ratio": sd,
                    "median_abs_log_ratio": statistics.median(abs(math.log(r["ratio"])) for r in members),
                    "median_ratio_autocorr_lag1": _median([r["ratio_autocorr_lag1"] for r in members]),
                    "ci_excludes_1": false, "pairs_for_5pct": pairs_needed(sd, 0.05),
                    "pairs_for_10pct": pairs_needed(sd, 0.10)})
    return out


def sampler_cost(rows: list[dict]) -> list[dict]:
    """Each side's median tok/s with the telemetry sampler over that without it, at the same source, pinning and
    round length (the runs with it averaged): below 1 is the sampler's cost."""
    out = []
    for off in (r for r in rows if not r["telemetry"]):
        like = [r for r in rows if r["telemetry"] and
                (r["label"], r["pinned"], r["num_requests"]) == (off["label"], off["pinned"], off["num_requests"])]
        if not like:
            continue
        ratios = {p: statistics.fmean(r["side_median"][p] for r in like) / m for p, m in off["side_median"].items()}
        out.append({"label": off["label"], "pinned": off["pinned"], "num_requests": off["num_requests"],
                    "without": off["name"], "with": [r["name"] for r in like], "with_over_without": ratios})
    return out


def _median(xs: list[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return statistics.median(known) if known else None


def load(arg: str) -> list[dict]:
    label, _, path = arg.rpartition("=")
    figures = Path(path)
    lines = figures.read_text().splitlines() if figures.exists() else []
    runs = [json.loads(line) for line in lines if line.strip()]
    return [{**r, "label": label or figures.parent.name} for r in runs if r.get("kind") == "ab"]


def main() -> int:
    *sources, target = sys.argv[1:]
    rows = study([run for source in sources for run in load(source)])
    summary, cost = groups(rows), sampler_cost(rows)
    Path(target).write_text(json.dumps({"runs": rows, "groups": summary, "sampler_cost": cost}, indent=1))
    for row in rows:
        ci = row["ci"]
        shown = f"{row['ratio']:.3f}x" + (f" (95% CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
        rho = row["ratio_autocorr_lag1"]
        print(f"[{row['label']}] {row['name']}{' pinned' if row['pinned'] else ''}: {row['pair']}, "
              f"{row['num_requests']} req/round, {row['pairs']} pairs: {shown}, p={row['p_value']}, gate "
              f"{row['gate']}; sd(log ratio) {row['sd_log_ratio']:.4f}, lag-1 r "
              f"{'-' if rho is None else f'{rho:.2f}'} ({row['effective_pairs']:.1f} effective pairs); sides' CV "
              + ", ".join(f"{p} {cv:.1f} %" for p, cv in row["side_cv_pct"].items())
              + f"; pairs for 5 %: {row['pairs_for_5pct']} ({row['pairs_for_5pct_autocorr']} with the "
              f"autocorrelation), for 10 %: {row['pairs_for_10pct']} ({row['pairs_for_10pct_autocorr']})")
        for k in row["by_pairs"]:
            print(f"    first {k['pairs']} pairs: CV {k['cv_pct']}, CI width {k['ci_width_pct']} %")
    for g in summary:
        print(f"[{g['label']}] A vs A, {'pinned' if g['pinned'] else 'unpinned'}, {g['num_requests']} req/round: "
              f"{g['runs']} runs, {g['pairs']} pairs, median sd(log ratio) {g['median_sd_log_ratio']:.4f}, "
              f"median |log ratio| {g['median_abs_log_ratio']:.4f}, CI leaving 1: {g['ci_excludes_1'] or 'none'}; "
              f"pairs for 5 %: {g['pairs_for_5pct']}, for 10 %: {g['pairs_for_10pct']}")
    for c in cost:
        print(f"[{c['label']}] sampler cost, {'pinned' if c['pinned'] else 'unpinned'}, {c['num_requests']} req/round: "
              f"median tok/s with it over without ({c['without']} vs {', '.join(c['with'])}): "
              + ", ".join(f"{p} {x:.3f}" for p, x in c["with_over_without"].items()))
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
