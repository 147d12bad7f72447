"""The fault matrix (issue 8, point 8): each fault a user can meet, run for real through the plugin. For each one
the script records what the user sees, how long it takes to show, and how many of the server's processes are left.

    python benchmarks/fault_matrix.py                       # every row; writes docs/reliability.md
    python benchmarks/fault_matrix.py log-deleted busy-port # a selection: prints the table (--out to write it)
    python benchmarks/fault_matrix.py --list

Every row is a pytest run in a subprocess (`python -m pytest -p no:cacheprovider -v -s -rEf`) in a temp project,
with profiles built as tests/helpers.py `profile_toml` builds them. Each server process carries a `TEST_MARK`
in its environment (the profile's `env`), so processes are counted the way the plugin's own tests count them
(tests/helpers.py `marked_processes`). A row uses the simulator (`--sglang-sim`) where one of its knobs is the
fault. Otherwise it uses a `command` profile that runs `fault_server.py` (written into the project). That script
does the fault (binary garbage or 1 GB in its log, deleting its log, ignoring SIGTERM, a grandchild that calls
setsid), then execs or spawns the same simulator, so the rest of the startup is as real as the sim rows'.

Columns:
  what the user sees  the first line of the error or of the summary, taken from the run's output, as printed;
  time to error       from the fault to that line: from pytest's start for faults present before launch (the
                      TOML, the port, the model path), otherwise from the injection moment that the row names;
  processes left      marked processes still alive 15 s after the run ended (any found are SIGKILLed and named).

A row fails (and the script exits 1) when the user does not see the expected line or any process is left.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers import FakeGpu, marked_processes, profile_toml, wait_for_no_processes  # noqa: E402
from inner_pytest import Run, follow  # noqa: E402

DOC = REPO / "docs" / "reliability.md"
LEFT_WAIT_S = 15.0
BIG_LOG_BYTES = int(os.environ.get("FAULT_MATRIX_LOG_BYTES", 1 << 30))  # the log-1gb row's size
BIG_LOG_RSS_GROWTH_MB = 64  # the log-1gb row: the pytest process's peak RSS may grow this much over an empty log's

# The stand-in for a server that misbehaves in a way no simulator knob covers: it does its fault, then runs the
# real simulator (exec'd, or a child for "deaf"). Its stdout is the server's log file.
FAULT_SERVER = r'''
import os, random, signal, subprocess, sys, time
mode, sim = sys.argv[1], [sys.executable, "-m", "pytest_sglang.sim", *sys.argv[2:]]
def out(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]
out(f"[fault_server] mode {mode}, pid {os.getpid()}\n".encode())
if mode == "garbage":  # binary garbage: random bytes (NUL, ESC, lone \r, invalid UTF-8), a 3 MB line without a break
    rnd = random.Random(8)
    for _ in range(32):
        out(rnd.randbytes(32768))
    out(b"\x1b[31m\xff\xfe\xfd \x00\x00 half an escape \x1b]0;title")
    out(b"\x00" * (3 << 20))
    out(b"\n\xc3\x28 \xe2\x82 Traceback? no: \xf0\x9f\x98\n")
elif mode == "biglog":  # a verbose server: LOG_BYTES of SGLang decode/access lines before its startup, 4 MB a write
    lines = (b"[2026-05-01 12:00:00 TP0] Decode batch. #running-req: 3, #token: 4096, token usage: 0.01, cuda graph: "
             b"True, gen throughput (token/s): 48.21, #queue-req: 0\n"
             b'[2026-05-01 12:00:00] INFO:     127.0.0.1:51234 - "GET /metrics HTTP/1.1" 200 OK\n')
    chunk = lines * ((4 << 20) // len(lines))
    left = int(os.environ["LOG_BYTES"])
    while left > 0:
        piece = chunk[:left]
        out(piece)
        left -= len(piece)
elif mode == "delete-log":  # a cleanup job removes the log while the server starts
    out(b"[fault_server] starting\n")
    time.sleep(1.0)  # the watcher has the file open and has read the first line
    os.unlink(os.readlink("/proc/self/fd/1"))
elif mode == "grandchild":  # a grandchild that calls setsid, ignores SIGTERM, and whose parent exits at once
    if os.fork() == 0:
        if os.fork() == 0:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.execvp("sleep", ["sleep", "600"])
        os._exit(0)
    os.wait()
elif mode == "deaf":  # the server's main process ignores SIGTERM; the simulator runs as its child
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(sim)
    while True:
        time.sleep(3600)
elif mode == "leak":  # prints the secrets it was given, then crashes with them in its traceback
    key, token = os.environ["SECRET_KEY"], os.environ["HF_TOKEN"]
    out(f"env HF_TOKEN={token}\nusing api key {key}\ncurl -H 'Authorization: Bearer {key}'\n".encode())
    out(b"Traceback (most recent call last):\n  File \"/srv/launch.py\", line 3, in <module>\n")
    out(f"ValueError: bad token {token} for key {key}\n".encode())
    sys.exit(1)
os.execv(sim[0], sim)
'''

# Records the inner pytest's own CPU and peak memory from session start to the first test's body: the plan, the
# launch, the readiness loop and its watcher (the server's processes are not this process).
CPU_CONFTEST = """
import json, os, resource, time
_t0 = {}
def pytest_sessionstart(session):
    r = resource.getrusage(resource.RUSAGE_SELF)
    _t0.update(cpu=r.ru_utime + r.ru_stime)
