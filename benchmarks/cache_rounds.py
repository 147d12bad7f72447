"""What each round of ``sglang_bench(rounds=3)`` measures on real SGLang, in each ``cache=`` mode (issue 24 point 0).

    python benchmarks/cache_rounds.py [--repeats 3] [--sglang-python PY] [--out results.json]

Run by hand (a few minutes on a 2-core CPU). One real SGLang server (CPU, the tests' tiny random-weight model,
the flags of tests/integration/realservers.py plus --enable-metrics, a KV pool of 16384 tokens) is launched as a
user's script would (a profile, ``pytest_sglang.Harness``); on it, ``harness.bench(server, rounds=3, input_len=960,
...)`` runs ``--repeats`` times in
each of the modes fresh, flush and warm (in turn: fresh, flush, warm, fresh, flush, warm, ...), each run on an
emptied cache (flushed before it: "flush" and "warm" send the same seeded prompts). Then a second server with
``--disable-radix-cache`` runs the same workload in "warm" mode (the same prompts every round, no cache to
serve them from): the uncached reference. For every run it prints and records each round's median TTFT (the
client's) and the server's own prefix-cache hit rate for the round (``server_cache_hit_rate``, from
``sglang:cached_tokens_total`` over ``sglang:prompt_tokens_total``), and the load average when the run started.
The table is the median over the repeats of each round's figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from real_harness import RealProfile, harness_for  # noqa: E402

from pytest_sglang import Harness  # noqa: E402
from pytest_sglang.bench import Client  # noqa: E402
from pytest_sglang.bench.cache import flush_prefix_cache  # noqa: E402  # a run starts on an empty cache
from pytest_sglang.server import ServerHandle  # noqa: E402

SGLANG_PYTHON = Path(os.environ.get("PYTEST_SGLANG_SGLANG_PYTHON", "/work/servers/sglang/bin/python"))
TINY_MODEL = REPO / "tests/integration/tiny_model.py"
STUB_DIR = REPO / "tests/integration/sgl_kernel_stub"
# tests/integration/realservers.py SERVER_ARGS["sglang"], and the metrics the witness reads; a KV pool of 16384
# tokens (8 MiB for this model) holds a run's 9 prompts of 976 tokens: with the tests' 4096, "warm" rounds find
# their prompts evicted (LRU) before they come again, and its rounds are not cached either (seen: 0 % hits)
SERVER_ARGS = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
               "--max-total-tokens", "16384", "--dtype", "bfloat16", "--enable-metrics")
# 960 prompt tokens (the tiny model's context is 1024), few outputs, one request at a time: TTFT is the prefill
WORKLOAD = {"num_requests": 8, "concurrency": 1, "input_len": 960, "output_len": 16, "warmup": 1, "rounds": 3}
MODES = ("fresh", "flush", "warm")


def make_model(python: Path, work: Path) -> Path:
    out = work / "tiny"
    subprocess.run([str(python), str(TINY_MODEL), str(out)], check=True, capture_output=True, timeout=300)
    return out


def profiles(python: Path, model: Path) -> dict[str, RealProfile]:
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "SGLANG_USE_CPU_ENGINE": "1",
           "PYTHONPATH": str(STUB_DIR)}
    one = {"kind": "sglang", "model": str(model), "python": str(python), "env": env}
    return {"radix": RealProfile(**one, args=SERVER_ARGS),
            "no-radix": RealProfile(**one, args=(*SERVER_ARGS, "--disable-radix-cache"))}


def one_run(harness: Harness, server: ServerHandle, mode: str) -> dict:
    with Client(server.base_url) as client:
        flush_prefix_cache(client, "sglang")  # every run starts from an empty cache: "warm" repeats the prompts
    load = os.getloadavg()[0]
    r = harness.bench(server, cache=mode, **WORKLOAD)
    per = r.rounds
    return {"mode": mode, "load": load, "ttft_ms": [x.median_ttft_ms for x in per],
            "hit_rate": [x.server_cache_hit_rate for x in per], "cached_tokens": [x.server_cached_tokens for x in per],
            "prompt_tokens": [x.server_prompt_tokens for x in per], "output_tok_s": [x.output_throughput for x in per],
            "cache_note": r.cache_note}


def show(run: dict, label: str) -> None:
    ttft = " ".join(f"{t:6.1f}" for t in run["ttft_ms"])
    hits = " ".join("   -" if h is None else f"{h:4.0%}" for h in run["hit_rate"])
    print(f"{label:<22} load {run['load']:4.2f}  TTFT ms per round {ttft}  hits {hits}", flush=True)


def table(runs: list[dict]) -> list[str]:
    lines = ["| mode | runs | median TTFT ms, round 0 / 1 / 2 | server prefix-cache hit rate, round 0 / 1 / 2 |",
             "|---|---|---|---|"]
    for label in dict.fromkeys(r["label"] for r in runs):
        mine = [r for r in runs if r["label"] == label]
        ttft = [statistics.median(r["ttft_ms"][k] for r in mine) for k in range(WORKLOAD["rounds"])]
        hits = []
        for k in range(WORKLOAD["rounds"]):
            known = [r["hit_rate"][k] for r in mine if r["hit_rate"][k] is not None]
            hits.append(f"{statistics.median(known):.1%}" if known else "-")
        lines.append(f"| {label} | {len(mine)} | {' / '.join(f'{t:.0f}' for t in ttft)} | {' / '.join(hits)} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sglang-python", type=Path, default=SGLANG_PYTHON)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="cache-rounds-") as tmp:
        work = Path(tmp)
        model = make_model(args.sglang_python, work)
        with harness_for(work, profiles(args.sglang_python, model)) as harness:
            harness.start()
            for name, modes in (("radix", MODES), ("no-radix", ("warm",))):
                with harness.server(name) as server:
                    for i in range(args.repeats):
                        for mode in modes:
                            run = one_run(harness, server, mode)
                            run["label"] = mode if name == "radix" else "warm, --disable-radix-cache"
                            run["repeat"] = i
                            show(run, run["label"])
                            runs.append(run)
    print()
    for line in table(runs):
        print(line)
    meta = {"workload": WORKLOAD, "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(meta))
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
