"""Which client's TTFT is right? Both clients against the server's own TTFT histogram, on real SGLang.

    python benchmarks/ttft_witness.py --python .ci-cache/servers/sglang/bin/python [--rounds 4]

SGLang (the tiny model of tests/integration/tiny_model.py) is launched once, as a user's script would (a
profile, ``pytest_sglang.Harness``; real_harness.py), with ``--enable-metrics`` and
TTFT/ITL histogram buckets 2 ms wide up to 200 ms (``--bucket-time-to-first-token``; the default buckets
start at 100 ms, too coarse to tell 20 ms from 30 ms). Then, interleaved and alternating who goes first, each
round runs ours (``harness.bench``, native /generate, which scrapes /metrics around its round itself), ours
again with a new connection for every request (``fresh``: what sglang.bench_serving does, which opens an
aiohttp ClientSession, so a TCP connection, per request inside its TTFT clock) and ``python -m
sglang.bench_serving --backend sglang`` (native /generate, random-ids), this script scraping /metrics around
the peer's run. Same workload for both: random token-id prompts, ignore_eos, all requests at
once behind the concurrency cap, greedy.

The server's TTFT of a request runs from its HTTP handler receiving it to its tokenizer manager receiving
the first output: any client's TTFT should be that plus a little (the request's and the first chunk's way
through HTTP). A client below the server's figure stamps its first token too early; one far above it adds
its own delay. Prints a markdown table for benchmarks/RESULTS-vs-peer.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "benchmarks"))

from real_harness import harness_for  # noqa: E402
from realservers import TINY_MODEL  # noqa: E402
from vs_peer_bench import machine, peer, real_profile  # noqa: E402

from pytest_sglang import Harness  # noqa: E402
from pytest_sglang.bench.client import Client  # noqa: E402
from pytest_sglang.bench.server_metrics import scrape, witness  # noqa: E402  # the peer's round, witnessed
from pytest_sglang.server import ServerHandle  # noqa: E402

BUCKETS = [round(0.002 * i, 3) for i in range(1, 101)] + [0.25, 0.3, 0.4, 0.5, 0.75, 1, 2, 5, 10]


WITH_FINE_BUCKETS = ("--enable-metrics", "--bucket-time-to-first-token", *map(str, BUCKETS),
                     "--bucket-inter-token-latency", *map(str, BUCKETS))


def run_ours(harness: Harness, server: ServerHandle, w: dict[str, int], seed: int, fresh: bool = False
             ) -> dict[str, Any]:
    import functools

    from pytest_sglang.bench import drive, stream

    # fresh: a pool that keeps no connection, so every request connects anew, as the peer's do (no user option
    # asks for that: the experiment swaps the pool the benchmark's event loop opens)
    drive.ConnectionPool = functools.partial(stream.ConnectionPool, limit=0) if fresh else stream.ConnectionPool
    r = harness.bench(server, num_requests=w["n"], concurrency=w["c"], input_len=w["input_len"],
                      output_len=w["output_len"], api="generate", ignore_eos=True, warmup=0, seed=seed)
    return {"ttft": r.median_ttft_ms, "server_ttft": r.server_median_ttft_ms, "tok_s": r.output_throughput,
            "itl": r.median_itl_ms, "server_itl": r.server_median_itl_ms, "tokens": r.total_output_tokens,
            "server_tokens": r.server_generation_tokens}


def run_peer(server: ServerHandle, python: str, model: Path, w: dict[str, int], seed: int, workdir: Path
             ) -> dict[str, Any]:
    client = Client(server.base_url)
    before = scrape(client)
    p = peer(server, python, model, w, seed, workdir)
    after = scrape(client)
    assert before is not None and after is not None, "the server serves no /metrics"
    wit = witness(before, after)
    return {"ttft": p["median_ttft_ms"], "server_ttft": wit.median_ttft_ms, "tok_s": p["output_throughput"],
            "itl": p["median_itl_ms"], "server_itl": wit.median_itl_ms, "tokens": p["total_output_tokens"],
            "server_tokens": wit.generation_tokens}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True, help="the SGLang venv's python (also runs sglang.bench_serving)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    args = ap.parse_args()
    w = {"n": args.num_prompts, "c": args.concurrency, "input_len": args.input_len, "output_len": args.output_len}
    work = Path(tempfile.mkdtemp(prefix="ttft-witness-"))
    model = work / "model"
    subprocess.run([args.python, str(TINY_MODEL), str(model)], check=True, capture_output=True)
    rows: list[tuple[int, str, dict[str, Any], float]] = []
    profile = real_profile("sglang", args.python, model, WITH_FINE_BUCKETS)
    with harness_for(work, {"sglang-ttft": profile}) as harness:
        harness.start()
        with harness.server("sglang-ttft") as server:
            run_ours(harness, server, w, seed=1000)  # warm-up rounds, not counted
            run_peer(server, args.python, model, w, 1001, work)
            for k in range(args.rounds):
                order = ("ours", "fresh", "peer") if k % 2 == 0 else ("peer", "fresh", "ours")
                for who in order:
                    seed = 3 * k + order.index(who)
                    if who == "peer":
                        fig = run_peer(server, args.python, model, w, seed, work)
                    else:
                        fig = run_ours(harness, server, w, seed, fresh=who == "fresh")
                    rows.append((k + 1, who, fig, os.getloadavg()[0]))
                    print(k + 1, who, fig, flush=True)
    names = {"ours": "sglang_bench", "fresh": "sglang_bench, a connection per request",
             "peer": "sglang.bench_serving"}
    print(f"\n{machine()}; {w}\n")
    print("| round | client | TTFT p50 ms | server TTFT p50 ms | client - server | ITL p50 ms | server ITL p50 ms "
          "| out tok/s | tokens (server's) | load1 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k, who, f, load in rows:
        print(f"| {k} | {names[who]} | {f['ttft']:.1f} | {f['server_ttft']:.1f} | {f['ttft'] - f['server_ttft']:+.1f} "
              f"| {f['itl']:.2f} | {f['server_itl']:.2f} | {f['tok_s']:.1f} | {f['tokens']} ({f['server_tokens']}) "
              f"| {load:.2f} |")
    print("\n| client | median TTFT | median server TTFT | median (client - server) | tok/s median | tok/s spread |")
    print("|---|---|---|---|---|---|")
    for who in ("ours", "fresh", "peer"):
        figs = [f for _, w_, f, _ in rows if w_ == who]
        tok = [f["tok_s"] for f in figs]
        print(f"| {names[who]} | {statistics.median(f['ttft'] for f in figs):.1f} | "
              f"{statistics.median(f['server_ttft'] for f in figs):.1f} | "
              f"{statistics.median(f['ttft'] - f['server_ttft'] for f in figs):+.1f} | "
              f"{statistics.median(tok):.1f} | {(max(tok) - min(tok)) / statistics.median(tok):.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
