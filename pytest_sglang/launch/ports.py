"""Ports: pick a free one, refuse one that is busy (never mistake a stale server for ours), wait for release."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path

import psutil
from filelock import FileLock

from pytest_sglang.errors import PortInUseError
from pytest_sglang.launch.logdir import private_dir, state_dir

RECENT_PICK_SECONDS = 120.0  # a port handed out this recently is not handed out again, by any pytest here


def free_port(host: str) -> int:
    """A free port no other pytest-sglang process on this machine was given in the last RECENT_PICK_SECONDS.

    Choosing a free port and releasing it before the server binds it races (vllm#43206): two xdist workers,
    or two profiles, can be handed the same one. Picks go through one file lock and a list of recent picks."""
    folder = private_dir(state_dir(), ours=True)
    with FileLock(str(folder / "ports.lock")):
        recent = _recent_picks(folder / "ports.json")
        for _ in range(50):
            port = _bind_free(host)
            if port not in recent:
                break
        recent[port] = time.time()
        (folder / "ports.json").write_text(json.dumps({str(k): v for k, v in recent.items()}), encoding="utf-8")
    return port


def _bind_free(host: str) -> int:
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _recent_picks(path: Path) -> dict[int, float]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    now = time.time()
    return {int(k): float(v) for k, v in data.items() if now - float(v) < RECENT_PICK_SECONDS}


def port_is_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def check_port_free(host: str, port: int, health_path: str | None) -> None:
    """Refuse to launch onto a port something already listens on: never mistake a stale server for ours."""
    if not port_is_open(host, port):
        return
    owner = _port_owner(port)
    answer = _probe_http(host, port, health_path or "/health")
    what = f"a server answers on it ({answer})" if answer else "something listens on it"
    raise PortInUseError(
        f"Port {host}:{port} is busy: {what}{owner}. It may be a stale server from an earlier run. "
        f"Stop it, leave `port` out of the profile so a free port is chosen, or use --sglang-url="
        f"http://{host}:{port} to test that server instead."
    )


def listeners(port: int) -> list[psutil.Process]:
    """The processes listening on a TCP port, where this user may see them (empty when none can be seen)."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                with contextlib.suppress(psutil.Error):
                    found.setdefault(conn.pid, psutil.Process(conn.pid))
    return list(found.values())


def _port_owner(port: int) -> str:
    for proc in listeners(port):
        with contextlib.suppress(psutil.Error):
            return f"; held by pid {proc.pid} ({' '.join(proc.cmdline()[:6])})"
    return ""


def _probe_http(host: str, port: int, path: str) -> str | None:
    import requests

    try:
        resp = requests.get(f"http://{url_host(host)}:{port}{path}", timeout=1.0)
    except requests.RequestException:
        return None
    return f"GET {path} -> HTTP {resp.status_code}"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
