"""The fault table of a fleet (issue 25): each way a fleet's startup or session can go wrong, run for real through
the plugin on the simulator, with what the user sees, how long it takes and what is left behind.

    python benchmarks/fleet_faults.py                          # every case, both fleets, 3 repeats; writes the doc
    python benchmarks/fleet_faults.py --repeats 1 router-kill  # a selection: prints the table (--out to write it)
    python benchmarks/fleet_faults.py --list

Two fleets, both simulated (`--sglang-sim`: the simulator plays every member):
  router  `replicas = 2` behind a router (members worker0, worker1, router); the faulting server member is worker1;
  pd      `prefill = { replicas = 1 }`, `decode = { replicas = 1 }` behind a `--pd-disaggregation` router (members
          prefill0, decode0, router); the faulting server member is prefill0 (it also holds a KV bootstrap port).

Every run is an inner `python -m pytest -p no:cacheprovider -v -s -rEf --sglang-sim --sglang-profile=f` in a fresh
temp project, with this checkout first on PYTHONPATH (so the plugin measured is this one), in its own session (a
terminal's Ctrl-C is a SIGINT to the foreground process group: the cases send it with killpg). Each member carries
the project's TEST_MARK in its environment (the profile's `env`, as tests/helpers.py `profile_toml` builds it), so
its processes are counted as the plugin's own tests count them (tests/helpers.py `marked_processes`).

Measured for each run:
  what the user sees  the first line of the error (the first failing test's message, or the plugin's line), as printed;
  member named        whether that line names the faulting member;
  time                per case (the table says from what to what); a fault's moment is when its first line appears
                      in the member's own log (PROFILE.MEMBER.log, polled every 10 ms), a kill's the moment the
                      inner test's os.kill() returned (CLOCK_MONOTONIC, shared by the processes), a signal's the
                      moment this script sent it;
  members gone        seconds from pytest's exit (from the signal, for the signal cases) until no marked process is
                      alive (polled every 0.1 s);
  leftovers           marked processes still alive LEFT_WAIT_S after pytest exited (killed and named);
  ports free          every port a member bound, read from the member logs (a server's `port=` in its server_args
                      line, a prefill's bootstrap port, the router's HTTP and Prometheus ports from its lines), is free
                      once the members are gone: no socket listens on it and a bind succeeds.

Times are medians over --repeats runs (min..max beside them); yes/no cells are "yes" only when every repeat was.
A case fails (the script exits 1) when its expected outcome is not seen, a process is left or a port is held.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers import marked_processes, profile_toml  # noqa: E402
from inner_pytest import Run, follow  # noqa: E402

DOC = REPO / "docs" / "fleet-faults.md"
RUNS = REPO / "benchmarks" / "results-fleet-faults" / "runs.json"  # what --render reads
LEFT_WAIT_S = 15.0
FAULT_AFTER_S = 2.0  # a server member's startup fault, seconds into its own startup (startup_seconds 30)
ROUTER_FAULT_AFTER_S = 1.0  # the router's, seconds into its startup


@dataclass(frozen=True)
class Fleet:
    name: str
    body: str  # the profile's fleet keys
    member: str  # the server member the faults and kills hit
    servers: int  # server members (each a launcher, a scheduler and a detokenizer process under the simulator)


FLEETS = {
    "router": Fleet("router", 'replicas = 2\nrouter = { args = ["--policy", "round_robin"] }', "worker1", 2),
    "pd": Fleet("pd", "prefill = { replicas = 1 }\ndecode = { replicas = 1 }", "prefill0", 2),
}


# -- one inner pytest run ---------------------------------------------------------------------------------------

class LogWatch:
    """When a line matching `pattern` first appears in a member's log: the fault's moment (polled every 10 ms)."""

    def __init__(self, path: Path, pattern: str) -> None:
        self.path, self.rx = path, re.compile(pattern)
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                if self.rx.search(self.path.read_text(errors="replace")):
                    self.at = time.monotonic()
                    return
            time.sleep(0.01)

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join(timeout=2)
        return self.at


class Project:
    """One run's temp project, its TEST_MARK, its inner pytest."""

    def __init__(self, root: Path, fleet: Fleet) -> None:
        self.path, self.fleet, self.mark = root, fleet, uuid.uuid4().hex
        self.logs = root / "logs"

    def write(self, sim: str, tests: str) -> None:
        (self.path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n" +
                                                  profile_toml("f", self.mark, self.fleet.body, sim=sim))
        (self.path / "test_user.py").write_text(tests)

    def log(self, member: str) -> Path:
        return self.logs / f"f.{member}.log"

    def start(self, plain: bool = False) -> tuple[subprocess.Popen[str], Run]:
        """``plain``: pytest as a user types it (`-rEf` only: no -v, no report, no junit), whose tests follow
        each other with the least time between them."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "400",
               "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
        env.pop("PYTEST_ADDOPTS", None)
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rEf", "--sglang-sim", "--sglang-profile=f",
               f"--sglang-log-dir={self.logs}"]
        if not plain:
            cmd += ["-v", "-s", "--sglang-report=report.json", "--junitxml=junit.xml"]
        proc = subprocess.Popen(cmd, cwd=self.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        return proc, follow(proc)

    def finish(self, proc: subprocess.Popen[str], run: Run, timeout: float = 180) -> Run:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # a hang: the case says so (returncode None is shown as "hang")
            run.lines.append((time.monotonic(), f"(fleet_faults: pytest still running after {timeout:.0f} s: "
                                                "SIGKILLed)"))
            proc.kill()
            proc.wait()
            run.returncode, run.ended = None, time.monotonic()
        else:
            run.returncode, run.ended = proc.returncode, time.monotonic()
        if run.reader is not None:
            run.reader.join(timeout=10)
        (self.path / "out.txt").write_text(run.text + "\n")
        return run

    def wait_for_marked(self, count: int, proc: subprocess.Popen[str], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while len(marked_processes(self.mark)) < count:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the fleet's servers never started {count} processes")
            time.sleep(0.1)

    def junit(self) -> dict[str, tuple[str, str, float]]:
        """Each test's outcome ("passed", "failed", "error", "skipped"), first message line and duration."""
        out: dict[str, tuple[str, str, float]] = {}
        with contextlib.suppress(OSError, ET.ParseError):
            for case in ET.parse(self.path / "junit.xml").iter("testcase"):
                name = case.get("name", "").split("[")[0]
                outcome, message = "passed", ""
                for tag in ("failure", "error", "skipped"):
                    hit = case.find(tag)
                    if hit is not None:
                        outcome, message = tag.replace("failure", "failed"), hit.get("message") or ""
                        break
                out[name] = (outcome, message, float(case.get("time", "0")))
        return out

    def ports(self) -> dict[str, int]:
        """Every port a member bound, from its log (the members' logs are written by the simulator as SGLang's
        and the router's would be)."""
        found: dict[str, int] = {}
        for log in sorted(self.logs.glob("f.*.log")):
            member = log.name[2:-4]
            text = log.read_text(errors="replace")
            if member == "router":
                for label, rx in (("router", r"Starting server on [\d.]+:(\d+)"),
                                  ("router prometheus", r"Prometheus metrics exporter listening on [\d.]+:(\d+)")):
                    hit = re.search(rx, text)
                    if hit:
                        found[label] = int(hit.group(1))
                continue
            hit = re.search(r"server_args=ServerArgs\(.*?\bport=(\d+)", text)
            if hit:
                found[member] = int(hit.group(1))
            hit = re.search(r"CommonKVBootstrapServer started successfully on [\d.]+:(\d+)", text)
            if hit:
                found[f"{member} bootstrap"] = int(hit.group(1))
        return found