def record_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["CPU_OUT"], "w") as fh:
        json.dump({"cpu": r.ru_utime + r.ru_stime - _t0["cpu"], "maxrss_mb": r.ru_maxrss / 1024}, fh)
"""

READY = """
import time
def test_ready(sglang_server):
    assert sglang_server.pid
    print("TEST-END", time.monotonic())
"""


@dataclass
class Outcome:
    sees: str
    seconds: float | None
    timed_from: str
    ok: bool
    note: str = ""


@dataclass
class Row:
    name: str
    scenario: str
    server: str  # what runs: "sim", "fault_server MODE", or "none" (refused before any launch)
    covered_by: str
    run: Callable[[Ctx], Outcome]


@dataclass
class Result:
    row: Row
    outcome: Outcome
    left: list[str]
    wall: float


class Ctx:
    """One row's temp project, its TEST_MARK and a way to run pytest there."""

    def __init__(self, root: Path) -> None:
        self.mark = uuid.uuid4().hex
        self.path = root
        (root / "fault_server.py").write_text(FAULT_SERVER)

    def project(self, toml: str, tests: str = READY, conftest: str = "") -> None:
        (self.path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n" + toml)
        (self.path / "test_user.py").write_text(tests)
        if conftest:
            (self.path / "conftest.py").write_text(conftest)

    def profile(self, body: str = "", sim: str = "startup_seconds = 0.6", name: str = "p") -> str:
        return profile_toml(name, self.mark, body, sim)

    def command_profile(self, mode: str, body: str = "", sim: str = '{"startup_seconds": 0.6}',
                        env: str = "", args: str = "") -> str:
        """A profile that runs fault_server.py MODE, which then runs the simulator with the knobs `sim` and the
        flags `args` (a command profile's own `args` key is not used: its command is all there is)."""
        return (f'[tool.pytest_sglang.profiles.p]\n'
                f'command = ["{{python}}", "fault_server.py", "{mode}", "--model-path", "m", "--host", "{{host}}", '
                f'"--port", "{{port}}"{args}]\n{body}\n'
                f"env = {{ TEST_MARK = \"{self.mark}\", PYTEST_SGLANG_SIM = '{sim}'{env} }}\n")

    def start(self, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], Run]:
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "400", **(env or {})}
        full_env.pop("PYTEST_ADDOPTS", None)
        if not any(a.startswith("--sglang-log-dir") for a in args):  # gone with the project, not in the state dir
            args = (*args, f"--sglang-log-dir={self.path / 'logs'}")
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-s", "-rEf", *args],
                                cwd=self.path, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        return proc, follow(proc)

    def finish(self, proc: subprocess.Popen[str], run: Run, timeout: float = 150) -> Run:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        run.returncode, run.ended = proc.returncode, time.monotonic()
        if run.reader is not None:
            run.reader.join(timeout=10)
        return run

    def pytest(self, *args: str, env: dict[str, str] | None = None, timeout: float = 150) -> Run:
        proc, run = self.start(*args, env=env)
        return self.finish(proc, run, timeout)

    def wait_for_marked(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(marked_processes(self.mark)) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server never started {count} processes")
            time.sleep(0.1)


def summary_line(run: Run, pattern: str) -> str:
    """The first output line matching `pattern`, as the user reads it: the short summary's `... - Failed: `
    prefix and pytest's `E   ` dropped."""
    hit = run.first(pattern)
    if hit is None:
        return ""
    line = hit[1].strip()
    line = re.sub(r"^E\s+", "", line.strip("= "))
    line = re.sub(r"^(ERROR|FAILED) \S+ - ", "", line)
    return re.sub(r"^Failed: ", "", line)


def launched(run: Run) -> float | None:
    """When the plugin said it launched the server (its "launching: log ..." line)."""
    hit = run.first(r"launching: log")
    return hit[0] if hit else None


def test_end(run: Run) -> float | None:
    """When the (last) test's body ended: the time it printed after a TEST-END marker."""
    hits = [line for _, line in run.lines if "TEST-END" in line]
    return float(hits[-1].split("TEST-END", 1)[1].split()[0]) if hits else None


def judged(run: Run, sees: str, error_line: str | None, *, start: float | None = None,
           timed_from: str = "pytest's start", note: str = "") -> Outcome:
    """The outcome of a run whose user must see a line matching `sees`; the time to error runs from `start`
    (default: pytest's start) to the first line matching `error_line` (default: the `sees` line)."""
    seen = summary_line(run, sees)
    hit = run.first(error_line or sees)
    seconds = None if hit is None else hit[0] - (start if start is not None else run.started)
    return Outcome(seen or f"(expected /{sees}/ not seen; exit {run.returncode})\n{run.text[-3000:]}", seconds,
                   timed_from, bool(seen), note)


# -- rows -------------------------------------------------------------------------------------------------------

def busy_port(ctx: Ctx) -> Outcome:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        ctx.project(ctx.profile(f"port = {sock.getsockname()[1]}"))
        run = ctx.pytest("--sglang-profile=p", "--sglang-sim")
    return judged(run, r"Port 127\.0\.0\.1:\d+ is busy: something listens on it; held by pid", r" ERROR")


def stale_server(ctx: Ctx) -> Outcome:
    class Healthy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    stale = HTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=stale.serve_forever, daemon=True).start()
    try:
        ctx.project(ctx.profile(f"port = {stale.server_port}"))
        run = ctx.pytest("--sglang-profile=p", "--sglang-sim")
    finally:
        stale.shutdown()
        stale.server_close()
    return judged(run, r"is busy: a server answers on it \(GET /health -> HTTP 200\)", r" ERROR")


