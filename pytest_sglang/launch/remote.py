"""An ssh host as the place a server runs: the remote plan, the ssh connections, the tree's teardown there.

Pytest-free. Everything goes through the system's OpenSSH client, so the user's ~/.ssh/config, agent, jump
hosts and ControlMaster apply; a profile's ``ssh_options`` come first on its command line (ssh takes the first
value of each option, so they win over the defaults here: batch mode, keepalives, a connect timeout).

Two connections per server, each in its own local session (a terminal's Ctrl-C reaches pytest, which stops
the server in order, not the ssh clients):

    control  ``ssh HOST exec PYTHON -c BOOTSTRAP pytest-sglang supervise``: the agent (launch/agent/, sent
             over stdin with the spec: argv and environment as JSON, never through a shell) starts the server in
             its own session with its log on the host and an owner token in its environment, reports "started"
             and "exit" events on stdout, and tears the tree down on "stop", on end-of-file and on a missed
             heartbeat. Its stdin is a pipe from this process: if pytest is killed the pipe closes, and if the
             connection drops sshd closes it, so the remote side learns at once that its controller is gone; a
             connection that dies silently stops the heartbeat (sent every HEARTBEAT_SECONDS). The port
             forward (``-L``), where there is one, rides on this connection.
    stream   ``ssh HOST ... pytest-sglang stream``: the remote log from byte 0 (following a replaced or
             truncated file) into the local PROFILE.log, written by ssh itself. The local copy is what the
             log watcher reads, unchanged, and what CI keeps; it ends when the agent is gone and it is drained.

A benchmark's telemetry opens a third for its duration (remote_gpus.py, mode ``gpus``): the host's GPU readings.

Endpoint: ``host`` in the profile says where the server listens on the remote host. A loopback host (the
default) is reached through ``ssh -L`` from a free local port; any other address is reached directly (a
wildcard such as 0.0.0.0 at the address ssh connects to, from ``ssh -G``). ``base_url`` is what tests reach.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pytest_sglang.errors import RemoteError
from pytest_sglang.launch import agent
from pytest_sglang.launch.plan import REMOTE_PYTHON, SIM_ENVS, LaunchPlan, base_url
from pytest_sglang.launch.ports import free_port, url_host
from pytest_sglang.launch.ssh_errors import explain

SSH_DEFAULTS = ("-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=5",
                "-o", "ServerAliveCountMax=3", "-o", "ExitOnForwardFailure=yes")
BOOTSTRAP = "import json,sys;exec(json.loads(sys.stdin.buffer.readline()))"  # no quote, $ or \ in it
HEARTBEAT_SECONDS = 2.0
HEARTBEAT_TIMEOUT = 30.0
HANDSHAKE_SECONDS = 60.0  # connect (ConnectTimeout 15 s), log in, start python, spawn the server
DRAIN_SECONDS = 5.0  # after the server's exit, how long the log stream may take to deliver its last bytes
FORWARD_GRACE_SECONDS = 0.5  # the agent gone, how long the control client may wait on forwarded connections
STREAM_LAG_SECONDS = 2.0  # the stream may end a moment before the agent's exit event arrives
ONE_SHOT_SECONDS = 30.0
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD = frozenset({"0.0.0.0", "::"})
_NOISE = re.compile(r"^(channel \d+: open failed|connect_to |Warning: Permanently added)")


@dataclass(frozen=True)
class RemotePlan:
    """A launch plan as it runs on an ssh host: the server's own plan, and how to reach the host and it."""

    plan: LaunchPlan  # argv as it runs there (its python, its --host/--port); log_path is the local copy
    destination: str  # profile `ssh`
    ssh: tuple[str, ...]  # the client and its options, up to the destination
    python: str  # the host's interpreter: runs the agent (and, by default, the server)
    env: dict[str, str]  # what the server's environment adds there: the profile's env (and sim knobs)
    log_dir: str | None  # profile `remote_log_dir`; None: a folder under the host's temp dir
    reach_host: str  # what this machine connects to: the forward's local end, or the host's address
    reach_port: int
    forward: str | None  # the ``-L`` spec, or None for a direct connection

    @property
    def base_url(self) -> str:
        return base_url(self.reach_host, self.reach_port)

    def ssh_argv(self, mode: str, *extra: str) -> list[str]:
        """The ssh command that runs the agent in ``mode`` on the host (``extra``: more client options)."""
        remote = f"exec {shlex.quote(self.python)} -c {shlex.quote(BOOTSTRAP)} pytest-sglang {mode}"
        return [*self.ssh, *extra, "--", self.destination, remote]

    def display(self, remote_log: str) -> list[str]:
        """The server's launch as a user would type it (for error messages): ssh HOST 'env ... argv > log'."""
        env = [f"{k}={v}" for k, v in self.env.items() if k not in SIM_ENVS]
        line = shlex.join([*(["env", *env] if env else []), *self.plan.argv]) + f" > {shlex.quote(remote_log)} 2>&1"
        return [shlex.join(["ssh", *self.plan.profile.ssh_options, self.destination]), shlex.quote(line)]