def port_held(port: int) -> str | None:
    """Who still listens on `port` (or why it cannot be bound), None when it is free."""
    with contextlib.suppress(psutil.Error):
        for conn in psutil.net_connections("inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                return f"LISTEN by pid {conn.pid}"
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            return f"bind: {exc.strerror}"
    return None


# -- what a case returns ------------------------------------------------------------------------------------------

@dataclass
class Measure:
    """One run of one case."""

    sees: str  # the first line of the error the user reads
    named: bool | None  # that line names the faulting member (None: not asked)
    seconds: float | None  # the case's main time
    ok: bool  # the expected outcome was seen
    returncode: int | None = None
    exit_s: float | None = None  # the signal cases: from the signal to pytest's exit
    root_cause: str = ""  # the first line under "Root cause from the server log:"
    summary: str = ""  # the plugin's line for the profile in the "sglang servers" summary
    note: str = ""
    next_failed: bool | None = None  # the mid-session kills: the test after the kill failed
    gone_s: float | None = None  # filled in by run_case
    left: list[str] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)


def clean(line: str) -> str:
    """A line as the user reads it, without pytest's `E   ` and the short summary's prefixes."""
    line = re.sub(r"^E\s+", "", line.strip().strip("=! "))
    line = re.sub(r"^(ERROR|FAILED) \S+ - ", "", line)
    return re.sub(r"^Failed: ", "", line)


def first_error(run: Run) -> str:
    """The first line of the first test's error or failure as shown in pytest's ERRORS/FAILURES section."""
    for i, (_, line) in enumerate(run.lines):
        if re.match(r"_{3,} (ERROR at setup of \S+|test_\S+) _{3,}", line):
            for _, body in run.lines[i + 1:]:
                if body.strip() and not body.startswith(("    ", "\t", "@", ">")) and not re.match(r"_{3,} ", body):
                    return clean(body)
                if re.match(r"E\s+\S", body):
                    return clean(body)
    return ""