def missing_model(ctx: Ctx) -> Outcome:
    ctx.project(ctx.profile().replace('model = "/models/sim-model"', 'model = "/no/such/model-dir"'))
    run = ctx.pytest("--sglang-profile=p")
    return judged(run, r"model path /no/such/model-dir does not exist", r" ERROR")


def unknown_profile(ctx: Ctx) -> Outcome:
    ctx.project(ctx.profile(name="baseline") + ctx.profile(name="eagle3"))
    run = ctx.pytest("--sglang-profile=eagel3", "--sglang-sim")
    outcome = judged(run, r"Unknown profile 'eagel3'", None)
    outcome.ok = outcome.ok and run.returncode == 4 and "Did you mean 'eagle3'?" in run.text
    return outcome


def malformed_toml(ctx: Ctx) -> Outcome:
    """In pyproject.toml: pytest reads the file first (for its own ini options) and says so itself."""
    ctx.project(ctx.profile() + 'args = ["--tp" "2"]\n')
    run = ctx.pytest("--sglang-profile=p", "--sglang-sim")
    outcome = judged(run, r"pyproject.toml: .*line \d+", None)
    outcome.ok = outcome.ok and run.returncode == 4
    return outcome


def malformed_config(ctx: Ctx) -> Outcome:
    """In a --sglang-config file, which only the plugin reads."""
    ctx.project("")
    (ctx.path / "servers.toml").write_text('[profiles.p]\nmodel = "m"\nargs = ["--tp" "2"]\n')
    run = ctx.pytest("--sglang-profile=p", "--sglang-config=servers.toml", "--sglang-sim")
    outcome = judged(run, r"servers.toml: malformed TOML.*line \d+", None)
    outcome.ok = outcome.ok and run.returncode == 4
    return outcome


def self_extends(ctx: Ctx) -> Outcome:
    ctx.project(ctx.profile('extends = "p"'))
    run = ctx.pytest("--sglang-profile=p", "--sglang-sim")
    outcome = judged(run, r"`extends` loops", None)
    outcome.ok = outcome.ok and run.returncode == 4
    return outcome


def deaf_to_sigterm(ctx: Ctx) -> Outcome:
    """The server's main process ignores SIGTERM (its simulator child does too, and leaves the group)."""
    ctx.project(ctx.command_profile("deaf", "shutdown_grace = 2",
                                    sim='{"startup_seconds": 0.6, "ignore_sigterm": true}'))
    run = ctx.pytest("--sglang-profile=p")
    outcome = judged(run, r"\d+ passed", None, start=test_end(run),
                     timed_from="the test's end, to the summary (the teardown: shutdown_grace 2 s, then SIGKILL)")
    outcome.ok = outcome.ok and run.returncode == 0
    return outcome


ORPHAN_TEST = """
import os, time, psutil
def test_the_grandchild_is_an_orphan(sglang_server):
    tree = {sglang_server.pid, *(c.pid for c in psutil.Process(sglang_server.pid).children(recursive=True))}
    orphans = [p for p in psutil.process_iter(["cmdline", "environ"])
               if p.info["cmdline"] == ["sleep", "600"] and (p.info["environ"] or {}).get("TEST_MARK") == "THE_MARK"]
    assert len(orphans) == 1 and orphans[0].pid not in tree, "no orphaned grandchild"
    assert os.getsid(orphans[0].pid) != os.getsid(sglang_server.pid)
    print("TEST-END", time.monotonic())
"""


