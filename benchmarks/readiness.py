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
    tqdm bars redrawn with \\r; no ready line, so nothing stops early) is appended in 64 KiB pieces, with
    LogWatcher.poll (its LogTail) after each piece, in a child process: CPU seconds (process time) per 100 MB,
    ru_maxrss, and tracemalloc's peak (separate child). Beside it, in the same run and interleaved with it:
    one GNU grep pass over the same whole file (`grep -c Traceback`) and one seed poll (both greps), run with
    subprocess and measured with RUSAGE_CHILDREN.
(d) end to end: a pytest run (the plugin as installed, `--sglang-profile=e2e`) whose server answers /health,
    writes that same log in 64 KiB writes, then its ready line; CPU seconds of the pytest process during the
    `sglang_server` fixture's setup (plan, launch, the readiness loop and its watcher; not pytest's own start,
    not the server's), and one grep pass over the server's log file it wrote, after each run.

With --baseline-rev REV, (c) and (d) also measure the watch.py (with the kinds.py) of git revision REV (`git
show REV:...` into a temporary folder), its runs interleaved with the current ones, and report the ratio.

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

from pytest_sglang.config.kinds import SGLANG  # noqa: E402
from pytest_sglang.config.profiles import Profile  # noqa: E402
from pytest_sglang.errors import ServerStartupError  # noqa: E402
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
# (c) watcher cost vs grep cost; (d) the same end to end, through a pytest run
# ---------------------------------------------------------------------------------------------------------


def generate_log(path: Path, megabytes: float, rng: random.Random) -> int:
    """Startup lines from a real SGLang 0.5.23 log (ready line dropped), then a long serving-style body."""
    target = int(megabytes * 1_000_000)
    sample = REPO / "tests" / "samples" / "logs" / "21_ready_sglang-0.5.23-cpu.log"
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


def count_lines(path: Path) -> int:
    """Lines as the watcher splits them (\\n, \\r, \\r\\n once)."""
    data = path.read_bytes()
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


def baseline_dir(work: Path, rev: str) -> Path:
    """watch.py and kinds.py as of git revision `rev` (a watch.py from before the watch/ package), in a folder."""
    out = work / "baseline"
    out.mkdir(exist_ok=True)
    for name in ("watch.py", "kinds.py"):
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:pytest_sglang/{name}"], check=True,
                              capture_output=True, text=True).stdout
        (out / name).write_text(text)
    return out


def load_watch(baseline: str | None):
    """(LogTail, LogWatcher): the current ones, or those of a baseline folder (its watch.py run with its own
    kinds.py rules: the watcher is built from the kind of the same name there)."""
    if baseline is None:
        from pytest_sglang.watch import LogTail, LogWatcher
        return LogTail, LogWatcher
    import importlib.util

    modules = {}
    for name in ("kinds", "watch"):
        spec = importlib.util.spec_from_file_location(f"pytest_sglang._{name}_baseline", Path(baseline) / f"{name}.py")
        assert spec is not None and spec.loader is not None
        modules[name] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = modules[name]
        spec.loader.exec_module(modules[name])
    old_kinds, old = modules["kinds"].KINDS, modules["watch"]

    class BaselineWatcher(old.LogWatcher):  # type: ignore[name-defined,misc]
        def __init__(self, kind, **kw):
            super().__init__(old_kinds[kind.name], **kw)

    return old.LogTail, BaselineWatcher


