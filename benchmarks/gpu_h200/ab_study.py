"""How the paired spread of an A/B falls with the number of pairs and the round length, from run_h200.sh AB's
$FIGURES (one JSON line per A/B run, test_ab.py), and how many pairs a 5 % and a 10 % change need there.

    python benchmarks/gpu_h200/ab_study.py FIGURES.jsonl OUT.json

For each A/B run: its round length (requests per round), the CV of its paired ratios and the width of the
95 % Hodges-Lehmann interval over its first k pairs (judged again through the plugin's engine), the sd of the
log paired ratio, and the pairs a one-sided 5 % signed-rank test needs for 80 % power at that spread.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ab_sim import pairs_needed, spread_rows  # noqa: E402


def study(runs: list[dict]) -> list[dict]:
    out = []
    for ab in runs:
        a, b = ab["rounds"][ab["first"]], ab["rounds"][ab["second"]]
        if len(a) < 2:
            continue
        logs = [math.log(y / x) for x, y in zip(a, b, strict=True)]
        sd = statistics.stdev(logs)
        ks = sorted({k for k in (4, 6, 8, 10, 12, 16, len(a)) if 2 <= k <= len(a)})
        out.append({"name": ab["name"], "pair": f"{ab['second']} vs {ab['first']}", "num_requests": ab["num_requests"],
                    "pairs": len(a), "ratio": ab["ratio"].get("output_throughput"),
                    "ci": ab["ci"].get("output_throughput"), "p_value": ab["p_value"].get("output_throughput"),
                    "gate": ab.get("gate"), "sd_log_ratio": sd, "by_pairs": spread_rows([ab], ks),
                    "pairs_for_5pct": pairs_needed(sd, 0.05), "pairs_for_10pct": pairs_needed(sd, 0.10)})
    return out


def main() -> int:
    figures, target = Path(sys.argv[1]), Path(sys.argv[2])
    runs = [json.loads(line) for line in figures.read_text().splitlines() if line.strip()] if figures.exists() else []
    rows = study([r for r in runs if r.get("kind") == "ab"])
    target.write_text(json.dumps(rows, indent=1))
    for row in rows:
        ci = row["ci"]
        shown = f"{row['ratio']:.3f}x" + (f" (95% CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
        print(f"{row['name']}: {row['pair']}, {row['num_requests']} req/round, {row['pairs']} pairs: {shown}, "
              f"p={row['p_value']}, gate {row['gate']}; sd(log ratio) {row['sd_log_ratio']:.4f}; pairs for 5 %: "
              f"{row['pairs_for_5pct']}, for 10 %: {row['pairs_for_10pct']}")
        for k in row["by_pairs"]:
            print(f"    first {k['pairs']} pairs: CV {k['cv_pct']}, CI width {k['ci_width_pct']} %")
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
