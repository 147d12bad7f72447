"""The agent's hold on the server's tree on the ssh host (shipped there: see the package's docstring).

Modes:
    supervise  start the server in its own session (setsid) with its log in a file and an owner token in its
               environment; print events as JSON lines ("started", "error", "exit", "swept"); tear the tree down
               (SIGTERM the group, grace, SIGKILL, sweep by owner token) on "stop GRACE", on end-of-file
               (the controller or its connection is gone), on a missed heartbeat (a silent dead connection),
               or on SIGTERM/SIGHUP/SIGINT. Leftovers of a server that exited by itself are swept the same way.
    stream     copy the log to stdout from byte 0, following it (and its replacement or truncation), until
               the supervisor is gone or stdin ends, and the log is drained.
    sweep      kill every process carrying an owner token (the controller's last net, over a new connection).
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

OWNER_ENV = "PYTEST_SGLANG_OWNER"  # the same name as launch/process.py's (the agent cannot import it there)
EOF_GRACE = 5.0  # the controller is gone: the grace the local reaper gives too
EXITED_GRACE = 1.0  # the server exited by itself: what it left behind gets little politeness
POLL = 0.1


def emit(event: str, **facts: Any) -> None:
    """One event line for the controller; a controller that is gone makes this a no-op."""
    try:
        sys.stdout.write(json.dumps({"event": event, **facts}) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def owned(token: str) -> list[int]:
    """Pids of live processes whose environment carries the owner token (Linux /proc; [] elsewhere)."""
    needle = f"{OWNER_ENV}={token}".encode()
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0") and not _zombie(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def _signal(pids: list[int], group: int | None, sig: int) -> None:
    if group is not None:
        try:
            os.killpg(group, sig)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def kill_tree(group: int | None, token: str, grace: float, server: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the server first (it stops its own children in order: see process.kill_tree), then, once it
    has gone or half the grace is spent, the group and every token holder; wait up to `grace`, then SIGKILL,
    and sweep again."""
    deadline = time.monotonic() + grace
    if server is not None and server.poll() is None:
        server.terminate()
        while server.poll() is None and time.monotonic() < deadline - grace / 2:
            time.sleep(POLL)
    _signal(owned(token), group, signal.SIGTERM)
    while time.monotonic() < deadline:
        if server is not None:
            server.poll()
        if not owned(token) and (server is None or server.returncode is not None):
            break
        time.sleep(POLL)
    for _ in range(3):  # a descendant may have spawned more during the grace: look again
        _signal(owned(token), group, signal.SIGKILL)
        if server is not None:
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        time.sleep(POLL)
        if not owned(token):
            return


def _lines(stream: Any, out: queue.Queue[bytes | None]) -> None:
    for line in iter(stream.readline, b""):
        out.put(line)
    out.put(None)


def _launch(spec: dict[str, Any]) -> tuple[subprocess.Popen[bytes], str] | int:
    """The server started in its own session, its log in a file: it and the log's path, or the exit code
    after an "error" event (its port taken here, no log, no executable)."""
    log_dir = os.path.expanduser(spec.get("log_dir") or os.path.join(tempfile.gettempdir(),
                                                                     f"pytest-sglang-{os.getuid()}", "remote"))
    log_path = os.path.join(log_dir, spec["log_name"])
    host, port = str(spec.get("check_host") or "127.0.0.1"), spec.get("check_port")
    if port:  # refuse a taken port here, where the server would bind it (as a server does: SO_REUSEADDR)
        try:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, int(port)))
        except OSError as exc:
            emit("error", kind="port", message=f"port {port} on {host} is taken there ({exc.strerror})")
            return 3
    try:
        os.makedirs(log_dir, mode=0o700, exist_ok=True)
        log = open(log_path, "wb")  # noqa: SIM115 - the server holds it; closed below
    except OSError as exc:
        emit("error", kind="log", message=f"cannot write the log {log_path}: {exc.strerror}")
        return 3
    env = {**os.environ, **spec["env"], OWNER_ENV: spec["token"], "PYTHONUNBUFFERED": "1"}
    try:
        server = subprocess.Popen(spec["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  env=env, start_new_session=True, close_fds=True)
    except OSError as exc:
        emit("error", kind="exec", message=f"cannot run {spec['argv'][0]}: {exc.strerror}", log=log_path)
        return 3
    finally:
        log.close()
    return server, log_path


def supervise(spec: dict[str, Any]) -> int:
    token, grace_eof = spec["token"], float(spec.get("eof_grace", EOF_GRACE))
    launched = _launch(spec)
    if isinstance(launched, int):
        return launched
    server, log_path = launched
    stop: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        stop.append(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    emit("started", pid=server.pid, agent=os.getpid(), log=log_path)
    inbox: queue.Queue[bytes | None] = queue.Queue()
    threading.Thread(target=_lines, args=(sys.stdin.buffer, inbox), daemon=True).start()
    heartbeat_timeout = float(spec.get("heartbeat_timeout") or 0) or None
    last_heard = time.monotonic()
    while True:
        try:
            line = inbox.get(timeout=POLL)
        except queue.Empty:
            line = b""
        else:
            last_heard = time.monotonic()
        reason, grace = None, grace_eof
        if line is None:
            reason = "the controller's connection ended"
        elif line.startswith(b"stop"):
            reason, grace = "stopped by the controller", float(line.split()[1])
        elif stop:
            reason = f"the agent got {stop[0]}"
        elif heartbeat_timeout and time.monotonic() - last_heard > heartbeat_timeout:
            reason = f"no heartbeat from the controller for {heartbeat_timeout:g} s"
        elif server.poll() is not None:
            reason, grace = "the server exited", EXITED_GRACE
        if reason is not None:
            if server.poll() is not None:  # said at once: the exit code is the news, the sweep comes after
                emit("exit", code=server.returncode, reason=reason, size=_size(log_path))
                kill_tree(server.pid, token, grace, server)
            else:
                kill_tree(server.pid, token, grace, server)
                emit("exit", code=server.returncode, reason=reason, size=_size(log_path))
            emit("swept", left=len(owned(token)))
            return 0


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return not _zombie(pid)


def stream(spec: dict[str, Any]) -> int:
    path, supervisor = spec["log"], int(spec["supervisor"])
    out = sys.stdout.buffer
    fh, identity, pos = None, None, 0
    while True:
        readable, _, _ = select.select([0], [], [], POLL)
        ended = bool(readable) and not os.read(0, 4096)  # the controller is done, or gone
        done = ended or not alive(supervisor)  # read once more after this: what it wrote last is there now
        try:
            st = os.stat(path)
            if fh is None or (st.st_dev, st.st_ino) != identity or st.st_size < pos:
                if fh is not None:
                    fh.close()
                fh, identity, pos = open(path, "rb"), (st.st_dev, st.st_ino), 0  # noqa: SIM115
        except OSError:
            pass  # not there (yet, or while it is replaced)
        while fh is not None:
            data = fh.read(1 << 20)
            if not data:
                break
            pos += len(data)
            try:
                out.write(data)
                out.flush()
            except OSError:
                return 0
        if done:
            return 0


def sweep(spec: dict[str, Any]) -> int:
    kill_tree(None, spec["token"], float(spec.get("grace", 0.0)))
    emit("swept", left=len(owned(spec["token"])))
    return 0