def root_cause(run: Run) -> str:
    hit = [i for i, (_, line) in enumerate(run.lines) if "Root cause from the server log:" in line]
    if not hit:
        return ""
    for _, line in run.lines[hit[0] + 1:]:
        if line.strip():
            return clean(line)
    return ""


def summary_line(run: Run) -> str:
    hit = run.first(r"^f: ")
    return hit[1].strip() if hit else ""


# -- the cases ----------------------------------------------------------------------------------------------------

TWO_TESTS = "def test_first(sglang_server):\n    pass\n\ndef test_second(sglang_server):\n    pass\n"


def _startup_fault(p: Project, member: str, sim: str, marker: str) -> Measure:
    p.write(sim, TWO_TESTS)
    proc, run = p.start()
    watch = LogWatch(p.log(member), marker)
    p.finish(proc, run)
    fault_at = watch.stop()
    error = run.first(r"::test_first\S* ERROR|ERROR at setup of test_first")
    sees = first_error(run)
    outcomes = p.junit()
    ok = (run.returncode == 1 and [o[0] for o in outcomes.values()] == ["error", "error"] and bool(sees))
    return Measure(sees or run.text[-2000:], member in sees, None if error is None or fault_at is None
                   else error[0] - fault_at, ok, run.returncode, root_cause=root_cause(run),
                   summary=summary_line(run),
                   note="" if fault_at is not None else f"the fault's line /{marker}/ never appeared in the log")


def member_crash_startup(p: Project) -> Measure:
    member = p.fleet.member
    return _startup_fault(p, member, f'startup_seconds = 30, fault = "traceback", fault_after = '
                          f'{FAULT_AFTER_S}, fault_member = "{member}"', r"Scheduler hit an exception")


def member_exit_startup(p: Project) -> Measure:
    member = p.fleet.member
    return _startup_fault(p, member, f'startup_seconds = 30, fault = "exit", fault_after = {FAULT_AFTER_S}, '
                          f'fault_member = "{member}"', r"Scheduler hit an exception")


def router_panic_startup(p: Project) -> Measure:
    return _startup_fault(p, "router", f'startup_seconds = 0.6, fault = "traceback", fault_after = '
                          f'{ROUTER_FAULT_AFTER_S}, fault_member = "router"', r"panicked at")


KILLS = """
import os, signal, time

def test_1_kill(sglang_server):
    os.kill(sglang_server.members[MEMBER].pid, signal.SIGKILL)
    print("KILLED-AT", time.monotonic(), flush=True)

def test_2_after_the_kill(sglang_server):
    pass

def test_3_still_after(sglang_server):
    pass
"""


def _outcomes(p: Project, run: Run, names: list[str]) -> dict[str, tuple[str, str]]:
    """Each test's outcome and first message line: from the junit XML, or (a plain run) from `-rEf`'s short
    summary (a test not listed there passed, if the run finished)."""
    junit = p.junit()
    if junit:
        return {name: (junit[name][0], junit[name][1]) if name in junit else ("missing", "") for name in names}
    out = {}
    for name in names:
        hit = run.first(rf"^(FAILED|ERROR) \S+::{name}\b")
        out[name] = ((hit[1].split()[0].lower(), clean(hit[1])) if hit else
                     ("passed", "") if run.returncode in (0, 1) else ("missing", ""))
    return out


KILL_TESTS = ["test_1_kill", "test_2_after_the_kill", "test_3_still_after"]


def _killed_mid_session(p: Project, member: str, plain: bool = False) -> Measure:
    p.write("startup_seconds = 0.6", f"MEMBER = {member!r}\n" + KILLS)
    proc, run = p.start(plain=plain)
    p.finish(proc, run)
    killed = run.marker("KILLED-AT")
    got = _outcomes(p, run, KILL_TESTS)
    first, second, third = (got[name] for name in KILL_TESTS)
    failed = second[0] in ("failed", "error")
    shown = run.first(r"::test_2_after_the_kill\S* (FAILED|ERROR|PASSED)")
    sees = first_error(run) or second[1] or third[1]
    summary = summary_line(run)
    junit = p.junit().get("test_2_after_the_kill")
    note = (f"next test {second[0]}" + (f" in {junit[2]:.2f} s (junit)" if junit else "") +
            f", the one after {third[0]}" + (f" naming {member}" if member in third[1] else "") +
            f"; summary {'names the death' if 'DIED' in summary else 'says nothing of the death'}; "
            f"exit {run.returncode}")
    if plain:  # the race itself is the finding: the run counts as expected either way, the table says how often
        ok = first[0] == "passed" and run.returncode in (0, 1)
    else:
        ok = first[0] == "passed" and failed and third[0] in ("failed", "error") and run.returncode == 1
    return Measure(sees or "(no test failed)", member in sees and failed,
                   None if killed is None or shown is None else shown[0] - killed, ok, run.returncode,
                   summary=summary, note=note, next_failed=failed)