def watch_child(source: str, chunk: int, trace: bool, baseline: str | None = None) -> None:
    """Append `source` to a fresh log piece by piece; after each piece, LogWatcher.poll. Prints JSON."""
    import tracemalloc

    LogTail, LogWatcher = load_watch(baseline)  # noqa: N806

    log = Path(source + (".live" if baseline is None else ".base.live"))
    log.unlink(missing_ok=True)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tail = LogTail(log)
    watcher = LogWatcher(SGLANG, started_at=time.monotonic(), tail=tail)
    if trace:
        tracemalloc.start()
    cpu = 0.0
    polls = 0
    with open(source, "rb") as src, open(log, "ab") as dst:
        while True:
            data = src.read(chunk)
            if not data:
                break
            dst.write(data)
            dst.flush()
            c0 = time.process_time()
            watcher.poll(time.monotonic())
            cpu += time.process_time() - c0
            polls += 1
        c0 = time.process_time()
        watcher.poll(time.monotonic(), final=True)
        cpu += time.process_time() - c0
    peak = tracemalloc.get_traced_memory()[1] if trace else None
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    log.unlink(missing_ok=True)
    print(json.dumps({"cpu_s": cpu, "polls": polls, "bytes_read": tail.bytes_read,
                      "maxrss_before_kb": rss0, "maxrss_after_kb": rss1, "tracemalloc_peak_b": peak,
                      "ready": watcher.ready_at is not None, "failing": watcher.failing_since is not None,
                      "phases": sorted(watcher.phases), "status": watcher.status(time.monotonic())}))