def setsid_grandchild(ctx: Ctx) -> Outcome:
    """fault_server forks a child that forks a grandchild: setsid, SIGTERM ignored, its parent gone at once (so it
    is no descendant of the server by the time of the teardown, and not in its group). The simulator's own ranks
    escape too (ignore_sigterm)."""
    ctx.project(ctx.command_profile("grandchild", "shutdown_grace = 1", args=', "--tp", "2"',
                                    sim='{"startup_seconds": 0.6, "ignore_sigterm": true}'),
                ORPHAN_TEST.replace("THE_MARK", ctx.mark))
    run = ctx.pytest("--sglang-profile=p")
    outcome = judged(run, r"\d+ passed", None, start=test_end(run),
                     timed_from="the test's end, to the summary (the teardown: shutdown_grace 1 s, then the "
                                "owner-token sweep)")
    outcome.ok = outcome.ok and run.returncode == 0
    return outcome


def _long_startup(ctx: Ctx) -> tuple[subprocess.Popen[str], Run]:
    ctx.project(ctx.profile('args = ["--tp", "2"]', sim="startup_seconds = 600, ignore_sigterm = true"))
    proc, run = ctx.start("--sglang-profile=p", "--sglang-sim")
    try:
        ctx.wait_for_marked(4)  # launcher, two ranks (escaped: setsid), detokenizer
    except BaseException:
        proc.kill()  # its reaper takes the server down
        ctx.finish(proc, run)
        raise
    time.sleep(0.5)
    return proc, run


def ctrl_c_startup(ctx: Ctx) -> Outcome:
    proc, run = _long_startup(ctx)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    ctx.finish(proc, run, timeout=60)
    outcome = judged(run, r"^p: INTERRUPTED during startup after", None, start=sent,
                     timed_from="SIGINT to pytest (a 600 s startup, tp 2, ranks setsid and deaf to SIGTERM)")
    outcome.ok = outcome.ok and run.returncode == 2
    return outcome


def sigkill_startup(ctx: Ctx) -> Outcome:
    proc, run = _long_startup(ctx)
    sent = time.monotonic()
    proc.kill()
    ctx.finish(proc, run, timeout=30)
    left = wait_for_no_processes(ctx.mark, timeout=LEFT_WAIT_S)
    gone = time.monotonic() - sent
    return Outcome("nothing (pytest is killed); its reaper kills the server's tree", gone if not left else None,
                   "SIGKILL to pytest, to the last server process gone (the reaper polls every 0.5 s and gives the "
                   "tree 5 s of SIGTERM grace, which the ranks ignore)", not left)


def xdist_worker_killed(ctx: Ctx) -> Outcome:
    tests = """
import os, signal, time
def test_kills_its_worker(sglang_server):
    with open("killed_at", "w") as fh:
        fh.write(repr(time.monotonic()))
    os.kill(os.getpid(), signal.SIGKILL)
def test_other(sglang_server):
    assert sglang_server.pid
"""
    ctx.project(ctx.profile(sim="startup_seconds = 0.5"), tests)
    run = ctx.pytest("-n", "2", "--sglang-profile=p", "--sglang-sim")
    killed = ctx.path / "killed_at"
    start = float(killed.read_text()) if killed.exists() else None
    outcome = judged(run, r"worker '?gw\d'? crashed while running", r"crashed while running|node down", start=start,
                     timed_from="SIGKILL of the worker (pytest -n 2)")
    outcome.ok = outcome.ok and re.search(r"1 failed, 1 passed|1 passed, 1 failed", run.text) is not None
    return outcome


def _cpu(ctx: Ctx, log_bytes: int) -> tuple[Run, dict[str, float]]:
    tests = "from conftest import record_cpu\ndef test_ready(sglang_server):\n    record_cpu()\n"
    ctx.project(ctx.command_profile("biglog", "startup_timeout = 120"), tests, CPU_CONFTEST)
    out = ctx.path / "cpu.json"
    out.unlink(missing_ok=True)
    run = ctx.pytest("--sglang-profile=p", env={"LOG_BYTES": str(log_bytes), "CPU_OUT": str(out)})
    return run, (json.loads(out.read_text()) if out.exists() else {})