def member_killed(p: Project) -> Measure:
    return _killed_mid_session(p, p.fleet.member)


def router_killed(p: Project) -> Measure:
    return _killed_mid_session(p, "router")


def member_killed_plain(p: Project) -> Measure:
    return _killed_mid_session(p, p.fleet.member, plain=True)


def router_killed_plain(p: Project) -> Measure:
    return _killed_mid_session(p, "router", plain=True)


KILLS_LAST = """
import os, signal, time

def test_only(sglang_server):
    os.kill(sglang_server.members[MEMBER].pid, signal.SIGKILL)
    time.sleep(1.0)  # the member is certainly dead (and reaped, had anyone waited) before the test ends
"""


def member_killed_last(p: Project) -> Measure:
    """The member dies in the session's last test: no later test asks. Does the summary or the exit code say so?"""
    member = p.fleet.member
    p.write("startup_seconds = 0.6", f"MEMBER = {member!r}\n" + KILLS_LAST)
    proc, run = p.start()
    p.finish(proc, run)
    summary = summary_line(run)
    told = "DIED" in summary or member in run.text.split("sglang servers", 1)[-1]
    return Measure(summary or "(no summary line)", told, None, run.returncode in (0, 1), run.returncode,
                   summary=summary, note=f"exit {run.returncode}; the death is "
                                          f"{'reported' if told else 'NOT reported'} after the session")


def _during_long_startup(p: Project) -> tuple[subprocess.Popen[str], Run]:
    p.write("startup_seconds = 600", TWO_TESTS)
    proc, run = p.start()
    try:
        p.wait_for_marked(3 * p.fleet.servers, proc)  # every server member: launcher, scheduler, detokenizer
    except BaseException:
        proc.kill()
        p.finish(proc, run)
        raise
    time.sleep(0.5)
    return proc, run


def sigkill_startup(p: Project) -> Measure:
    proc, run = _during_long_startup(p)
    sent = time.monotonic()
    proc.kill()
    p.finish(proc, run, timeout=30)
    while marked_processes(p.mark) and time.monotonic() - sent < LEFT_WAIT_S:
        time.sleep(0.1)
    gone = time.monotonic() - sent
    return Measure("(nothing: pytest is killed)", None, gone if not marked_processes(p.mark) else None, True,
                   run.returncode, exit_s=run.ended - sent if run.ended else None)


def _interrupted(p: Project, proc: subprocess.Popen[str], run: Run, sees: str) -> Measure:
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the foreground group
    p.finish(proc, run, timeout=120)
    line = run.first(sees)
    shown = clean(line[1]) if line else ""
    ok = run.returncode == 2 and bool(shown)
    return Measure(shown or f"(expected /{sees}/ not seen)\n{run.text[-2000:]}", None,
                   run.ended - sent if run.ended and run.returncode is not None else None, ok, run.returncode,
                   exit_s=run.ended - sent if run.ended and run.returncode is not None else None,
                   summary=summary_line(run))


def ctrl_c_startup(p: Project) -> Measure:
    proc, run = _during_long_startup(p)
    return _interrupted(p, proc, run, r"^f: INTERRUPTED|KeyboardInterrupt|Interrupted")


SLEEPS = """
import time

def test_1(sglang_server):
    pass

def test_2_sleeps(sglang_server):
    print("SLEEPING", time.monotonic(), flush=True)
    time.sleep(600)
"""


def ctrl_c_session(p: Project) -> Measure:
    p.write("startup_seconds = 0.6", SLEEPS)
    proc, run = p.start()
    deadline = time.monotonic() + 90
    while run.marker("SLEEPING") is None:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            p.finish(proc, run)
            raise RuntimeError("the sleeping test never started:\n" + run.text[-2000:])
        time.sleep(0.05)
    time.sleep(0.5)
    return _interrupted(p, proc, run, r"KeyboardInterrupt")


@dataclass(frozen=True)
class Case:
    name: str
    scenario: str
    timed: str  # what the time column measures
    run: Callable[[Project], Measure]
    fleets: tuple[str, ...] = ("router", "pd")
    signal_case: bool = False  # members gone is timed from the signal
    race: bool = False  # run --race-repeats times: how often the next test fails is the measure


