"""Helpers for the simulator tests: a launched simulator (Sim) and an SSE reader."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sim:
    """One launched simulator: its Popen, its merged stdout+stderr log, and every process it ever had."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, port: int, launched: float) -> None:
        self.proc = proc
        self.log_path = log_path
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.launched = launched
        self.seen: dict[int, psutil.Process] = {}
        self.note_tree()

    def text(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", "replace")

    def lines(self) -> list[str]:
        return re.split(r"[\r\n]+", self.text())

    def wait_for(self, pattern: str, timeout: float = 10.0) -> float:
        """Seconds since launch at which the regex first matched the log (polled every 5 ms)."""
        rx = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.note_tree()
            if rx.search(self.text()):
                return time.monotonic() - self.launched
            time.sleep(0.005)
        raise AssertionError(f"{pattern!r} not in the log after {timeout} s:\n{self.text()[-3000:]}")

    def note_tree(self) -> list[psutil.Process]:
        """Remember every descendant seen so far, so teardown can kill even escaped ones."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for k in kids:
            self.seen.setdefault(k.pid, k)
        return kids

    def get(self, path: str, **kw: Any) -> requests.Response:
        return requests.get(self.base + path, timeout=30, **kw)

    def post(self, path: str, body: Any, **kw: Any) -> requests.Response:
        return requests.post(self.base + path, json=body, timeout=30, **kw)

    def wait_ready(self, timeout: float = 15.0) -> float:
        return self.wait_for(r"The server is fired up and ready to roll!", timeout)

    def kill_all(self) -> None:
        procs = [*self.seen.values()]
        try:
            procs.append(psutil.Process(self.proc.pid))
        except psutil.NoSuchProcess:
            pass
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=5)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def sse_events(resp: requests.Response) -> list[tuple[float, Any]]:
    """(arrival time, parsed data) per SSE event; "[DONE]" stays a string."""
    out: list[tuple[float, Any]] = []
    for raw in resp.iter_lines(chunk_size=None):
        if not raw:
            continue
        line = raw.decode()
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        out.append((time.monotonic(), data if data == "[DONE]" else json.loads(data)))
    return out


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
