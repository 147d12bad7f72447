"""Replay a real server log through a real process.

    python -m pytest_sglang.sim.replay LOGFILE [--port N] [--host H] [--then serve|hang|exit:N|kill]
                                       [--lines-per-second R]

Writes the log's lines to stdout, flushed and paced (default 2000 lines/s; `\\r` inside a line stays in
it), then: `serve` answers GET /health (and /health_generate) with 200 on --host/--port (503 until the
last line is out; the server listens from the start) and stays alive; `hang` stays alive, silent;
`exit:N` exits with status N; `kill` SIGKILLs itself. Without --then: `serve` when the log contains
SGLang's ready line, else `hang`. SIGTERM and SIGINT end it with status 0. Unknown extra arguments are
ignored, so a launcher can append its usual --model-path/--host/--port flags.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

READY_LINE = b"The server is fired up and ready to roll!"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    ready = False


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base class signature
        pass

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            status = 200 if self.server.ready else 503
        else:
            status = 404
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


def _then(value: str) -> str:
    if value in ("serve", "hang", "kill") or (value.startswith("exit:") and value[5:].lstrip("-").isdigit()):
        return value
    raise argparse.ArgumentTypeError(f"expected serve, hang, exit:N or kill, got {value!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pytest_sglang.sim.replay", allow_abbrev=False)
    p.add_argument("logfile")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--then", type=_then, default=None)
    p.add_argument("--lines-per-second", type=float, default=2000.0)
    return p


def split_lines(data: bytes) -> list[bytes]:
    """Split on `\n` only, keeping it (a `\r` belongs to its tqdm line); a last line without one stays so."""
    parts = data.split(b"\n")
    out = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    args, _unknown = build_parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    with open(args.logfile, "rb") as f:
        data = f.read()
    then = args.then or ("serve" if READY_LINE in data else "hang")

    def stop(signum: int, frame: object) -> None:
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    server: _Server | None = None
    if then == "serve":
        cls = _Server6 if ":" in args.host else _Server
        server = cls((args.host, args.port), _Handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()

    interval = 1.0 / args.lines_per_second if args.lines_per_second > 0 else 0.0
    start = time.monotonic()
    for i, line in enumerate(split_lines(data)):
        if interval:
            left = start + i * interval - time.monotonic()
            if left > 0:
                time.sleep(left)
        _write(line)

    if then.startswith("exit:"):
        return int(then[5:])
    if then == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if server is not None:
        server.ready = True
    while True:
        time.sleep(3600)


def _write(data: bytes) -> None:
    try:
        while data:
            data = data[os.write(1, data):]
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