CASES = [
    Case("member-crash-startup", "a server member crashes at startup (fault traceback on the member, 2 s in)",
         "from the traceback in the member's log to pytest's ERROR line", member_crash_startup),
    Case("member-exit-startup", "a server member exits at startup (fault exit: traceback, SIGQUIT to its launcher)",
         "from the traceback in the member's log to pytest's ERROR line", member_exit_startup),
    Case("router-panic-startup", "the router panics at startup (fault traceback, fault_member router, 1 s in)",
         "from the panic in the router's log to pytest's ERROR line", router_panic_startup),
    Case("member-killed", "a server member SIGKILLed mid-session (a test os.kill()s members[M].pid)",
         "from the kill to the next test's FAILED line", member_killed),
    Case("router-killed", "the router SIGKILLed mid-session (a test os.kill()s members['router'].pid)",
         "from the kill to the next test's FAILED line", router_killed),
    Case("member-killed-plain", "the same kill, under plain `pytest -rEf` (no -v, report or junit: the next test "
         "starts sooner after the kill)", "not timed (no per-test lines)", member_killed_plain, race=True),
    Case("router-killed-plain", "the router's kill, under plain `pytest -rEf`", "not timed (no per-test lines)",
         router_killed_plain, race=True),
    Case("member-killed-last", "a server member SIGKILLed in the session's last test (it sleeps 1 s after the kill)",
         "not timed", member_killed_last, fleets=("router",)),
    Case("sigkill-startup", "pytest SIGKILLed during a 600 s fleet startup",
         "from the SIGKILL to the last member process gone", sigkill_startup, signal_case=True),
    Case("ctrl-c-startup", "Ctrl-C (SIGINT to pytest's process group) during a 600 s fleet startup",
         "from the SIGINT to pytest's exit", ctrl_c_startup, signal_case=True),
    Case("ctrl-c-session", "Ctrl-C mid-session (a test sleeps; SIGINT to pytest's process group)",
         "from the SIGINT to pytest's exit", ctrl_c_session, signal_case=True),
]


def run_case(case: Case, fleet: Fleet, keep: bool) -> Measure:
    root = Path(tempfile.mkdtemp(prefix=f"fleet-{case.name}-{fleet.name}-"))
    p = Project(root, fleet)
    started = time.monotonic()
    try:
        m = case.run(p)
    except Exception as exc:  # a case that could not run is a failed case, not a crashed script
        m = Measure(f"(the case could not run: {type(exc).__name__}: {exc})", None, None, False)
    # members gone: from the signal for the signal cases (already in m.seconds / measured again here), else from
    # pytest's exit (the moment the run ended, i.e. now)
    t0 = time.monotonic()
    while marked_processes(p.mark) and time.monotonic() - t0 < LEFT_WAIT_S:
        time.sleep(0.1)
    after_exit = time.monotonic() - t0
    if case.name == "sigkill-startup":
        m.gone_s = m.seconds
    elif case.signal_case and m.exit_s is not None:
        m.gone_s = m.exit_s + after_exit
    else:
        m.gone_s = after_exit
    for proc in marked_processes(p.mark):
        with contextlib.suppress(psutil.Error):
            m.left.append(f"pid {proc.pid} {' '.join(proc.cmdline())[:100]}")
            proc.kill()
    if m.left:
        m.gone_s = None
    logged = re.search(r"\(log: (\S+)\)$", m.summary)
    if logged and not Path(logged.group(1)).exists():
        m.note = (m.note + f"; the summary's log {Path(logged.group(1)).name} does not exist").lstrip("; ")
    with contextlib.suppress(OSError):
        m.ports = p.ports()
    m.held = {label: why for label, port in m.ports.items() if (why := port_held(port)) is not None}
    m.note = (m.note + f"; run wall {time.monotonic() - started:.1f} s").lstrip("; ")
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return m


# -- the table ----------------------------------------------------------------------------------------------------

