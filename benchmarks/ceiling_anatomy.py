"""Where does the load generator's shortfall against the simulator's pace come from?

One simulator paces every request exactly (first token ``ttft_ms`` after it is handled, then ``decode_tok_s``)
and, with the ``request_trace`` knob, writes its own timestamps of every request (pytest_sglang/sim/trace.py).
Our client runs the workload (``run_bench``, as benchmarks/client_ceiling.py does) and keeps its own per-request
times. The run's shortfall against the paced tok/s (``expected_throughput``) is then split, exactly:

    duration - waves x paced latency  =  waves x (mean latency - paced latency)  +  edges

* per request, as the client saw it: TTFT over the paced TTFT (``ttft``), the first to the last chunk over
  ``(output_len - 1) / decode_tok_s`` (``decode``), the last chunk to the end of the answer (``tail``);
* per request, as the simulator saw it: request line to route (``parse``), route to first chunk over the paced
  TTFT (``sim_first``), its own decode span over the paced one (``sim_decode``: the simulator behind its
  schedule), its last chunk to the answer written (``sim_tail``); the client's figure minus the simulator's is
  the client's (connection set-up, the request's trip, reading late);
* ``edges``: the rest of the duration: the first wave's starts spread out, the gap between a slot's request
  and its next, the slowest slot chain against the mean one; expected_throughput's model has none of them.

    python benchmarks/ceiling_anatomy.py --levels 16,32 --decode-tok-s 200 --output-len 200 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client_ceiling import int_list, start_sims, stop_sims  # noqa: E402

from pytest_sglang.bench import expected_throughput, run_bench  # noqa: E402
from pytest_sglang.bench.stream import ConnectionPool  # noqa: E402
from pytest_sglang.sim.trace import read_trace  # noqa: E402


def mean_ms(values: list[float]) -> float:
    return 1000.0 * statistics.fmean(values) if values else float("nan")


def split_ttft(reqs: list[Any], sim: list[dict[str, Any]], ttft_s: float, label: str) -> dict[str, float]:
    """TTFT over the paced one, of one group of requests, in steps: client start to the request line read
    (``trip``: connection set-up, the request's write, the simulator's accept), then parsing, then the
    simulator's own first-token delay, then the first chunk's way to the client's timestamp (``delivery``).
    Means of each side, so no request has to be matched to its trace line."""
    if not reqs or not sim:
        return {}
    trip = statistics.fmean(e["arrived"] for e in sim) - statistics.fmean(r.start for r in reqs)
    ttft = statistics.fmean(r.ttft for r in reqs) - ttft_s
    parse = statistics.fmean(e["handled"] - e["arrived"] for e in sim)
    first = statistics.fmean(e["chunks"][0] - e["handled"] for e in sim) - ttft_s
    fresh = [e for e in sim if e.get("accepted") is not None]
    # New connections only (the warmup's connection carries one request of the first wave): their accept and
    # handler-thread delays, against the group's mean start.
    start = statistics.fmean(r.start for r in reqs)
    accept = statistics.fmean(e["accepted"] for e in fresh) - start if fresh else 0.0
    thread = statistics.fmean(e["arrived"] - e["accepted"] for e in fresh) if fresh else 0.0
    return {f"{label}_to_accept_ms": 1000 * accept, f"{label}_accept_to_read_ms": 1000 * thread,
            f"{label}_ttft_ms": 1000 * ttft, f"{label}_trip_ms": 1000 * trip, f"{label}_parse_ms": 1000 * parse,
            f"{label}_sim_first_ms": 1000 * first, f"{label}_delivery_ms": 1000 * (ttft - trip - parse - first)}


def anatomy(result: Any, trace: list[dict[str, Any]], *, concurrency: int, waves: int, output_len: int,
            ttft_s: float, decode_tok_s: float) -> dict[str, float]:
    """One run's shortfall split (ms per request, and shares of the duration); see the module doc."""
    reqs = sorted((r for r in result.requests if r.ok and r.ttft is not None), key=lambda r: r.start)
    paced_decode = (output_len - 1) / decode_tok_s
    paced_latency = ttft_s + paced_decode
    sim = sorted((e for e in trace if e["arrived"] >= reqs[0].start and e["chunks"]), key=lambda e: e["arrived"])
    latency = statistics.fmean(r.latency for r in reqs)
    per_request = waves * (latency - paced_latency)
    edges = result.duration - waves * latency
    out = {
        "ratio": waves * paced_latency / result.duration,
        "lost_per_request_share": per_request / result.duration,
        "lost_edges_share": edges / result.duration,
        "latency_excess_ms": 1000.0 * (latency - paced_latency),
        "ttft_ms": mean_ms([r.ttft - ttft_s for r in reqs]),
        "decode_ms": mean_ms([sum(r.itls) - paced_decode for r in reqs]),
        "tail_ms": mean_ms([r.latency - r.ttft - sum(r.itls) for r in reqs]),
        "sim_decode_ms": mean_ms([e["chunks"][-1] - e["chunks"][0] - paced_decode for e in sim]),
        "sim_tail_ms": mean_ms([e["written"] - e["chunks"][-1] for e in sim]),
        "first_wave_start_spread_ms": 1000.0 * (reqs[concurrency - 1].start - reqs[0].start),
        "edges_ms": 1000.0 * edges,
    }
    out.update(split_ttft(reqs[:concurrency], sim[:concurrency], ttft_s, "w1"))
    out.update(split_ttft(reqs[concurrency:], sim[concurrency:], ttft_s, "later"))
    return out