def log_1gb(ctx: Ctx) -> Outcome:
    """BIG_LOG_BYTES of log before the ready line (written 4 MB a write, as fast as the disk takes it), beside the
    same startup with an empty log: CPU and peak RSS of the pytest process, whose readiness loop reads the log."""
    size = BIG_LOG_BYTES
    empty_run, empty = _cpu(ctx, 0)
    run, big = _cpu(ctx, size)
    log = ctx.path / "logs" / "p.log"
    outcome = judged(run, r"^p: ready in [\d.]+ s", None, start=launched(run), timed_from="the launch (to ready)")
    grown = big["maxrss_mb"] - empty["maxrss_mb"] if big and empty else None
    if big and empty:
        outcome.note = (f"{size / 2**30:.2f} GB of log before the ready line; the pytest process's CPU from "
                        f"session start to the test: {big['cpu']:.2f} s ({empty['cpu']:.2f} s with an empty log, "
                        f"so about {big['cpu'] - empty['cpu']:.2f} s for the log); peak RSS {big['maxrss_mb']:.0f} MB "
                        f"({empty['maxrss_mb']:.0f} MB with an empty log)")
    outcome.ok = (outcome.ok and empty_run.returncode == 0 and run.returncode == 0 and grown is not None
                  and grown < BIG_LOG_RSS_GROWTH_MB)
    with contextlib.suppress(OSError):
        outcome.note += f"; log file {log.stat().st_size / 2**30:.2f} GB"
        log.unlink()  # a GB of temp disk given back at once
    return outcome


def log_garbage(ctx: Ctx) -> Outcome:
    ctx.project(ctx.command_profile("garbage"))
    run = ctx.pytest("--sglang-profile=p")
    outcome = judged(run, r"^p: ready in [\d.]+ s", None, start=launched(run), timed_from="the launch (to ready)")
    outcome.ok = outcome.ok and run.returncode == 0
    return outcome


def log_deleted(ctx: Ctx) -> Outcome:
    ctx.project(ctx.command_profile("delete-log", "startup_timeout = 30\nstall_timeout = 10"))
    run = ctx.pytest("--sglang-profile=p")
    outcome = judged(run, r"^p: ready in [\d.]+ s|no progress for|not ready within", None,
                     start=launched(run), timed_from="the launch (the log is deleted 1 s in)")
    outcome.ok = outcome.ok and run.returncode == 0
    return outcome


def silent_hang(ctx: Ctx) -> Outcome:
    ctx.project(ctx.profile("startup_timeout = 120\nstall_timeout = 2", sim='startup_seconds = 1.0, fault = "hang"'))
    run = ctx.pytest("--sglang-profile=p", "--sglang-sim")
    launch = launched(run)
    outcome = judged(run, r"no progress for \d+ s in phase", r" ERROR", start=launch,
                     timed_from="the launch (the log goes silent 0.6 s in; stall_timeout 2 s, startup_timeout 120 s)")
    return outcome


def dies_mid_session(ctx: Ctx) -> Outcome:
    tests = """
import time, requests
def test_first_request(sglang_server):
    r = requests.post(sglang_server.url("/generate"), json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200
    print("CRASH-REQUESTED", time.monotonic())
def test_after_the_crash(sglang_server):
    requests.post(sglang_server.url("/generate"), json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                  timeout=30)
def test_later(sglang_server):
    pass
"""
    ctx.project(ctx.profile(sim="startup_seconds = 0.6, crash_after_requests = 1"), tests)
    run = ctx.pytest("--sglang-profile=p", "--sglang-sim")
    crash = run.first(r"CRASH-REQUESTED")
    start = float(crash[1].split("CRASH-REQUESTED")[1].split()[0]) if crash else None
    outcome = judged(run, r"FAILED test_user.py::test_after_the_crash.* - .*server died during the session",
                     r"test_after_the_crash\S* FAILED", start=start,
                     timed_from="the request after which its scheduler crashes, to the next test's failure")
    outcome.ok = outcome.ok and "ConnectionError" not in run.text.split("short test summary")[-1] and (
        re.search(r"FAILED test_user.py::test_later.* - .*server died", run.text) is not None)
    return outcome


GPU_TESTS = """
import os, psutil
def test_uses_the_gpu(sglang_server):
    ranks = [c for c in psutil.Process(sglang_server.pid).children(recursive=True)
             if any(a.startswith("scheduler_TP") for a in c.cmdline())]
    rank0 = next(c for c in ranks if "scheduler_TP0" in c.cmdline())
    with open(os.environ["FAKE_GPU_CONFIG"], "a") as fh:
        for proc in [psutil.Process(sglang_server.pid), *ranks]:
            fh.write(f"{proc.pid} 1000 {proc.pid}\\n")  # held while the process lives
        fh.write(f"{rank0.pid} 70000 {os.environ['GPU_HOLDER']}\\n")  # the driver keeps rank 0's memory after SIGKILL
    import time
    print("TEST-END", time.monotonic())
"""


