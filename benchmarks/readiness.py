"""Readiness benchmark: pytest-sglang's core (start_server / LogTail + LogWatcher) vs the seeds' grep loop.

    python benchmarks/readiness.py [--runs 5] [--log-mb 100] [--out results.json]

Run by hand; it prints a table and, with --out, writes every measurement as JSON. It measures, side by side
in the same run (the seed loop watches the very same log file as the plugin, in a concurrent process):

(a) ready-line-to-return lag: a tiny fake server answers /health 200 from the start (as SGLang does once
    uvicorn is up), writes startup lines, then the ready line at a random moment, noting time.time() right
    after the write. Ours: the moment launch_server() returns. Seed: the moment the bash loop echoes READY.
(b) crash-to-error latency: the fake server writes a traceback (one write) at a random moment, notes the time
    the final exception line is in the file, then exits (exit code 1) or stays alive (optionally ignoring
    SIGTERM, as a wedged server may). Ours: the moment launch_server() raises. Seed: the loop echoes CRASH.
(c) watcher cost: a generated SGLang-style log (startup lines, decode/prefill batch lines, access lines,
    tqdm bars redrawn with \\r; no ready line, so nothing stops early) is appended in 64 KiB pieces and fed
    through LogTail.read_lines + LogWatcher.feed after each piece, in a child process: CPU seconds per 100 MB,
    ru_maxrss, and tracemalloc's peak (separate child). The grep loop's cost is one poll (both greps) over the
    same whole file, run with subprocess and measured with RUSAGE_CHILDREN.

With --baseline-rev REV, (c) also measures the watch.py of git revision REV (`git show REV:...` into a temporary
module), its runs interleaved with the current ones in the same invocation, and reports the ratio.

The seed loop is the literal one from /work/shared/seeds/000*.txt, with the log path as a variable and
`date +%s.%N` added to its echo lines so its detection moment is known.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_sglang.config.profiles import Profile  # noqa: E402
from pytest_sglang.errors import ServerStartupError  # noqa: E402
from pytest_sglang.kinds import SGLANG  # noqa: E402
from pytest_sglang.launch.plan import plan_launch  # noqa: E402
from pytest_sglang.server import launch_server  # noqa: E402
from pytest_sglang.server.ready import CRASH_SETTLE_SECONDS, POLL_SECONDS  # noqa: E402

SEED_LOOP = r"""
LOG="$1"
for i in $(seq 1 300); do
  if grep -q "The server is fired up" "$LOG" 2>/dev/null; then
    echo "SERVER READY after ${i}x5s $(date +%s.%N)"; break;
  elif grep -c "Traceback" "$LOG" 2>/dev/null | grep -qv "^0$"; then
    echo "CRASH after ${i}x5s $(date +%s.%N)";
    grep -B2 -A5 "Error\|AttributeError\|RuntimeError\|KeyError" "$LOG" | tail -30;
    break;
  elif [ $i -eq 300 ]; then
    echo "TIMEOUT";
    tail -10 "$LOG";
  fi;
  sleep 5;