def run_child(source: Path, chunk: int, trace: bool, baseline: Path | None = None) -> dict:
    cmd = [sys.executable, __file__, "--_watch-child", str(source), "--_chunk", str(chunk)]
    if trace:
        cmd.append("--_trace")
    if baseline is not None:
        cmd += ["--_baseline", str(baseline)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def grep_cpu(script: str, log: Path) -> tuple[float, float]:
    """CPU seconds (user+sys of the children) and wall seconds of a bash `script` run over `log`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(["bash", "-c", script, "grep", str(log)], check=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


GREP_PASS = 'grep -c "Traceback" "$1" >/dev/null; true'  # one pass of GNU grep over the whole file


def watcher_cost(work: Path, runs: int, source: Path, size: int, baseline: Path | None) -> dict:
    per100 = 100_000_000 / size
    chunk = 64 * 1024
    lines = count_lines(source)
    ours: list[dict] = []
    base: list[dict] = []
    passes: list[float] = []
    polls: list[float] = []
    subprocess.run(["cat", str(source)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    for _ in range(runs):  # interleaved, so all three see the same machine load
        ours.append(run_child(source, chunk, trace=False))
        if baseline is not None:
            base.append(run_child(source, chunk, trace=False, baseline=baseline))
        passes.append(grep_cpu(GREP_PASS, source)[0])
        polls.append(grep_cpu(SEED_POLL, source)[0])
    traced = run_child(source, chunk, trace=True)
    for r in ours + base:
        assert not r["ready"] and r["bytes_read"] == size, r
    for r in base:  # same verdict
        assert (r["failing"], r["phases"], r["status"]) == (ours[0]["failing"], ours[0]["phases"],
                                                              ours[0]["status"]), (r, ours[0])
    extra = {}
    if base:
        extra = {"baseline_cpu_s_per_100mb": [r["cpu_s"] * per100 for r in base]}
    return {
        **extra,
        "log_bytes": size,
        "log_lines": lines,
        "chunk_bytes": chunk,
        "ours_cpu_s_per_100mb": [r["cpu_s"] * per100 for r in ours],
        "ours_us_per_line": [r["cpu_s"] / lines * 1e6 for r in ours],
        "ours_maxrss_before_kb": ours[0]["maxrss_before_kb"],
        "ours_maxrss_after_kb": [r["maxrss_after_kb"] for r in ours],
        "ours_tracemalloc_peak_b": traced["tracemalloc_peak_b"],
        "ours_failing_flagged": ours[0]["failing"],
        "grep_pass_cpu_s_per_100mb": [c * per100 for c in passes],
        "grep_poll_cpu_s_per_100mb": [c * per100 for c in polls],
    }


STREAM_SERVER = r'''
import os, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, source = int(sys.argv[1]), sys.argv[2]

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

srv = ThreadingHTTPServer(("127.0.0.1", port), H)
srv.daemon_threads = True
threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
with open(source, "rb") as f:  # the whole serving log, in 64 KiB writes, then the ready line
    while True:
        data = f.read(65536)
        if not data:
            break
        while data:
            data = data[os.write(1, data):]
os.write(1, b"\n[2025-03-08 13:00:00] The server is fired up and ready to roll!\n")
threading.Event().wait()
'''

E2E_CONFTEST = r'''
import json, os, time
import pytest

if os.environ.get("E2E_BASELINE"):  # the baseline's watch.py (and its kinds.py) behind the readiness loop
    import readiness
    import pytest_sglang.server.origins as origins
    origins.LogTail, origins.LogWatcher = readiness.load_watch(os.environ["E2E_BASELINE"])


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    c0, w0 = time.process_time(), time.monotonic()
    yield
    if fixturedef.argname == "sglang_server":
        with open(os.environ["E2E_OUT"], "w") as f:
            json.dump({"cpu_s": time.process_time() - c0, "wall_s": time.monotonic() - w0}, f)
'''

E2E_TEST = '''
def test_ready(sglang_server):
    assert sglang_server.phases["ready"] > 0
'''


def e2e_run(root: Path, n: int, baseline: Path | None) -> dict:
    """One pytest run whose server writes the log, then its ready line; CPU of the sglang_server fixture's setup
    in the pytest process (plan, launch, the readiness loop and its watcher), and grep over the same log."""
    logs = root / f"logs-{n}-{'base' if baseline else 'ours'}"
    out = root / f"e2e-{n}.json"
    env = {**os.environ, "E2E_OUT": str(out), "PYTHONPATH": os.pathsep.join([str(REPO / "benchmarks"), str(REPO)])}
    if baseline is not None:
        env["E2E_BASELINE"] = str(baseline)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--sglang-profile=e2e",
                           f"--sglang-log-dir={logs}", "test_e2e.py"], cwd=root, env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"e2e pytest run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    res = json.loads(out.read_text())
    log = next(logs.rglob("*.log"))
    res["log_bytes"] = log.stat().st_size
    res["grep_pass_cpu_s"] = grep_cpu(GREP_PASS, log)[0]
    shutil.rmtree(logs, ignore_errors=True)
    return res


def end_to_end(work: Path, runs: int, source: Path, baseline: Path | None) -> dict:
    root = work / "e2e"
    root.mkdir()
    (root / "stream_server.py").write_text(STREAM_SERVER)
    (root / "conftest.py").write_text(E2E_CONFTEST)
    (root / "test_e2e.py").write_text(E2E_TEST)
    (root / "pyproject.toml").write_text(
        "[tool.pytest_sglang.profiles.e2e]\nkind = \"sglang\"\nhealth_path = \"/health\"\nstartup_timeout = 600\n"
        f"command = [\"{{python}}\", \"{root / 'stream_server.py'}\", \"{{port}}\", \"{source}\"]\n")
    ours: list[dict] = []
    base: list[dict] = []
    for n in range(runs):
        ours.append(e2e_run(root, n, None))
        if baseline is not None:
            base.append(e2e_run(root, n, baseline))
        print(f"  (d) run {n + 1}/{runs}: ours {ours[-1]['cpu_s']:.2f} CPU-s"
              + (f", baseline {base[-1]['cpu_s']:.2f}" if base else "")
              + f", grep pass {ours[-1]['grep_pass_cpu_s']:.3f}", flush=True)
    per100 = [100_000_000 / r["log_bytes"] for r in ours]
    out = {
        "log_bytes": ours[0]["log_bytes"],
        "ours_cpu_s_per_100mb": [r["cpu_s"] * k for r, k in zip(ours, per100, strict=True)],
        "ours_wall_s": [r["wall_s"] for r in ours],
        "grep_pass_cpu_s_per_100mb": [r["grep_pass_cpu_s"] * k for r, k in zip(ours, per100, strict=True)],
    }
    if base:
        out["baseline_cpu_s_per_100mb"] = [r["cpu_s"] * 100_000_000 / r["log_bytes"] for r in base]
    return out


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
    p.add_argument("--skip-launch", action="store_true", help="only (c) and (d)")
    p.add_argument("--skip-watch", action="store_true", help="only (a) and (b)")
    p.add_argument("--skip-e2e", action="store_true", help="leave out (d)")
    p.add_argument("--baseline-rev", default=None,
                   help="also measure (c) and (d) with pytest_sglang/watch.py (and kinds.py) of this git revision, "
                        "interleaved; a revision from before the watch/ package, e.g. 708df63")
    p.add_argument("--_baseline", dest="baseline", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_watch-child", dest="watch_child", help=argparse.SUPPRESS)
    p.add_argument("--_chunk", dest="chunk", type=int, default=65536, help=argparse.SUPPRESS)
    p.add_argument("--_trace", dest="trace", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.watch_child:
        watch_child(args.watch_child, args.chunk, args.trace, args.baseline)
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
            source = work / "generated.log"
            size = generate_log(source, args.log_mb, rng)
            baseline = baseline_dir(work, args.baseline_rev) if args.baseline_rev else None
            print(f"(c) watcher cost on a generated {args.log_mb:.0f} MB log ...", flush=True)
            result["watch"] = watcher_cost(work, args.runs, source, size, baseline)
            if not args.skip_e2e:
                print("(d) end to end: pytest runs whose server writes that log before its ready line ...",
                      flush=True)
                result["e2e"] = end_to_end(work, args.runs, source, baseline)
            if args.baseline_rev:
                result["baseline_rev"] = args.baseline_rev
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
        rev = result.get("baseline_rev")
        ours = spread(w["ours_cpu_s_per_100mb"])
        grep = spread(w["grep_pass_cpu_s_per_100mb"])
        poll = spread(w["grep_poll_cpu_s_per_100mb"])
        summary = {"ours_cpu_s_per_100mb": ours, "grep_pass_cpu_s_per_100mb": grep,
                   "grep_poll_cpu_s_per_100mb": poll, "ours_us_per_line": spread(w["ours_us_per_line"]),
                   "ours_over_grep_pass": ours["median"] / grep["median"] if grep["median"] else None}
        result["watch_summary"] = summary
        rows.append(("(c) watcher CPU per 100 MB, polled in 64 KiB pieces", fmt(ours),
                     f"grep pass {fmt(grep)}; seed poll {fmt(poll)}",
                     f"ours = {summary['ours_over_grep_pass']:.1f} grep passes", "<= 0.5 s"))
        rows.append(("(c) watcher cost per line", fmt(summary["ours_us_per_line"], "us"), "", "", ""))
        if "baseline_cpu_s_per_100mb" in w:
            b = spread(w["baseline_cpu_s_per_100mb"])
            summary.update(baseline_cpu_s_per_100mb=b, baseline_over_ours=b["median"] / ours["median"])
            rows.append((f"(c) same, watch.py of {rev} (interleaved runs)", fmt(b), "",
                         f"baseline/ours {summary['baseline_over_ours']:.1f}x", ""))
        rss_delta = (statistics.median(w["ours_maxrss_after_kb"]) - w["ours_maxrss_before_kb"]) / 1024
        rows.append(("(c) peak memory of the watcher", f"tracemalloc {w['ours_tracemalloc_peak_b'] / 1e6:.1f} MB, "
                     f"maxrss {rss_delta:+.1f} MB", "grep: constant", "", ""))
    if "e2e" in result:
        e = result["e2e"]
        rev = result.get("baseline_rev")
        ours = spread(e["ours_cpu_s_per_100mb"])
        grep = spread(e["grep_pass_cpu_s_per_100mb"])
        summary = {"ours_cpu_s_per_100mb": ours, "grep_pass_cpu_s_per_100mb": grep,
                   "ours_over_grep_pass": ours["median"] / grep["median"] if grep["median"] else None}
        rows.append(("(d) sglang_server setup CPU per 100 MB of log before ready", fmt(ours), f"grep pass {fmt(grep)}",
                     f"ours = {summary['ours_over_grep_pass']:.1f} grep passes", "<= 0.5 s"))
        if "baseline_cpu_s_per_100mb" in e:
            b = spread(e["baseline_cpu_s_per_100mb"])
            summary.update(baseline_cpu_s_per_100mb=b, baseline_over_ours=b["median"] / ours["median"])
            rows.append((f"(d) same, watch.py of {rev} (interleaved runs)", fmt(b), "",
                         f"baseline/ours {summary['baseline_over_ours']:.1f}x", ""))
        result["e2e_summary"] = summary
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
