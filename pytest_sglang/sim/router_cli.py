"""sglang-router as a Rust binary looks from outside: launch_router's flags (clap, and its usage error) and the
workers they name, tracing-subscriber's log lines, a panic's line and exit status."""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import urlsplit

from pytest_sglang.sim.config import Knobs
from pytest_sglang.sim.logfmt import STDERR, STDOUT, timestamp, write_raw

POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
DEFAULT_PROMETHEUS_PORT = 29000
STARTUP_CHECK_INTERVAL = 0.5  # seconds between /health polls of a worker that has not joined yet
PANIC_EXIT = 101  # a Rust panic's exit status
BACKTRACE_NOTE = "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace"


# -- the log ----------------------------------------------------------------------------------------------

class RustLog:
    """tracing-subscriber's lines on stdout: `YYYY-MM-DD HH:MM:SS  INFO sglang_router_rs::MOD: src/FILE:LINE: msg`;
    `silent` (the hang fault) drops every later line."""

    silent = False

    def line(self, level: str, module: str, where: str, msg: str) -> None:
        if not self.silent:
            write_raw(f"{timestamp()} {level:>5} sglang_router_rs::{module}: src/{where}: {msg}\n", STDOUT)

    def info(self, module: str, where: str, msg: str) -> None:
        self.line("INFO", module, where, msg)

    def warn(self, module: str, where: str, msg: str) -> None:
        self.line("WARN", module, where, msg)

    def error(self, module: str, where: str, msg: str) -> None:
        self.line("ERROR", module, where, msg)


def panic(where: str, msg: str, thread: str = "main") -> NoReturn:
    """A Rust panic: its line and the backtrace note on stderr, then the process exits 101."""
    write_raw(f"thread '{thread}' panicked at {where}: {msg}\n{BACKTRACE_NOTE}\n", STDERR)
    os._exit(PANIC_EXIT)


# -- flags ------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch_router", allow_abbrev=False)
    p.add_argument("--worker-urls", dest="worker_urls", nargs="+", default=[])
    p.add_argument("--pd-disaggregation", dest="pd_disaggregation", action="store_true")
    p.add_argument("--prefill", action="append", nargs="+", default=[], metavar=("URL", "BOOTSTRAP_PORT"))
    p.add_argument("--decode", action="append", default=[], metavar="URL")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--prometheus-host", dest="prometheus_host", default="0.0.0.0")
    p.add_argument("--prometheus-port", dest="prometheus_port", type=int, default=DEFAULT_PROMETHEUS_PORT)
    p.add_argument("--policy", choices=POLICIES, default="cache_aware")
    p.add_argument("--health-check-interval-secs", dest="health_check_interval_secs", type=float, default=60.0)
    p.add_argument("--health-failure-threshold", dest="health_failure_threshold", type=int, default=3)
    p.add_argument("--health-check-timeout-secs", dest="health_check_timeout_secs", type=float, default=5.0)
    p.add_argument("--worker-startup-check-interval", dest="worker_startup_check_interval", type=float,
                   default=STARTUP_CHECK_INTERVAL)
    return p


@dataclass
class Worker:
    url: str
    kind: str  # "regular", "prefill", "decode"
    bootstrap_port: int | None = None
    healthy: bool = False
    joined: bool = False  # healthy at least once
    failures: int = 0
    load: int = 0  # requests in flight through the router
    processed: int = 0
    id: str = field(default_factory=lambda: str(uuid.uuid4()))

    @property
    def hostport(self) -> tuple[str, int]:
        u = urlsplit(self.url)
        return (u.hostname or "127.0.0.1"), (u.port or (443 if u.scheme == "https" else 80))

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "url": self.url, "model_id": "unknown", "priority": 50, "cost": 1.0,
                             "worker_type": self.kind, "is_healthy": self.healthy, "load": self.load,
                             "connection_mode": "HTTP", "disable_health_check": False}
        if self.kind == "prefill":
            d["bootstrap_port"] = self.bootstrap_port
        return d


def clap_error(arg: str) -> None:
    write_raw(f"error: unexpected argument '{arg}' found\n\nUsage: launch_router [OPTIONS]\n\n"
              "For more information, try '--help'.\n", STDERR)
    sys.exit(2)


def parse_args(argv: list[str], knobs: Knobs) -> tuple[argparse.Namespace, list[Worker]]:
    parser = build_parser()
    ns, unknown = parser.parse_known_args(argv)
    if knobs.fault == "bad-flag":
        clap_error(unknown[0] if unknown else "--bad-flag")
    workers: list[Worker] = []
    if ns.pd_disaggregation:
        for values in ns.prefill:
            if len(values) > 2:
                parser.error(f"argument --prefill: expected URL [BOOTSTRAP_PORT], got {' '.join(values)}")
            port: int | None = None
            if len(values) == 2 and values[1].lower() not in ("none", "null"):
                try:
                    port = int(values[1])
                except ValueError:
                    parser.error(f"argument --prefill: invalid bootstrap port {values[1]!r}")
            workers.append(Worker(values[0].rstrip("/"), "prefill", port))
        workers += [Worker(url.rstrip("/"), "decode") for url in ns.decode]
        if not any(w.kind == "prefill" for w in workers) or not any(w.kind == "decode" for w in workers):
            parser.error("--pd-disaggregation needs at least one --prefill and one --decode")
    else:
        workers = [Worker(url.rstrip("/"), "regular") for url in ns.worker_urls]
    if ns.health_failure_threshold < 1:
        parser.error("--health-failure-threshold must be at least 1")
    return ns, workers