def gpu_held(ctx: Ctx) -> Outcome:
    gpu = FakeGpu(ctx.path)
    holder = subprocess.Popen(["sleep", "120"])
    try:
        ctx.project(ctx.profile('args = ["--tp", "2"]'), GPU_TESTS)
        env = {**gpu.env(), "GPU_HOLDER": str(holder.pid), "PYTEST_SGLANG_RELEASE_TIMEOUT": "2"}
        run = ctx.pytest("--sglang-profile=p", "--sglang-sim", env=env)
    finally:
        holder.kill()
        holder.wait()
    outcome = judged(run, r"ResourcesHeldWarning: \[sglang p\] 2 s after its server was stopped, it still holds "
                          r"resources: pid \d+ \(scheduler_TP0\) holds 70000 MiB on GPU 0", None,
                     start=test_end(run), timed_from="the test's end, to the warning (release bound 2 s)")
    outcome.sees = re.sub(r"^.*?ResourcesHeldWarning", "ResourcesHeldWarning", outcome.sees)
    return outcome


SECRETS = ("sk-matrix-key-7731", "hf_matrixtoken_5519")


def secrets(ctx: Ctx) -> Outcome:
    """--api-key in args, HF_TOKEN in env; the server prints both, in plain lines, a Bearer header and its
    traceback, then exits 1. None may reach the terminal, the JSON report, its HTML page or the junit XML."""
    key, token = SECRETS
    ctx.project(ctx.command_profile("leak", args=f', "--api-key", "{key}"',
                                    env=f', HF_TOKEN = "{token}", SECRET_KEY = "{key}"'))
    run = ctx.pytest("--sglang-profile=p", "--sglang-report=report.json", "--junitxml=junit.xml")
    outcome = judged(run, r"server exited during startup", r" ERROR",
                     start=launched(run),
                     timed_from="the launch (the server prints the secrets and exits 1)")
    shown = [run.text]
    for name in ("report.json", "report.html", "junit.xml"):
        with contextlib.suppress(OSError):
            shown.append((ctx.path / name).read_text())
    leaked = [s for s in SECRETS if any(s in text for text in shown)]
    outcome.ok = outcome.ok and not leaked and "--api-key ***" in run.text and len(shown) == 4
    outcome.note = (f"leaked: {', '.join(leaked)}" if leaked else
                    f"neither secret in the terminal, report.json, report.html, junit.xml ({len(shown) - 1} files)")
    return outcome