def _cell(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _median(values: list[float | None]) -> str:
    got = sorted(v for v in values if v is not None)
    if not got:
        return "-"
    med = statistics.median(got)
    fmt = (lambda v: f"{v:.2f}") if med < 10 else (lambda v: f"{v:.1f}")
    text = f"{fmt(med)} s"
    if len(got) > 1:
        text += f" ({fmt(got[0])}..{fmt(got[-1])})"
    if len(got) < len(values):
        text += f", {len(values) - len(got)} of {len(values)} not measured"
    return text


@dataclass
class Row:
    case: Case
    fleet: Fleet
    runs: list[Measure]

    @property
    def ok(self) -> bool:
        return all(m.ok and not m.left and not m.held for m in self.runs)


def _yes(values: list[bool | None]) -> str:
    if all(v is None for v in values):
        return "-"
    return "yes" if all(values) else f"NO ({sum(1 for v in values if not v)} of {len(values)})"


def table(rows: list[Row]) -> str:
    out = ["| case | fleet | what the user sees (first line of the error) | member named | time (median, min..max) "
           "| exit code | members gone after | leftovers | ports free |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        first = r.runs[0]
        sees = _code(_cell(first.sees)) if first.ok else _cell(first.sees, 400)
        nexts = [m.next_failed for m in r.runs if m.next_failed is not None]
        if nexts:
            sees = f"next test failed in {sum(nexts)} of {len(r.runs)} runs; " + sees
        differs = {re.sub(r"\d+(\.\d+)?", "N", _cell(m.sees, 80)) for m in r.runs if m.ok}
        if len(differs) > 1:
            sees += f" ({len(differs)} different lines over the repeats, numbers aside)"
        codes = sorted({"hang" if m.returncode is None else str(m.returncode) for m in r.runs})
        left = sum(len(m.left) for m in r.runs)
        held = sorted({f"{label} {why}" for m in r.runs for label, why in m.held.items()})
        labels = sorted({label for m in r.runs for label in m.ports})
        ports = ("yes" if not held else "NO: " + "; ".join(held)) + (f" ({', '.join(labels)})" if labels else
                                                                      " (no port read)")
        verdict = "" if r.ok else " **(FAILED)**"
        out.append(f"| {r.case.name}{verdict} | {r.fleet.name} ({r.fleet.member}) | {sees} | "
                   f"{_yes([m.named for m in r.runs])} | {_median([m.seconds for m in r.runs])} | "
                   f"{'/'.join(codes)} | {_median([m.gone_s for m in r.runs])} | "
                   f"{left}{' (' + '; '.join(x for m in r.runs for x in m.left) + ')' if left else ''} | {ports} |")
    return "\n".join(out)


def details(rows: list[Row]) -> str:
    lines = []
    for r in rows:
        first = r.runs[0]
        parts = [f"time {r.case.timed}"]
        if first.root_cause:
            parts.append(f"root cause shown: {_code(_cell(first.root_cause, 160))}")
        if first.summary:
            parts.append(f"summary line (run 1): {_code(_cell(first.summary, 220))}")
        if r.case.signal_case and r.case.name != "sigkill-startup":
            parts.append(f"pytest exited {_median([m.exit_s for m in r.runs])} after the SIGINT")
        walls = [float(w) for m in r.runs for w in re.findall(r"run wall ([\d.]+) s", m.note)]
        notes: dict[str, int] = {}
        for m in r.runs:
            note = re.sub(r"(; )?run wall [\d.]+ s", "", m.note).strip("; ")
            note = re.sub(r" in [\d.]+ s \(junit\)", "", note)
            if note:
                notes[note] = notes.get(note, 0) + 1
        for note, count in notes.items():
            parts.append(f"{note} ({count} of {len(r.runs)} runs)")
        if walls:
            parts.append(f"each run's wall time about {statistics.median(walls):.0f} s")
        lines.append(f"- **{r.case.name}, {r.fleet.name}**: " + "; ".join(parts) + ".")
    return "\n".join(lines)


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} vCPUs ({cpu}), Linux {platform.release()}, Python {platform.python_version()}"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--fleet", choices=[*FLEETS, "all"], default="all", help="which fleet (default: both)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case and fleet (medians reported)")
    parser.add_argument("--race-repeats", type=int, default=10,
                        help="runs of the *-plain cases, whose next test fails or not by a race (default 10)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--out", type=Path, help=f"write the doc here (default with every case: {DOC})")
    parser.add_argument("--keep", action="store_true", help="keep each run's temp project")
    parser.add_argument("--json", type=Path,
                        help=f"also write every run's measures here (default with the doc: {RUNS})")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="write the doc again from a --json file, running nothing (the doc's text changed)")
    args = parser.parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        rows = [Row(by_case[r["case"]], FLEETS[r["fleet"]], [Measure(**m) for m in r["runs"]])
                for r in saved["rows"] for by_case in [{case.name: case for case in CASES}]]
        out = args.out or DOC
        out.write_text(document(rows, saved["wall"], saved["command"], saved["load_start"], saved["load_end"],
                                saved["date"], saved["rev"]))
        print(f"wrote {out}")
        return 0
    if args.list:
        for case in CASES:
            print(f"{case.name:22} {case.scenario}")
        return 0
    by_name = {case.name: case for case in CASES}
    unknown = [n for n in args.cases if n not in by_name]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    cases = [by_name[n] for n in args.cases] if args.cases else CASES
    fleets = list(FLEETS) if args.fleet == "all" else [args.fleet]
    out = args.out or (DOC if not args.cases and args.fleet == "all" else None)
    load_start = load()
    started = time.monotonic()
    rows = []
    for case in cases:
        for name in fleets:
            if name not in case.fleets:
                continue
            fleet = FLEETS[name]
            runs = []
            for i in range(args.race_repeats if case.race else args.repeats):
                m = run_case(case, fleet, args.keep)
                runs.append(m)
                status = "ok" if m.ok and not m.left and not m.held else "FAILED"
                print(f"{case.name:22} {name:6} #{i + 1} {status:6} "
                      f"{'-' if m.seconds is None else f'{m.seconds:6.2f} s'}  rc {m.returncode}  gone "
                      f"{'-' if m.gone_s is None else f'{m.gone_s:.2f} s'}  left {len(m.left)}  held "
                      f"{m.held or 0}  {_cell(m.sees, 150 if m.ok else 2000)}", flush=True)
            rows.append(Row(case, fleet, runs))
    wall = time.monotonic() - started
    print()
    print(table(rows))
    print()
    print(details(rows))
    command = " ".join(["python benchmarks/fleet_faults.py", f"--repeats {args.repeats}",
                        f"--race-repeats {args.race_repeats}",
                        *([f"--fleet {args.fleet}"] if args.fleet != "all" else []), *args.cases])
    date, rev, load_end = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"), revision(), load()
    saved = args.json or (RUNS if out is not None else None)
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps({"command": command, "wall": wall, "load_start": load_start, "load_end": load_end,
                                     "date": date, "rev": rev, "rows": [
                                         {"case": r.case.name, "fleet": r.fleet.name,
                                          "runs": [dataclasses.asdict(m) for m in r.runs]} for r in rows]}, indent=1))
        print(f"\nwrote {saved}")
    if out is not None:
        out.write_text(document(rows, wall, command, load_start, load_end, date, rev))
        print(f"wrote {out}")
    return 0 if all(r.ok for r in rows) else 1