def plan_remote(plan: LaunchPlan) -> RemotePlan:
    """Where and how a planned server runs on its profile's ssh host."""
    profile = plan.profile
    assert profile.ssh, "plan_remote needs an ssh profile"
    exe = shutil.which("ssh")
    if exe is None:
        raise RemoteError(f"[sglang {profile.name}] profile {profile.name!r} runs on {profile.ssh} over ssh, but "
                          "this machine has no ssh client on its PATH: install OpenSSH's client (openssh-client).")
    ssh = (exe, *profile.ssh_options, *SSH_DEFAULTS)
    env = profile.launch_env
    if plan.sim:
        env.update({name: plan.env[name] for name in SIM_ENVS if name in plan.env})
    forward, reach_host, reach_port = None, plan.host, plan.port
    if plan.host in LOOPBACK:
        reach_host, reach_port = "127.0.0.1", _free_port_besides(plan.port)
        forward = f"127.0.0.1:{reach_port}:{url_host(plan.host)}:{plan.port}"
    elif plan.host in WILDCARD:
        reach_host = _ssh_hostname(exe, profile.ssh_options, profile.ssh)
    return RemotePlan(plan=plan, destination=profile.ssh, ssh=ssh, python=profile.python or REMOTE_PYTHON, env=env,
                      log_dir=profile.remote_log_dir, reach_host=reach_host, reach_port=reach_port, forward=forward)


def _free_port_besides(port: int) -> int:
    """A free local port other than ``port`` (on a loopback test host the remote port is local too)."""
    while True:
        candidate = free_port("127.0.0.1")
        if candidate != port:
            return candidate