ROWS = [
    Row("busy-port", "port busy (a process listens on the profile's port)", "none (sim, refused)",
        "tests/test_lifecycle.py::test_busy_port_is_an_error_naming_the_holder", busy_port),
    Row("stale-server", "a stale server answers on the port", "none (sim, refused)",
        "tests/test_lifecycle.py::test_stale_server_answering_on_the_port_is_never_mistaken_for_ours", stale_server),
    Row("missing-model", "missing model path (no --sglang-sim)", "none (sglang, refused)",
        "tests/test_lifecycle.py::test_missing_model_path_is_reported_before_launch", missing_model),
    Row("unknown-profile", "unknown profile (`--sglang-profile=eagel3`)", "none",
        "tests/test_lifecycle.py::test_unknown_profile_lists_the_known_ones", unknown_profile),
    Row("malformed-toml", "malformed TOML in pyproject.toml (pytest parses it first)", "none",
        "tests/test_fault_matrix.py::test_matrix_row[malformed-toml]", malformed_toml),
    Row("malformed-config", "malformed TOML in a --sglang-config file", "none",
        "tests/test_lifecycle.py::test_malformed_toml_names_file_and_line", malformed_config),
    Row("self-extends", "a profile that extends itself", "none",
        "tests/test_fault_matrix.py::test_matrix_row[self-extends]", self_extends),
    Row("deaf-server", "the server's main process ignores SIGTERM (and its child leaves the group)",
        "fault_server deaf", "tests/test_fault_matrix.py::test_matrix_row[deaf-server]", deaf_to_sigterm),
    Row("setsid-grandchild", "a grandchild calls setsid, ignores SIGTERM, its parent exits (orphaned to init)",
        "fault_server grandchild",
        "tests/test_lifecycle.py::test_stubborn_children_that_escape_the_group_are_killed (ranks that setsid); "
        "tests/test_fault_matrix.py::test_matrix_row[setsid-grandchild]", setsid_grandchild),
    Row("ctrl-c-startup", "Ctrl-C during a 600 s startup", "sim",
        "tests/test_lifecycle.py::test_ctrl_c_during_a_long_startup_leaves_nothing", ctrl_c_startup),
    Row("sigkill-startup", "pytest SIGKILLed during a 600 s startup", "sim",
        "tests/test_lifecycle.py::test_pytest_killed_outright_still_leaves_nothing", sigkill_startup),
    Row("xdist-worker-killed", "a pytest-xdist worker SIGKILLed mid-test (one shared server)", "sim, -n 2",
        "tests/test_scale.py::test_a_crashed_worker_leaves_no_orphan (os._exit)", xdist_worker_killed),
    Row("log-1gb", "1 GB of log before the ready line", "fault_server biglog",
        "tests/test_fault_matrix.py::test_matrix_row[log-1gb] (with 128 MB, 1 GB in the benchmark only)", log_1gb),
    Row("log-garbage", "binary garbage in the log (random bytes, NUL, ESC, invalid UTF-8, a 3 MB line)",
        "fault_server garbage", "tests/test_fault_matrix.py::test_matrix_row[log-garbage]", log_garbage),
    Row("log-deleted", "the log file deleted under the watcher, 1 s into the startup", "fault_server delete-log",
        "tests/test_fault_matrix.py::test_matrix_row[log-deleted]", log_deleted),
    Row("silent-hang", "a silent hang (stall_timeout 2 s, startup_timeout 120 s)", "sim",
        "tests/test_scale.py::test_a_silent_hang_fails_at_the_stall_timeout_not_the_hard_cap", silent_hang),
    Row("dies-mid-session", "the server dies mid-session (its scheduler crashes after a request)", "sim",
        "tests/test_lifecycle.py::test_server_dying_mid_session_fails_later_tests_with_its_traceback; "
        "tests/launch/test_tree_members.py::test_a_rank_killed_mid_session_fails_the_next_test_naming_it",
        dies_mid_session),
    Row("gpu-held", "GPU memory still held after the tree is killed (fake nvidia-smi on PATH)", "sim",
        "tests/launch/test_release.py::test_session_teardown_waits_for_the_gpus_and_says_who_still_holds_one",
        gpu_held),
    Row("secrets", "secrets in args (--api-key) and env (HF_TOKEN), printed by the server in its crash",
        "fault_server leak",
        "tests/test_lifecycle.py::test_api_key_never_reaches_the_terminal; "
        "tests/launch/test_private_logs.py::test_excerpts_are_redacted_in_errors_and_the_report; "
        "tests/plugin/test_show.py (env); tests/test_fault_matrix.py::test_matrix_row[secrets] (env values the server "
        "prints)", secrets),
]


def run_row(row: Row, keep: bool) -> Result:
    root = Path(tempfile.mkdtemp(prefix=f"fault-{row.name}-"))
    ctx = Ctx(root)
    started = time.monotonic()
    try:
        outcome = row.run(ctx)
    except Exception as exc:  # a row that could not run is a failed row, not a crashed script
        outcome = Outcome(f"(the row could not run: {type(exc).__name__}: {exc})", None, "", False)
    left = []
    for proc in wait_for_no_processes(ctx.mark, timeout=LEFT_WAIT_S):
        with contextlib.suppress(Exception):
            left.append(f"pid {proc.pid} {' '.join(proc.cmdline())[:100]}")
            proc.kill()
    wall = time.monotonic() - started
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return Result(row, outcome, left, wall)