done
"""

SEED_POLL = r"""
LOG="$1"
grep -q "The server is fired up" "$LOG" 2>/dev/null
grep -c "Traceback" "$LOG" 2>/dev/null | grep -qv "^0$"
true
"""

FAKE_SERVER = r'''
import argparse, os, signal, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--port", type=int)
p.add_argument("--mode", choices=["ready", "tb-exit", "tb-hang", "tb-hang-noterm"])
p.add_argument("--at", type=float)
p.add_argument("--stamp")
a, _ = p.parse_known_args()
t0 = time.monotonic()
if a.mode == "tb-hang-noterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

def w(text):
    data = text.encode()
    while data:
        data = data[os.write(1, data):]

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        self.send_response(200 if self.path.startswith("/health") else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

if a.mode == "ready":
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

w("[2025-01-01 00:00:00] server_args=ServerArgs(model_path='/models/m', tp_size=2, port=%d)\n" % a.port)
w("[2025-01-01 00:00:01 TP0] Init torch distributed begin.\n[2025-01-01 00:00:01 TP1] Init torch distributed begin.\n")
w("[2025-01-01 00:00:02 TP0] Load weight begin. avail mem=78.50 GB\n")
for i in range(0, 101, 25):
    n = i // 25
    w("Loading safetensors checkpoint shards: %3d%% Completed | %d/4 [00:0%d<00:00,  1.20it/s]\r" % (i, n, n))
w("\n[2025-01-01 00:00:05 TP0] KV Cache is allocated. #tokens: 100000, K size: 2.00 GB, V size: 2.00 GB\n")
time.sleep(max(0.0, t0 + a.at - time.monotonic()))
if a.mode == "ready":
    w("[2025-01-01 00:00:09] INFO:     Uvicorn running on http://127.0.0.1:%d (Press CTRL+C to quit)\n" % a.port)
    w("[2025-01-01 00:00:10] The server is fired up and ready to roll!\n")
else:
    w("[2025-01-01 00:00:09 TP1] Scheduler hit an exception: Traceback (most recent call last):\n"
      '  File "/sgl/srt/managers/scheduler.py", line 2410, in run_scheduler_process\n'
      "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, dp_rank)\n"
      '  File "/sgl/srt/model_executor/model_runner.py", line 383, in __init__\n'
      "    self.initialize(min_per_gpu_memory)\n"
      "RuntimeError: CUDA error: an illegal memory access was encountered\n")
t = time.time()
with open(a.stamp + ".tmp", "w") as f:
    f.write(repr(t))
os.replace(a.stamp + ".tmp", a.stamp)
if a.mode == "tb-exit":
    os._exit(1)
while True:
    time.sleep(3600)
'''


# ---------------------------------------------------------------------------------------------------------
# (a) and (b): one launch, watched by start_server and by the seed loop at the same time
# ---------------------------------------------------------------------------------------------------------


def one_launch(work: Path, mode: str, at: float, n: int) -> dict[str, float | None]:
    log_dir = work / f"{mode}-{n}"
    log_dir.mkdir()
    stamp = log_dir / "event.stamp"
    profile = Profile(
        name="bench", source=work / "pyproject.toml", kind="sglang",
        command=("{python}", str(work / "fake_server.py"), "--port", "{port}", "--mode", mode,
                 "--at", f"{at:.3f}", "--stamp", str(stamp)),
        startup_timeout=60.0,
    )
    plan = plan_launch(profile, sim=False, log_dir=log_dir)
    seed = subprocess.Popen(["bash", "-c", SEED_LOOP, "seed", str(plan.log_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    cpu0 = time.process_time()
    wall0 = time.monotonic()
    server = None
    raised = False
    try:
        server = launch_server(plan)
    except ServerStartupError:
        raised = True
    ours_at = time.time()
    ours_cpu = time.process_time() - cpu0
    ours_wall = time.monotonic() - wall0
    try:
        seed_out, _ = seed.communicate(timeout=30)
    finally:
        if seed.poll() is None:
            os.killpg(seed.pid, signal.SIGKILL)
            seed.wait()
        if server is not None:
            server.close()
    event_at = float(stamp.read_text()) if stamp.exists() else None
    seed_at = None
    for line in seed_out.splitlines():
        if line.startswith(("SERVER READY", "CRASH")):
            seed_at = float(line.split()[-1])
    expect_raise = mode != "ready"
    if raised != expect_raise or event_at is None:
        raise SystemExit(f"{mode} run {n}: start_server {'raised' if raised else 'returned'}; log {plan.log_path}")
    return {
        "at": at,
        "ours_s": ours_at - event_at,
        "seed_s": (seed_at - event_at) if seed_at is not None else None,
        "ours_cpu_s": ours_cpu,
        "ours_wall_s": ours_wall,
    }


def launches(work: Path, runs: int, rng: random.Random) -> dict[str, list[dict[str, float | None]]]:
    (work / "fake_server.py").write_text(FAKE_SERVER)
    out: dict[str, list[dict[str, float | None]]] = {}
    for mode in ("ready", "tb-exit", "tb-hang", "tb-hang-noterm"):
        out[mode] = []
        for n in range(runs):
            # stratified over one whole seed poll period (5 s), so the seed's poll phase is spread evenly
            # and its median is not at the mercy of a few random draws
            at = 0.8 + 5.0 * (n + rng.random()) / runs
            res = one_launch(work, mode, at, n)
            out[mode].append(res)
            print(f"  {mode:15s} run {n + 1}/{runs}: event at {at:4.1f} s  ours {res['ours_s']:.3f} s  "
                  f"seed {res['seed_s'] if res['seed_s'] is None else round(res['seed_s'], 3)} s", flush=True)
    return out


# ---------------------------------------------------------------------------------------------------------
# (c) watcher cost vs grep poll cost
# ---------------------------------------------------------------------------------------------------------


def generate_log(path: Path, megabytes: float, rng: random.Random) -> int:
    """Startup lines from a real SGLang 0.5.23 log (ready line dropped), then a long serving-style body."""
    target = int(megabytes * 1_000_000)
    sample = REPO.parent / "shared" / "samples" / "logs" / "21_ready_sglang-0.5.23-cpu.log"
    head = sample.read_bytes() if sample.exists() else b""
    head = b"".join(line for line in head.splitlines(keepends=True) if b"fired up" not in line)
    with open(path, "wb") as f:
        f.write(head)
        size = len(head)
        sec = 0
        while size < target:
            sec += 1
            ts = f"2025-03-08 {12 + sec // 3600 % 12:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
            parts = []
            for tp in range(4):
                parts.append(f"[{ts} TP{tp}] Prefill batch. #new-seq: 1, #new-token: {rng.randint(100, 4000)}, "
                             f"#cached-token: {rng.randint(0, 2000)}, token usage: 0.{rng.randint(10, 99)}, "
                             f"#running-req: {rng.randint(1, 64)}, #queue-req: {rng.randint(0, 9)}, \n")
                for _ in range(6):
                    parts.append(f"[{ts} TP{tp}] Decode batch. #running-req: {rng.randint(1, 64)}, "
                                 f"#token: {rng.randint(1000, 90000)}, token usage: 0.{rng.randint(10, 99)}, "
                                 f"cuda graph: True, gen throughput (token/s): {rng.uniform(100, 4000):.2f}, "
                                 f"#queue-req: {rng.randint(0, 9)}, \n")
            for _ in range(8):
                parts.append(f"[{ts}] INFO:     127.0.0.1:{rng.randint(30000, 60000)} - "
                             f'"POST /generate HTTP/1.1" 200 OK\n')
            bar = "".join(f"Capturing batches (bs={160 - 8 * i} avail_mem=12.{i:02d} GB): {i * 5:3d}%|"
                          f"{'█' * (i // 2)}{' ' * (10 - i // 2)}| {i}/20 [00:0{i // 4}<00:03,  6.{i}it/s]\r"
                          for i in range(21))
            parts.append(bar + "\n")
            chunk = "".join(parts).encode()
            f.write(chunk)
            size += len(chunk)
    return size


def load_watch_module(path: str | None):
    """pytest_sglang.watch, or the watch.py at `path` loaded as a module of the package (a baseline)."""
    if path is None:
        import pytest_sglang.watch as module
        return module
    import importlib.util

    spec = importlib.util.spec_from_file_location("pytest_sglang._watch_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def watch_child(source: str, chunk: int, trace: bool, module_path: str | None = None) -> None:
    """Append `source` to a fresh log piece by piece; after each piece, read+feed. Prints JSON."""
    import tracemalloc

    watch = load_watch_module(module_path)
    LogTail, LogWatcher = watch.LogTail, watch.LogWatcher  # noqa: N806

    log = Path(source + (".live" if module_path is None else ".base.live"))
    log.unlink(missing_ok=True)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tail = LogTail(log)
    watcher = LogWatcher(SGLANG, started_at=time.monotonic())
    if trace:
        tracemalloc.start()
    cpu = 0.0
    lines = 0
    polls = 0
    with open(source, "rb") as src, open(log, "ab") as dst:
        while True:
            data = src.read(chunk)
            if not data:
                break
            dst.write(data)
            dst.flush()
            c0 = time.process_time()
            got = tail.read_lines()
            watcher.feed(got, time.monotonic())
            cpu += time.process_time() - c0
            lines += len(got)
            polls += 1
        c0 = time.process_time()
        got = tail.flush()
        watcher.feed(got, time.monotonic())
        cpu += time.process_time() - c0
        lines += len(got)
    peak = tracemalloc.get_traced_memory()[1] if trace else None
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    log.unlink(missing_ok=True)
    print(json.dumps({"cpu_s": cpu, "lines": lines, "polls": polls, "bytes_read": tail.bytes_read,
                      "maxrss_before_kb": rss0, "maxrss_after_kb": rss1, "tracemalloc_peak_b": peak,
                      "ready": watcher.ready_at is not None, "failing": watcher.failing_since is not None}))


def run_child(source: Path, chunk: int, trace: bool, module_path: Path | None = None) -> dict:
    cmd = [sys.executable, __file__, "--_watch-child", str(source), "--_chunk", str(chunk)]
    if trace:
        cmd.append("--_trace")
    if module_path is not None:
        cmd += ["--_module", str(module_path)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def grep_poll_cpu(log: Path) -> tuple[float, float]:
    """CPU seconds (user+sys of the children) and wall seconds of one seed poll over the whole file."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(["bash", "-c", SEED_POLL, "poll", str(log)], check=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def baseline_module(work: Path, rev: str) -> Path:
    """watch.py as of git revision `rev`, written to a temporary file."""
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:pytest_sglang/watch.py"], check=True,
                          capture_output=True, text=True).stdout
    path = work / "watch_baseline.py"
    path.write_text(text)
    return path