def _ssh_hostname(exe: str, options: tuple[str, ...], destination: str) -> str:
    """The address ssh connects to for ``destination`` (a Host alias resolved through ~/.ssh/config)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([exe, *options, "-G", "--", destination], capture_output=True, text=True, timeout=10,
                             check=False).stdout
        for line in out.splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname" and value.strip():
                return value.strip()
    return destination.rpartition("@")[2]


def agent_input(spec: dict[str, Any]) -> bytes:
    """What the agent reads on stdin: its own program (launch/agent/), then its spec."""
    return (agent.program() + json.dumps(spec) + "\n").encode()


def run_agent(rplan: RemotePlan, mode: str, spec: dict[str, Any]) -> dict[str, Any] | None:
    """One short agent run over a new connection (sweep, machine): its last event, or None if it failed."""
    try:
        out = subprocess.run(rplan.ssh_argv(mode), input=agent_input(spec), capture_output=True,
                             timeout=ONE_SHOT_SECONDS, check=False, start_new_session=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    events = [_event(line) for line in out.splitlines()]
    return next((e for e in reversed(events) if e), None)


def _event(line: bytes | str) -> dict[str, Any] | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) and "event" in data else None


@dataclass(eq=False)
class RemoteServer:
    """One server on an ssh host: its two connections, its events, and its teardown (a ProcessTree).

    ``pid`` is the server's pid on the host; ``poll()`` is its exit code once it exited there and the log
    stream delivered the rest of the log. A lost connection makes ``poll()`` raise ``on_lost(detail)``."""

    rplan: RemotePlan
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    pid: int = 0
    supervisor: int = 0  # the agent's pid on the host: the other connections' agents end when it is gone
    started_at: float = 0.0
    remote_log: str = ""  # its path on the host
    on_lost: Callable[[str], Exception] = field(default=RemoteError, repr=False)
    control: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    stream: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _events: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _exit_at: float | None = field(default=None, repr=False)
    _stream_ended_at: float | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _closed: threading.Event = field(default_factory=threading.Event, repr=False)
    _session_over: threading.Event = field(default_factory=threading.Event, repr=False)  # control's stdout ended
    _files: list[IO[bytes]] = field(default_factory=list, repr=False)

    @property
    def host(self) -> str:
        return self.rplan.destination

    @property
    def log_path(self) -> Path:
        """The local copy of the remote log."""
        return self.rplan.plan.log_path

    @property
    def ssh_log_path(self) -> Path:
        """The ssh clients' own messages (stderr), beside the local copy."""
        return self.log_path.with_suffix(".ssh.log")

    @property
    def where(self) -> str:
        """``host:path`` of the remote log."""
        return f"{self.host}:{self.remote_log}" if self.remote_log else self.host

    def start(self) -> None:
        """Connect, start the server on the host, and begin streaming its log; RemoteError if ssh or the host
        refuses (each refusal says what to do). Nothing is left on the host if this raises."""
        plan = self.rplan.plan
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_bytes(b"")  # a previous run's copy in a reused --sglang-log-dir has a ready line
        ssh_log = open(self.ssh_log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._files.append(ssh_log)
        forward = ("-L", self.rplan.forward) if self.rplan.forward else ()
        spec = {"token": self.token, "argv": plan.argv, "env": self.rplan.env, "log_dir": self.rplan.log_dir,
                "log_name": f"{plan.profile.name}-{time.strftime('%Y%m%d-%H%M%S')}-{self.token[:8]}.log",
                "check_host": plan.host, "check_port": plan.port, "heartbeat_timeout": self.heartbeat_timeout}
        self.control = subprocess.Popen(self.rplan.ssh_argv("supervise", *forward), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=ssh_log, start_new_session=True)
        threading.Thread(target=self._read_events, args=(self.control,), daemon=True).start()
        try:
            self._send(agent_input(spec))
            started = self._handshake()
            self.pid, self.remote_log, self.started_at = int(started["pid"]), str(started["log"]), time.monotonic()
            self.supervisor = int(started["agent"])
            copy = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            self._files.append(copy)
            self.stream = subprocess.Popen(self.rplan.ssh_argv("stream"), stdin=subprocess.PIPE, stdout=copy,
                                           stderr=ssh_log, start_new_session=True)
            assert self.stream.stdin is not None
            self.stream.stdin.write(agent_input({"log": self.remote_log, "supervisor": self.supervisor}))
            self.stream.stdin.flush()
        except BaseException:
            self.stop(grace=0.0)
            raise
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def poll(self) -> int | None:
        """The server's exit code once it exited (and its log arrived); None while it runs."""
        exited = self._events.get("exit")
        if exited is not None:  # once the local copy holds the whole log (or the stream gave up)
            copied = self.log_path.stat().st_size if self.log_path.exists() else 0
            streaming = self.stream is not None and self.stream.poll() is None
            if copied >= int(exited.get("size") or 0) or not streaming or \
                    time.monotonic() - (self._exit_at or 0.0) > DRAIN_SECONDS:
                code = exited.get("code")
                return int(code) if code is not None else -9
            return None
        if self.control is not None and self.control.poll() is not None:
            time.sleep(0.2)  # the reader may not have taken the agent's last line yet
            if "exit" in self._events:
                return self.poll()
            raise self.on_lost(f"the ssh session that runs it ended ({self._ssh_exit(self.control)}"
                               f"{self._ssh_said()})")
        if self.stream is not None and self.stream.poll() is not None:
            now = time.monotonic()
            self._stream_ended_at = self._stream_ended_at or now
            if now - self._stream_ended_at > STREAM_LAG_SECONDS:
                raise self.on_lost(f"the ssh session that streams its log ended ({self._ssh_exit(self.stream)}"
                                   f"{self._ssh_said()})")
        return None

    def stop(self, grace: float = 30.0) -> int | None:
        """SIGTERM the remote group, wait up to ``grace`` s, SIGKILL, sweep by owner token (all on the host,
        by the agent); if the agent cannot be told, a new connection sweeps; then close the local clients."""
        try:
            control = self.control
            if control is not None and control.poll() is None and "exit" not in self._events:
                with contextlib.suppress(OSError, ValueError):
                    self._send(f"stop {grace:g}\n".encode())
            deadline = time.monotonic() + grace + 10.0
            while control is not None and "swept" not in self._events and control.poll() is None and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            swept = self._events.get("swept")
            if self.pid and (swept is None or swept.get("left")):
                run_agent(self.rplan, "sweep", {"token": self.token})
        finally:
            self._close()
        exited = self._events.get("exit")
        return int(exited["code"]) if exited and exited.get("code") is not None else None

    # internals -------------------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        control = self.control
        assert control is not None and control.stdin is not None
        with self._lock:
            control.stdin.write(data)
            control.stdin.flush()

    def _read_events(self, control: subprocess.Popen[bytes]) -> None:
        assert control.stdout is not None
        with control.stdout:
            for line in iter(control.stdout.readline, b""):
                event = _event(line)
                if event is not None:
                    self._events.setdefault(event["event"], event)
                    if event["event"] == "exit":
                        self._exit_at = time.monotonic()
        self._session_over.set()

    def _handshake(self) -> dict[str, Any]:
        control = self.control
        assert control is not None
        deadline = time.monotonic() + HANDSHAKE_SECONDS
        while True:
            if "started" in self._events:
                return self._events["started"]
            if "error" in self._events:
                error = self._events["error"]
                raise self._refused((str(error.get("kind")), str(error.get("message"))), None)
            code = control.poll()
            if code is not None:
                time.sleep(0.1)  # its last event line may still be on its way
                if "started" in self._events or "error" in self._events:
                    continue
                raise self._refused(None, code)
            if time.monotonic() > deadline:
                raise self._refused(None, None)
            time.sleep(0.02)

    def _refused(self, said: tuple[str, str] | None, code: int | None) -> RemoteError:
        """The error of a launch that failed before the server started: the agent's refusal, or ssh's."""
        profile = self.rplan.plan.profile
        what, hint = explain(self.host, self.rplan.python, said, code, self._ssh_lines())
        lines = [f"cannot start the server of profile {profile.name!r} on {self.host} over ssh: {what}"]
        ssh_said = self._ssh_lines()[-6:] if said is None else []
        if ssh_said:
            lines += ["", "ssh said:", *("    " + line for line in ssh_said), ""]
        lines.append(f"ssh's messages: {self.ssh_log_path}")
        lines.append(f"Command: {shlex.join(['ssh', *profile.ssh_options, self.host])} 'exec "
                     f"{shlex.quote(self.rplan.python)} -c ... pytest-sglang supervise'")
        lines.append(f"Try: {hint}")
        return RemoteError("\n".join(lines))

    def _ssh_lines(self) -> list[str]:
        try:
            text = self.ssh_log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return [line.strip() for line in text.splitlines() if line.strip() and not _NOISE.match(line.strip())]

    def _ssh_said(self) -> str:
        said = self._ssh_lines()
        return f"; ssh said: {said[-1]}" if said else ""

    @staticmethod
    def _ssh_exit(proc: subprocess.Popen[bytes]) -> str:
        code = proc.returncode
        if code is not None and code < 0:
            import signal

            return f"its local ssh client was killed by {signal.Signals(-code).name}"
        return f"ssh exited with code {code}"

    def _heartbeat(self) -> None:
        while not self._closed.wait(HEARTBEAT_SECONDS):
            try:
                self._send(b"\n")
            except (OSError, ValueError):
                return

    def _close(self) -> None:
        self._closed.set()
        procs = [p for p in (self.control, self.stream) if p is not None]
        for proc in procs:
            with self._lock, contextlib.suppress(OSError, ValueError):
                if proc.stdin is not None:
                    proc.stdin.close()  # end-of-file: the agent tears down (if it still runs) and exits
        for proc in procs:
            wait = DRAIN_SECONDS
            if proc is self.control:
                # once its agent is gone, ssh waits on for any forwarded connection left open here (a keep-alive,
                # a test's own requests session) to a server that is no more: not for long
                self._session_over.wait(DRAIN_SECONDS)
                wait = FORWARD_GRACE_SECONDS
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for fh in self._files:
            fh.close()
        self._files.clear()