def _cell(text: str, limit: int = 220) -> str:
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    """A markdown code span, also around text that holds backticks."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return (f"{os.cpu_count()} CPUs ({cpu}), a VM shared with other engineers' jobs (load average "
            f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end, 1/5/15 min), Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def table(results: list[Result]) -> str:
    out = ["| scenario | server | what the user sees | time to error | processes left | covered by |",
           "|---|---|---|---|---|---|"]
    for r in results:
        o = r.outcome
        seconds = "-" if o.seconds is None else f"{o.seconds:.2f} s" if o.seconds < 1 else f"{o.seconds:.1f} s"
        left = str(len(r.left)) + (f" ({'; '.join(r.left)})" if r.left else "")
        verdict = "" if o.ok and not r.left else " **(FAILED)**"
        sees = _code(_cell(o.sees)) if o.ok else _cell(o.sees, 400)
        covered = _cell(r.row.covered_by, 400)
        out.append(f"| {_cell(r.row.scenario)}{verdict} | {r.row.server} | {sees} | {seconds} | {left} | {covered} |")
    return "\n".join(out)


def details(results: list[Result]) -> str:
    lines = []
    for r in results:
        o = r.outcome
        text = f"- **{r.row.name}**: time from {o.timed_from}; row wall {r.wall:.1f} s"
        if o.note:
            text += f"; {o.note}"
        lines.append(text + ".")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="*", help="row names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument("--out", type=Path, help=f"write the doc here (default with all rows: {DOC})")
    parser.add_argument("--keep", action="store_true", help="keep each row's temp project")
    args = parser.parse_args(argv)
    if args.list:
        for row in ROWS:
            print(f"{row.name:22} {row.scenario}")
        return 0
    by_name = {row.name: row for row in ROWS}
    unknown = [n for n in args.rows if n not in by_name]
    if unknown:
        parser.error(f"unknown row(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    rows = [by_name[n] for n in args.rows] if args.rows else ROWS
    out = args.out or (DOC if not args.rows else None)
    results = []
    started = time.monotonic()
    for row in rows:
        result = run_row(row, args.keep)
        results.append(result)
        o = result.outcome
        status = "ok" if o.ok and not result.left else "FAILED"
        print(f"{row.name:22} {status:6} {'-' if o.seconds is None else f'{o.seconds:5.1f} s'}  left "
              f"{len(result.left)}  {_cell(o.sees, 160 if o.ok else 3000)}", flush=True)
        if o.note:
            print(f"{'':22} {o.note}", flush=True)
    wall = time.monotonic() - started
    print()
    print(table(results))
    if out is not None:
        out.write_text(document(results, wall, " ".join(["python benchmarks/fault_matrix.py", *args.rows])))
        print(f"\nwrote {out}")
    return 0 if all(r.outcome.ok and not r.left for r in results) else 1


def document(results: list[Result], wall: float, command: str) -> str:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                         text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "pytest_sglang"], cwd=REPO, capture_output=True,
                           text=True).stdout.splitlines()
    if dirty:
        rev += f" with {len(dirty)} uncommitted files in pytest_sglang/ (others' work in progress in the shared tree)"
    date = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    ok = sum(r.outcome.ok and not r.left for r in results)
    return DOC_TEMPLATE.format(
        command=command,
        table=table(results), details=details(results),
        run_line=textwrap.fill(f"**Run**: {date}, on commit {rev}. {ok}/{len(results)} rows as expected; each "
                               f"must leave 0 processes. Wall time {wall:.0f} s.", 115),
        machine_line=textwrap.fill(f"**Machine**: {machine()}. The times are single runs on a loaded 2-core "
                                   "machine: read them as \"about\", not as benchmarks.", 115),
        new_tests=", ".join(r.name for r in ROWS if "test_fault_matrix.py" in r.covered_by),
    )


DOC_TEMPLATE = """# Reliability: the fault matrix

Each row is a fault a user can meet, run for real through the plugin: a pytest run in a temp project, with its
server's processes counted by a `TEST_MARK` in their environment. `benchmarks/fault_matrix.py` produced this page
(how each row is built and timed: its docstring). Re-run it with

    {command}

{run_line}

{machine_line}

The **server** column: "sim" rows run the simulator (`--sglang-sim`), a knob of it being the fault where there is
one; "fault_server MODE" rows run a `command` profile, `fault_server.py` (in the script), which does the fault and
then runs the same simulator (exec'd, or as its child where the main process must ignore SIGTERM); "none" rows are
refused before anything is launched.

Columns:

- **what the user sees**: the first line of the error or of the summary, copied from the run's output (pytest's
  `E   ` and short-summary prefixes dropped, cut at 220 characters);
- **time to error**: from the fault to that line: from pytest's start for faults present before the launch (port,
  model, TOML), otherwise from the moment the row's note names;
- **processes left**: server processes (marked ones) still alive 15 s after pytest exited; the script kills and
  names any;
- **covered by**: the test that checks the row in CI (plain `pytest`); the matrix itself runs by hand.

{table}

Row notes:

{details}

## What the matrix found

- **log-deleted** was a bug: `LogTail` opened the log by its path at each poll, so once the file was deleted (a
  cleanup job, the log folder removed) it read nothing more while the server kept writing to the deleted file. A
  healthy startup then failed after `stall_timeout` (300 s by default) with `no progress for 300 s in phase
  starting`, which blames the server. Fixed in 63baa07 (pytest_sglang/watch/tail.py): the tail keeps the file it
  last opened and reads on from it while the path is gone (a file replaced at the path is still read from its
  start). Before the fix this row showed `[sglang p] no progress for 10 s in phase starting (stall_timeout 10 s:
  ...)` after 10.2 s (the row sets stall_timeout 10). The error's `Full log:` still names the deleted path.
- **malformed-toml** in pyproject.toml is reported by pytest itself (it reads the file for its own ini options
  before any plugin): the line and column are there, but not the plugin's "Fix the file at that line". In a
  `--sglang-config` file, which only the plugin reads, the plugin's message is shown.
- Every other row behaved as docs/failures.md's "Every fault" table says, with 0 processes left.

Rows with tests in tests/test_fault_matrix.py (no other test covered them; the test runs the row itself, as
above): {new_tests}.
"""


if __name__ == "__main__":
    sys.exit(main())