def watcher_cost(work: Path, runs: int, megabytes: float, rng: random.Random, baseline_rev: str | None = None) -> dict:
    source = work / "generated.log"
    size = generate_log(source, megabytes, rng)
    per100 = 100_000_000 / size
    chunk = 64 * 1024
    base_path = baseline_module(work, baseline_rev) if baseline_rev else None
    ours: list[dict] = []
    base: list[dict] = []
    for _ in range(max(3, runs // 2 + 1)):  # interleaved, so both see the same machine load
        ours.append(run_child(source, chunk, trace=False))
        if base_path is not None:
            base.append(run_child(source, chunk, trace=False, module_path=base_path))
    traced = run_child(source, chunk, trace=True)
    subprocess.run(["cat", str(source)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    polls = [grep_poll_cpu(source) for _ in range(runs)]
    for r in ours + base:
        assert not r["ready"] and r["bytes_read"] == size, r
    for r in base:  # same lines, same verdict
        assert (r["lines"], r["failing"]) == (ours[0]["lines"], ours[0]["failing"]), (r, ours[0])
    extra = {}
    if base:
        extra = {"baseline_rev": baseline_rev,
                 "baseline_cpu_s_per_100mb": [r["cpu_s"] * per100 for r in base],
                 "baseline_us_per_line": [r["cpu_s"] / r["lines"] * 1e6 for r in base]}
    return {
        **extra,
        "log_bytes": size,
        "log_lines": ours[0]["lines"],
        "chunk_bytes": chunk,
        "ours_cpu_s_per_100mb": [r["cpu_s"] * per100 for r in ours],
        "ours_us_per_line": [r["cpu_s"] / r["lines"] * 1e6 for r in ours],
        "ours_maxrss_before_kb": ours[0]["maxrss_before_kb"],
        "ours_maxrss_after_kb": [r["maxrss_after_kb"] for r in ours],
        "ours_tracemalloc_peak_b": traced["tracemalloc_peak_b"],
        "ours_failing_flagged": ours[0]["failing"],
        "grep_poll_cpu_s_per_100mb": [c * per100 for c, _ in polls],
        "grep_poll_wall_s_per_100mb": [w * per100 for _, w in polls],
    }


# ---------------------------------------------------------------------------------------------------------
# reporting
# ---------------------------------------------------------------------------------------------------------


def machine() -> dict:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    grep_version = subprocess.run(["grep", "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "platform": platform.platform(), "grep": grep_version[0] if grep_version else "?",
            "loadavg": os.getloadavg()}


def spread(values: list[float | None]) -> dict:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": vals[0], "max": vals[-1], "n": len(vals)}


def fmt(s: dict, unit: str = "s", scale: float = 1.0, digits: int = 3) -> str:
    if s["median"] is None:
        return "n/a"
    return (f"{s['median'] * scale:.{digits}f} {unit} [{s['min'] * scale:.{digits}f} .. "
            f"{s['max'] * scale:.{digits}f}]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs per scenario (medians are reported)")
    p.add_argument("--log-mb", type=float, default=100.0, help="size of the generated log for (c)")
    p.add_argument("--out", type=Path, default=None, help="write all measurements as JSON here")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--skip-launch", action="store_true", help="only (c)")
    p.add_argument("--skip-watch", action="store_true", help="only (a) and (b)")
    p.add_argument("--baseline-rev", default=None,
                   help="also measure (c) with pytest_sglang/watch.py of this git revision, interleaved")
    p.add_argument("--_module", dest="module", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_watch-child", dest="watch_child", help=argparse.SUPPRESS)
    p.add_argument("--_chunk", dest="chunk", type=int, default=65536, help=argparse.SUPPRESS)
    p.add_argument("--_trace", dest="trace", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.watch_child:
        watch_child(args.watch_child, args.chunk, args.trace, args.module)
        return

    rng = random.Random(args.seed)
    info = machine()
    print(f"machine: {info['nproc']} CPUs, {info['cpu']}, Python {info['python']}, {info['grep']}, "
          f"load average {info['loadavg'][0]:.2f}")
    print(f"core constants: POLL_SECONDS={POLL_SECONDS}, CRASH_SETTLE_SECONDS={CRASH_SETTLE_SECONDS}; "
          f"seed loop polls every 5 s")
    work = Path(tempfile.mkdtemp(prefix="readiness-bench-"))
    result: dict = {"machine": info, "runs": args.runs, "poll_seconds": POLL_SECONDS,
                    "crash_settle_seconds": CRASH_SETTLE_SECONDS}
    started = time.monotonic()
    try:
        if not args.skip_launch:
            print("(a)/(b) launches (each watched by start_server and by the seed loop at once):")
            result["launch"] = launches(work, args.runs, rng)
        if not args.skip_watch:
            print(f"(c) watcher cost on a generated {args.log_mb:.0f} MB log ...", flush=True)
            result["watch"] = watcher_cost(work, args.runs, args.log_mb, rng, args.baseline_rev)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["machine"]["loadavg_end"] = os.getloadavg()
    result["bench_wall_s"] = time.monotonic() - started

    rows: list[tuple[str, str, str, str, str]] = []
    if "launch" in result:
        names = {"ready": ("(a) ready line -> fixture returns", 0.100),
                 "tb-exit": ("(b) traceback, process exits -> error", 0.5),
                 "tb-hang": ("(b) traceback, process alive -> error", 2.0),
                 "tb-hang-noterm": ("(b) traceback, alive, ignores SIGTERM -> error", 2.0)}
        summary = {}
        for mode, runs in result["launch"].items():
            ours = spread([r["ours_s"] for r in runs])
            seed = spread([r["seed_s"] for r in runs])
            busy = spread([r["ours_cpu_s"] / r["ours_wall_s"] for r in runs])
            summary[mode] = {"ours": ours, "seed": seed, "ours_cpu_share": busy}
            label, target = names[mode]
            ratio = f"{seed['median'] / ours['median']:.0f}x" if ours["median"] and seed["median"] else "n/a"
            ok = "yes" if ours["median"] is not None and ours["median"] <= target else "NO"
            rows.append((label, fmt(ours), fmt(seed), ratio, f"<= {target:g} s: {ok}"))
        result["launch_summary"] = summary
    if "watch" in result:
        w = result["watch"]
        ours = spread(w["ours_cpu_s_per_100mb"])
        grep = spread(w["grep_poll_cpu_s_per_100mb"])
        result["watch_summary"] = {"ours_cpu_s_per_100mb": ours, "grep_poll_cpu_s_per_100mb": grep,
                                   "ours_us_per_line": spread(w["ours_us_per_line"]),
                                   "grep_poll_wall_s_per_100mb": spread(w["grep_poll_wall_s_per_100mb"])}
        polls_to_match = ours["median"] / grep["median"] if grep["median"] else None
        result["watch_summary"]["grep_polls_per_ours"] = polls_to_match
        rows.append(("(c) CPU per 100 MB of log (ours: once; seed: per poll)", fmt(ours),
                     fmt(grep), f"ours = {polls_to_match:.0f} polls" if polls_to_match else "n/a", ""))
        rows.append(("(c) watcher cost per line", fmt(result["watch_summary"]["ours_us_per_line"], "us"), "", "", ""))
        if "baseline_cpu_s_per_100mb" in w:
            b = spread(w["baseline_cpu_s_per_100mb"])
            bl = spread(w["baseline_us_per_line"])
            speedup = b["median"] / ours["median"]
            result["watch_summary"].update(baseline_cpu_s_per_100mb=b, baseline_us_per_line=bl,
                                           baseline_over_ours=speedup)
            rows.append((f"(c) same, watch.py of {w['baseline_rev']} (interleaved runs)", fmt(b),
                         f"per line {fmt(bl, 'us')}", f"baseline/ours {speedup:.1f}x", ""))
        rss_delta = (statistics.median(w["ours_maxrss_after_kb"]) - w["ours_maxrss_before_kb"]) / 1024
        rows.append(("(c) peak memory of the watcher", f"tracemalloc {w['ours_tracemalloc_peak_b'] / 1e6:.1f} MB, "
                     f"maxrss {rss_delta:+.1f} MB", "grep: constant", "", ""))
    print()
    head = ("measure", "ours: median [min .. max]", "seed grep loop: median [min .. max]", "seed/ours", "target")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    for r in [head, tuple("-" * n for n in widths), *rows]:
        print("  ".join(c.ljust(n) for c, n in zip(r, widths, strict=True)).rstrip())
    if "launch_summary" in result:
        cpu = result["launch_summary"]["ready"]["ours_cpu_share"]
        print(f"\nour readiness loop's own CPU while waiting: {fmt(cpu, '% of one core', 100, 1)}")
    print(f"\nbench wall time {result['bench_wall_s']:.0f} s; load average at end {os.getloadavg()[0]:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