def revision() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()


def document(rows: list[Row], wall: float, command: str, load_start: str, load_end: str, date: str,
             rev: str) -> str:
    ok = sum(r.ok for r in rows)
    return DOC_TEMPLATE.format(
        command=command, table=table(rows), details=details(rows),
        run_line=textwrap.fill(f"**Run**: {date}, on commit {rev}; wall time {wall / 60:.0f} min. "
                               f"{ok}/{len(rows)} rows "
                               "ran as designed, with nothing left and every port free (the -plain rows count either "
                               "outcome of the next test: how often it fails is their measure); the defects found are "
                               "under \"What the table found\".", 115),
        machine_line=textwrap.fill(f"**Machine**: {machine()}, a VM shared with other engineers' jobs: load "
                                   f"average (1/5/15 min) {load_start} at the start, {load_end} at the end. The times "
                                   "are on a loaded 2-vCPU machine: read them as \"about\".", 115),
        left_wait=f"{LEFT_WAIT_S:.0f}",
    )


DOC_TEMPLATE = """# A fleet's faults: what the user sees, how long, what is left

A fleet profile (issue 25) is several processes: SGLang workers (or prefill and decode servers) and a router in
front of them. Each row below is a fault that can hit one of them, or the pytest that owns them, run for real
through the plugin with the simulator playing every member (`--sglang-sim`; docs/sim-fleet.md). The router
fleet is `replicas = 2` (worker0, worker1, router), its faults on worker1; the PD fleet is one prefill and one
decode behind a `--pd-disaggregation` router (prefill0, decode0, router), its faults on prefill0 (which also holds
a KV bootstrap port). `benchmarks/fleet_faults.py` produced this page (how each case is built and timed: its
docstring). Re-run it with

    {command}

{run_line}

{machine_line}

Columns:

- **what the user sees**: the first line of the first test's error (pytest's `E   ` and `Failed: ` dropped), or
  the plugin's line for the interrupted cases, from the first repeat, cut at 200 characters;
- **member named**: the faulting member's name is in that line, in every repeat;
- **time**: per case (the notes below say from what to what), the median of the repeats with min..max;
- **exit code**: pytest's (1: tests failed or errored, 2: interrupted, -9: killed);
- **members gone after**: seconds until no member process is alive, from pytest's exit (from the signal, for
  the SIGKILL and Ctrl-C cases);
- **leftovers**: member processes (carrying the run's TEST_MARK) still alive {left_wait} s after pytest exited,
  summed over the repeats; the script kills and names any;
- **ports free**: every port a member bound (each server's HTTP port, a prefill's bootstrap port, the router's
  HTTP and Prometheus ports, read from the member logs) has no listener and can be bound once the members are
  gone; the labels say which were read (a router that never started bound nothing).

{table}

Notes, per row:

{details}

## What the table found

No case left a process behind or a port bound: 0 leftovers and every port free in every run. Every startup fault
names its member (or the router) in the test's error, with the root cause line from that member's log and `Full
log: .../f.MEMBER.log`. Defects, reported to the plugin's owner and not fixed here (this page only measures):

1. **The summary line and the JSON report name a log that does not exist when the fleet fails before its router
   started** (member-crash-startup, member-exit-startup, ctrl-c-startup; both fleets, every run): `f: FAILED TO
   START: AttributeError: ... (log: .../f.router.log)`, `f: INTERRUPTED during startup after 2.3 s; the server's
   process tree was killed (log: .../f.router.log)`; the JSON report's `profiles.f.log_path` is the same file. The
   router was never launched, so there is no such file; the summary line does not name the failed member either
   (the test's error does). The fleet's StartupRecord template (server/fleet.py `launch_fleet`) carries the
   router's log path into the members' stage.
2. **A member SIGKILLed just before the next test is not seen by that test's check** (the `-plain` rows): under
   plain `pytest -rEf` the next test passed in 3, 4, 4 and 4 runs of 10. Right after a SIGKILL the killed
   (multi-threaded) process is still exiting: `Popen.poll()` returns None for a few milliseconds (outside the
   plugin, 13 of 30 polls made right after a SIGKILL of a threaded Python child returned None; it was reaped 3 to 6
   ms later), and the member's scheduler and detokenizer live on until they read the end of their control pipe. The
   check before each test is one poll (`check_alive(wait=0)`). With `-v`, the JSON report and junit (the
   member-killed and router-killed rows) the tests start a little later and the next test failed in every run.
3. **A member's death that no later test's check sees is never reported** (member-killed-last: 3 of 3 runs; and the
   `-plain` runs where no test failed: 2 of 10 with worker1 killed, 2 of 10 with prefill0, 2 of 10 with the
   workers' fleet's router): the summary says `f: ready in 3.3 s [launch 2.5s | router 0.9s]`, the JSON report's
   `died` is null and pytest exits 0, though worker1 (or the router) was SIGKILLed during the session. Nothing
   checks the members' liveness at the session's teardown (for one server the same holds).
4. **One Ctrl-C mid-session took 32.3 s** (ctrl-c-session, workers' fleet, 1 run of 3; the other five runs took 0.9
   to 2.7 s): every member logged its shutdown in the second after the SIGINT (`Finished server process`, the
   router's `Received shutdown signal`), then pytest printed nothing more for 30 s, which is the default
   `shutdown_grace` before the SIGKILL. Which process outlived its SIGTERM was not recorded; 22 more Ctrl-C runs of
   the workers' fleet (two separate loops, sampling the members every 0.5 s from 3 s on) exited in 1.0 to 3.0 s. A
   plain `pytest` run of the member-killed test took 34 s once too, by hand, and was not investigated either.

Other readings:

- A member's crash at startup with its process still alive (fault traceback) is reported 1.5 to 2.0 s after the
  traceback's first line (medians 1.6 and 1.8 s), against 1.03 s for one server (benchmarks/RESULTS-readiness.md:
  the 1.0 s CRASH_SETTLE_SECONDS); the rest is stopping the other members (0.5 s grace each, in parallel) on a
  loaded machine. A member that exits (fault exit) is reported in 0.6 to 0.8 s, the router's panic in 0.6 to 1.4 s.
- A worker's SIGKILLed main process is described as `not knowable: detokenizer (pid N, exit code 0) and
  scheduler_TP0 (pid N, exit code 0) were noticed gone together ...; with it: the server's main process (pid N,
  killed by SIGKILL (exit code 137))`: the first words are the children's clean exits, the SIGKILL of the main
  process, which is the cause, comes last. The router's kill reads `killed by SIGKILL (exit code 137)` at once.
- SIGKILL of pytest during the startup: the reaper takes every member down in 0.6 to 0.8 s. Ctrl-C during the
  startup: pytest exits 1.4 to 5.3 s after the SIGINT (one server: 3.1 s in docs/reliability.md, with ranks deaf to
  SIGTERM there).

## What was not measured

- **Real members.** Every member here is the simulator (`pytest_sglang.sim`, `pytest_sglang.sim.router`): its
  processes (a launcher, a scheduler and a detokenizer per server) and its log lines imitate SGLang's and the
  sglang-router's, but a real worker's teardown (CUDA contexts, NCCL, a model in memory) and the Rust router's own
  signal handling are not here. Real SGLang members are measured by another engineer in docs/fleet-real.md.
- Faults on the other members (worker0, decode0), several members failing at once, a member that hangs at startup
  (fault `hang`: the startup timeout) and a router crash after N requests (`crash_after_requests` with
  fault_member router) are not in the table.
- The mid-session kills are SIGKILLs of the member's main process (its launcher); its scheduler and detokenizer
  then end on their own (end of file on their control pipe). A kill of the scheduler alone is not measured here.
- Ctrl-C is a SIGINT to pytest's process group, as a terminal sends it; the members run in their own sessions and
  do not get it. A second Ctrl-C during the teardown is not measured.
- Whether the router noticed a dead member (its health checks run every 60 s by default): the plugin watches each
  member's process itself, which is what the mid-session rows time.
"""


if __name__ == "__main__":
    sys.exit(main())
