"""MongoDB's own E-divisive (signal-processing-algorithms) on the Monte Carlo series of history_sim.py, to see
whether a library would find more than pytest_sglang/stats/changepoints.py. That package installs on Python
3.11 only, with numpy<2 and scipy, so it runs in a throwaway environment, never the project's:

    python3.11 -m venv /tmp/spa && /tmp/spa/bin/pip install signal-processing-algorithms==2.1.6
    PYTHONPATH=$PWD:$PWD/benchmarks /tmp/spa/bin/python benchmarks/history_sim_mongodb.py results.json [--seeds 300]

results.json is history_sim.py's --out: its measured per-session noise is drawn as there. The library runs at
its defaults (p 0.05, 100 permutations; no minimum segment).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import history_sim as sim
import numpy as np
from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--seeds", type=int, default=300)
    args = parser.parse_args()
    noise = json.loads(args.results.read_text())["noise"]
    np.random.seed(0)  # the library shuffles with numpy's global generator
    for drift in sim.DRIFTS:
        for step in sim.STEPS:
            found = near = with_false = 0
            for seed in range(args.seeds):
                runs = [i + 1 for i in e_divisive(sim.mc_series(drift, step, seed, noise))]
                judged = sim.Judged(runs, [])
                found += bool(runs)
                near += judged.near and step > 0
                with_false += judged.false_steps(step > 0) > 0
            n = args.seeds
            at = f"{near / n:.1%}" if step else "-"
            print(f"| {drift} | {step:.0%} | {found / n:.1%} | {at} | {with_false / n:.1%} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