def connect_burst(url: str, c: int) -> dict[str, float]:
    """Our client's own cost of a first wave's connections, without a request: ``c`` connections opened at once
    through its ConnectionPool, the mean and last time until each is usable (the simulator only accepts them)."""

    async def burst() -> list[float]:
        pool = ConnectionPool(url)
        t0 = time.perf_counter()

        async def one() -> tuple[float, Any]:
            conn, _ = await pool.acquire()
            return time.perf_counter() - t0, conn

        done = await asyncio.gather(*(one() for _ in range(c)))
        for _, conn in done:
            pool.release(conn, True)
        await pool.close()
        return [t for t, _ in done]

    times = asyncio.run(burst())
    return {"burst_connect_mean_ms": 1000 * statistics.fmean(times), "burst_connect_last_ms": 1000 * max(times)}


def run_level(url: str, trace_path: Path, sim_pid: int, *, c: int, args: argparse.Namespace) -> dict[str, Any]:
    n = c * args.waves
    paced = expected_throughput(num_requests=n, concurrency=c, output_len=args.output_len,
                                ttft_s=args.ttft_ms / 1000, decode_tok_s=args.decode_tok_s)
    sim_proc = psutil.Process(sim_pid)
    runs = []
    for _ in range(args.repeats):
        cpu0, wall0 = sum(sim_proc.cpu_times()[:2]), time.perf_counter()
        result = run_bench(url, num_requests=n, concurrency=c, input_len=args.input_len, output_len=args.output_len,
                           warmup=1, telemetry=False, client_processes=args.client_processes)
        sim_busy = (sum(sim_proc.cpu_times()[:2]) - cpu0) / (time.perf_counter() - wall0)
        time.sleep(0.2)  # a trace line is written just after its answer: the last ones may not be there yet
        one = anatomy(result, read_trace(trace_path), concurrency=c, waves=args.waves, output_len=args.output_len,
                      ttft_s=args.ttft_ms / 1000, decode_tok_s=args.decode_tok_s)
        one.update(tok_s=result.output_throughput, client_busy=result.client_busy or 0.0, sim_busy=sim_busy)
        one.update(connect_burst(url, c))
        runs.append(one)
        time.sleep(0.2)
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    return {"concurrency": c, "paced_tok_s": paced, "median": median, "runs": runs}


COLUMNS = ("ratio", "lost_per_request_share", "lost_edges_share", "latency_excess_ms", "ttft_ms", "decode_ms",
           "tail_ms", "sim_decode_ms", "sim_tail_ms", "first_wave_start_spread_ms", "edges_ms", "w1_ttft_ms",
           "w1_trip_ms", "w1_to_accept_ms", "w1_accept_to_read_ms", "w1_parse_ms", "w1_sim_first_ms",
           "w1_delivery_ms", "later_ttft_ms", "later_trip_ms", "later_parse_ms", "later_sim_first_ms",
           "later_delivery_ms", "burst_connect_mean_ms", "burst_connect_last_ms", "client_busy", "sim_busy")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int_list, default=int_list("16,32"), help="concurrency levels")
    ap.add_argument("--decode-tok-s", type=float, default=200.0)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=200)
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="runs per level; the table shows their medians")
    ap.add_argument("--client-processes", type=int, default=1)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    levels = args.levels
    rows = []
    with tempfile.TemporaryDirectory(prefix="ceiling-anatomy-") as tmp:
        trace_path = Path(tmp) / "trace.jsonl"
        knobs = {"startup_seconds": 0.2, "decode_tok_s": args.decode_tok_s, "ttft_ms": args.ttft_ms,
                 "max_batch": max(levels), "request_trace": str(trace_path)}
        procs, url = start_sims(1, knobs, Path(tmp))
        try:
            for c in levels:
                row = run_level(url, trace_path, procs[0].pid, c=c, args=args)
                rows.append(row)
                m = row["median"]
                print(f"c={c:4d} paced {row['paced_tok_s']:8.1f} tok/s, measured {m['tok_s']:8.1f}: "
                      + ", ".join(f"{key} {m[key]:.3f}" for key in COLUMNS), flush=True)
        finally:
            stop_sims(procs)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
