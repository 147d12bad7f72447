"""sglang_bench's figures against the server project's own benchmark client, on one real server.

    python benchmarks/vs_peer_bench.py --server vllm   --python /work/venvs/vllm/bin/python
    python benchmarks/vs_peer_bench.py --server sglang --python /work/venvs/sglang/bin/python

The server (the tiny model of tests/integration/tiny_model.py, or --model PATH) is launched once as a user's
script would (a profile, ``pytest_sglang.Harness``; real_harness.py). Then both clients run the same workload
(request count, concurrency, input and output lengths, ignore_eos, random token-id prompts, all requests at once
behind the concurrency cap):

* ours: ``harness.bench``, i.e. what the sglang_bench fixture returns (in this process);
* the peer: `vllm bench serve` (vllm.benchmarks.serve, --backend openai, /v1/completions) for vLLM, or
  `python -m sglang.bench_serving --backend sglang` (native /generate, dataset random-ids) for SGLang; ours
  uses the same endpoint as the peer.

A warm-up round for each client, not counted, then --rounds counted rounds, interleaved and alternating who
goes first. Each round prints both clients' output tok/s, median TTFT and median ITL and the 1-minute load
average; the summary gives the median of each, the ratio of medians (ours / peer), each client's spread
((max - min) / median over the counted rounds) and whether both counted exactly the same output tokens.

On a 2-core machine the server keeps both cores busy and the client competes with it, so figures swing
between rounds; the spread says how fine a difference a run can resolve. Prompts differ per round (seeded),
so SGLang's prefix cache does not favour later rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # helpers.py, which realservers.py imports
sys.path.insert(0, str(REPO / "tests" / "integration"))

import psutil  # noqa: E402
from real_harness import RealProfile, harness_for  # noqa: E402
from realservers import SERVER_ARGS, STUB_DIR, TINY_MODEL  # noqa: E402

from pytest_sglang import Harness  # noqa: E402
from pytest_sglang.server import ServerHandle  # noqa: E402

METRICS = ("output_throughput", "median_ttft_ms", "median_itl_ms")
VLLM_BENCH = ("import argparse, sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
              "p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")


def server_env(kind: str) -> dict[str, str]:
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if kind == "sglang":
        env.update(SGLANG_USE_CPU_ENGINE="1", PYTHONPATH=str(STUB_DIR))
    else:
        env.update(VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH="")
    return env


def real_profile(kind: str, python: str, model: Path, extra: tuple[str, ...] = ()) -> RealProfile:
    return RealProfile(kind=kind, model=str(model), python=python, args=(*SERVER_ARGS[kind], *extra),
                       env=server_env(kind))


def ours(harness: Harness, server: ServerHandle, w: dict[str, int], seed: int) -> dict[str, Any]:
    api = "generate" if server.kind == "sglang" else "completions"
    r = harness.bench(server, num_requests=w["n"], concurrency=w["c"], input_len=w["input_len"],
                      output_len=w["output_len"], api=api, ignore_eos=True, warmup=0, seed=seed)
    return {"output_throughput": r.output_throughput, "median_ttft_ms": r.median_ttft_ms,
            "median_itl_ms": r.median_itl_ms, "total_output_tokens": r.total_output_tokens,
            "total_input_tokens": r.total_input_tokens, "completed": r.completed, "duration": r.duration}


def peer(server: ServerHandle, python: str, model: Path, w: dict[str, int], seed: int, workdir: Path
         ) -> dict[str, Any]:
    out = workdir / f"peer-{seed}.json"
    out.unlink(missing_ok=True)
    common_len = ["--random-input-len", str(w["input_len"]), "--random-output-len", str(w["output_len"]),
                  "--num-prompts", str(w["n"]), "--max-concurrency", str(w["c"]), "--seed", str(seed),
                  "--disable-tqdm"]
    if server.kind == "vllm":
        cmd = [python, "-c", VLLM_BENCH, "--backend", "openai", "--base-url", server.base_url,
               "--endpoint", "/v1/completions", "--model", str(model), "--tokenizer", str(model),
               "--dataset-name", "random", *common_len, "--ignore-eos", "--num-warmups", "0",
               # vllm bench serve samples at the server's default temperature unless told (its own warning says
               # so); greedy, as ours and sglang.bench_serving send, or the two workloads differ.
               "--temperature", "0",
               "--save-result", "--result-dir", str(workdir), "--result-filename", out.name]
    else:
        cmd = [python, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", server.base_url,
               "--model", str(model), "--tokenizer", str(model), "--dataset-name", "random-ids",
               "--random-range-ratio", "1", *common_len, "--warmup-requests", "0", "--output-file", str(out)]
    env = {**os.environ, **server_env(server.kind)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=workdir, env=env,
                          stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"peer client failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    text = out.read_text().strip().splitlines()[-1]  # sglang appends JSON lines; vllm writes one object
    data = json.loads(text)
    return {k: data.get(k) for k in ("output_throughput", "median_ttft_ms", "median_itl_ms",
                                     "total_output_tokens", "total_input_tokens", "completed", "duration")}


def pin(server: ServerHandle) -> None:
    """Server tree on CPU 0; this process (ours) and the peer subprocesses it starts on CPU 1."""
    assert server.pid is not None
    root = psutil.Process(server.pid)
    for proc in [root, *root.children(recursive=True)]:
        proc.cpu_affinity([0])
    os.sched_setaffinity(0, {1})
    print("pinned: server on CPU 0, clients on CPU 1", flush=True)


def client_cpu() -> float:
    """CPU seconds used so far by this process (ours) and its finished children (the peer client, whose
    figure so includes its interpreter start and imports)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def spread(values: list[float]) -> float:
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else float("nan")


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def rounds(harness: Harness, server: ServerHandle, args: argparse.Namespace, w: dict[str, int], model: Path,
           workdir: Path, peer_name: str) -> list[dict[str, Any]]:
    print(f"ready in {server.startup_seconds:.1f} s; warm-up round (not counted)", flush=True)
    ours(harness, server, w, seed=10_000)
    peer(server, args.python, model, w, seed=10_000, workdir=workdir)
    header = f"{'round':>5} {'client':<22} {'out tok/s':>10} {'TTFT p50 ms':>12} {'ITL p50 ms':>11} " \
             f"{'out tokens':>10} {'load1':>6} {'client CPU s':>12}"
    print(header, flush=True)
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = ("ours", "peer") if r % 2 == 0 else ("peer", "ours")
        for who in order:
            load = os.getloadavg()[0]
            t0, cpu0 = time.monotonic(), client_cpu()
            fig = ours(harness, server, w, seed=r) if who == "ours" else peer(server, args.python, model, w, seed=r,
                                                                                workdir=workdir)
            fig.update(round=r + 1, client=who, load1=load, wall=time.monotonic() - t0,
                       client_cpu_s=client_cpu() - cpu0)
            rows.append(fig)
            name = "sglang_bench (ours)" if who == "ours" else peer_name
            print(f"{r + 1:>5} {name:<22} {fig['output_throughput']:>10.1f} {fig['median_ttft_ms']:>12.1f} "
                  f"{fig['median_itl_ms']:>11.2f} {fig['total_output_tokens']:>10} {load:>6.2f} "
                  f"{fig['client_cpu_s']:>12.2f}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", choices=("vllm", "sglang"), required=True)
    ap.add_argument("--python", required=True, help="the server venv's python (also runs the peer client)")
    ap.add_argument("--model", type=Path, default=None, help="model folder (default: make the tiny model)")
    ap.add_argument("--rounds", type=int, default=5, help="counted rounds per client (after one warm-up)")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--pin", action="store_true",
                    help="server processes on CPU 0, both clients on CPU 1: a client's own CPU work can then no "
                         "longer slow the server it measures")
    args = ap.parse_args()
    w = {"n": args.num_prompts, "c": args.concurrency, "input_len": args.input_len, "output_len": args.output_len}
    workdir = Path(tempfile.mkdtemp(prefix="vs-peer-"))
    model = args.model
    if model is None:
        model = workdir / "tiny"
        subprocess.run([args.python, str(TINY_MODEL), str(model)], check=True, capture_output=True)
    peer_name = "vllm bench serve" if args.server == "vllm" else "sglang.bench_serving"
    print(f"machine: {machine()}\nworkload: {w}, ignore_eos, random token ids; peer: {peer_name}", flush=True)
    name = f"{args.server}-peer"
    with harness_for(workdir, {name: real_profile(args.server, args.python, model)}) as harness:
        harness.start()
        with harness.server(name) as server:
            if args.pin:
                pin(server)
            startup_seconds = server.startup_seconds
            rows = rounds(harness, server, args, w, model, workdir, peer_name)
    summary: dict[str, Any] = {"machine": machine(), "server": args.server, "peer": peer_name, "workload": w,
                               "rounds": args.rounds, "startup_seconds": startup_seconds,
                               "pinned": args.pin}
    print()
    for metric in METRICS:
        a = [x[metric] for x in rows if x["client"] == "ours"]
        b = [x[metric] for x in rows if x["client"] == "peer"]
        ma, mb = statistics.median(a), statistics.median(b)
        ratio = ma / mb if mb else float("nan")
        summary[metric] = {"ours_median": ma, "peer_median": mb, "ratio": ratio, "ours_spread": spread(a),
                           "peer_spread": spread(b)}
        print(f"{metric:<18} ours {ma:9.2f}  peer {mb:9.2f}  ratio {ratio:6.3f}  "
              f"spread ours {spread(a):5.1%} peer {spread(b):5.1%}")
    want = w["n"] * w["output_len"]
    counts = {(x["client"], x["total_output_tokens"]) for x in rows}
    same = all(x["total_output_tokens"] == want for x in rows)
    summary["output_tokens_expected"] = want
    summary["output_tokens_identical"] = same
    print(f"output tokens: every round of both clients counted {want}: {same} {sorted(counts)}")
    tput = summary["output_throughput"]
    resolvable = args.rounds >= 4 and max(tput["ours_spread"], tput["peer_spread"]) <= 0.10
    summary["within_5pct"] = abs(tput["ratio"] - 1) <= 0.05
    summary["machine_quiet_enough"] = resolvable
    print(f"output tok/s within 5%: {summary['within_5pct']} (ratio {tput['ratio']:.3f}); the spread "
          + ("allows resolving 5 %" if resolvable else "is too wide on this machine to resolve 5 %"
             if args.rounds >= 4 else f"cannot be judged from {args.rounds} rounds (use 4 or more)"))
    if args.json_out:
        args.json_out.write_text(json.dumps({"summary": summary, "rounds": rows}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
