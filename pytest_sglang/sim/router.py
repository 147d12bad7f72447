"""`python -m pytest_sglang.sim.router <launch_router flags>`: a stand-in for sglang-router 0.3.2's router.

It takes the flags of `python -m sglang_router.launch_router` (the ones below; any other flag is accepted and
ignored), binds the Prometheus exporter (--prometheus-host/--prometheus-port, default 0.0.0.0:29000) and then the
HTTP port, and logs the router's own lines in its Rust tracing format::

    2026-12-02 15:04:05  INFO sglang_router_rs::server: src/server.rs:1008: Router ready | workers: []

`Router ready | workers: []` comes before any worker joined (it is NOT readiness); then `Activated 1 worker(s)
(marked as healthy)` as each worker's (each prefill's and decode's) /health answers 200, and `Worker URL health
check failed N consecutive times, marking unhealthy` once --health-failure-threshold checks in a row failed.

Endpoints: /health and /liveness 200 always; /readiness 503 {"status": "not ready", "reason": "insufficient
healthy workers"} until every worker is healthy, then 200 {"status": "ready", "healthy_workers": N,
"total_workers": N}; /workers; /get_loads; /v1/models, /get_model_info, /model_info, /get_server_info,
/server_info from a healthy worker; /generate, /v1/completions, /v1/chat/completions forwarded to the worker the
policy picks, streamed answers passed through chunk by chunk. round_robin retries a request the chosen worker
refused on the next one; the other policies answer 500 call_upstream_request_error then; no healthy (or no
reachable) worker: 503 no_available_workers. With --pd-disaggregation a request goes to a decode member (its
answer is the client's) and at the same time, its output capped to 1 token and not streamed, to a prefill
member, both with the bootstrap fields the real router adds; no decode: 503 "No available decode workers", no
prefill: 503 "No available prefill workers". The Authorization header travels with every forwarded request.

Knobs (PYTEST_SGLANG_SIM, as for the server) apply when `fault_member` is null or equals this process's
PYTEST_SGLANG_SIM_MEMBER (the plugin names it "router"): fault "traceback" panics at fault_at seconds (a Rust
panic line, exit 101), "exit" exits 1 there, "hang" goes silent there and never activates a worker, "bad-flag"
is clap's usage error (exit 2); crash_after_requests N panics after the Nth forwarded request has been answered.
Until a fault's time the router activates no worker, so the fault always lands during its startup.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn
from urllib.parse import urlsplit

from pytest_sglang.sim.config import KnobError, Knobs, for_member, load_knobs
from pytest_sglang.sim.logfmt import STDERR, STDOUT, timestamp, write_raw

POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
DEFAULT_PROMETHEUS_PORT = 29000
STARTUP_CHECK_INTERVAL = 0.5  # seconds between /health polls of a worker that has not joined yet
GENERATE_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
INFO_PATHS = ("/v1/models", "/get_model_info", "/model_info", "/get_server_info", "/server_info")
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


# -- the router -------------------------------------------------------------------------------------------

class Refused(Exception):
    """No connection to the chosen worker."""


class RouterHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 1024
    router: SimRouter


class RouterHTTPServer6(RouterHTTPServer):
    address_family = socket.AF_INET6


def _server_class(host: str) -> type[RouterHTTPServer]:
    return RouterHTTPServer6 if ":" in host else RouterHTTPServer


@dataclass
class SimRouter:
    args: argparse.Namespace
    workers: list[Worker]
    knobs: Knobs
    log: RustLog = field(default_factory=RustLog)
    t0: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.gate = threading.Event()  # set: workers may join (at once, or never under a startup fault)
        self.rr: dict[str, int] = {}
        self.forwarded = 0
        self.retries = 0
        self.crashing = False
        self.requests_by_route: dict[str, int] = {}

    @property
    def pd(self) -> bool:
        return bool(self.args.pd_disaggregation)

    # -- launch -------------------------------------------------------------------------------------------
    def run(self) -> int:
        a = self.args
        mode = "PrefillDecode" if self.pd else "Regular"
        self.log.info("server", "server.rs:861", f"Starting router on {a.host}:{a.port} | mode: {mode} | "
                                                  f"policy: {a.policy} | workers: {len(self.workers)}")
        try:
            metrics = _server_class(a.prometheus_host)((a.prometheus_host, a.prometheus_port), MetricsHandler)
        except OSError as exc:
            panic("src/metrics.rs:469:10", "failed to install Prometheus metrics exporter: FailedToCreateHTTPListener("
                  f'"{exc.strerror} (os error {exc.errno})")')
        metrics.router = self
        threading.Thread(target=metrics.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        self.log.info("metrics", "metrics.rs:472",
                      f"Prometheus metrics exporter listening on {a.prometheus_host}:{a.prometheus_port}")
        try:
            httpd = _server_class(a.host)((a.host, a.port), RouterHandler)
        except OSError as exc:
            self.log.error("server", "server.rs:1020",
                           f"Failed to bind to {a.host}:{a.port}: {exc.strerror} (os error {exc.errno})")
            write_raw(f"Error: {exc.strerror} (os error {exc.errno})\n", STDERR)
            return 1
        httpd.router = self
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        self.log.info("server", "server.rs:957",
                      f"Started health checker for workers with {a.health_check_interval_secs:g}s interval")
        for w in self.workers:
            threading.Thread(target=self.watch, args=(w,), daemon=True).start()
        self.log.info("server", "server.rs:1008", "Router ready | workers: []")
        self.log.info("server", "server.rs:1037", f"Starting server on {a.host}:{a.port}")
        fault = self.knobs.fault
        if fault in ("traceback", "exit", "hang"):
            self.play_fault(fault)
        else:
            self.gate.set()
        while True:
            time.sleep(3600)

    def play_fault(self, fault: str) -> None:
        _sleep_until(self.t0 + self.knobs.fault_at)
        if fault == "traceback":
            panic("src/core/worker_manager.rs:412:18", "called `Result::unwrap()` on an `Err` value: "
                  "\"Failed to initialize workers: worker registration workflow failed\"")
        if fault == "exit":
            self.log.error("server", "server.rs:1012", "Failed to start router: worker registration failed")
            os._exit(1)
        self.log.silent = True  # "hang": no more lines, no worker ever joins

    def on_signal(self, signum: int, frame: object) -> None:
        self.log.info("server", "server.rs:1090", "Received shutdown signal, shutting down gracefully")
        os._exit(0)

    # -- health -------------------------------------------------------------------------------------------
    def watch(self, w: Worker) -> None:
        """One worker's health: polled every --worker-startup-check-interval until it first answers, then every
        --health-check-interval-secs; --health-failure-threshold failures in a row mark it unhealthy, the next
        success brings it back."""
        a = self.args
        self.gate.wait()
        while True:
            ok = self.probe(w)
            with self.lock:
                if ok:
                    w.failures = 0
                    if not w.healthy:
                        w.healthy = w.joined = True
                        self.log.info("core::steps::worker::shared::activate",
                                      "core/steps/worker/shared/activate.rs:31",
                                      "Activated 1 worker(s) (marked as healthy)")
                elif w.joined:
                    w.failures += 1
                    if w.healthy and w.failures >= a.health_failure_threshold:
                        w.healthy = False
                        self.log.warn("core::worker", "core/worker.rs:618",
                                      f"Worker {w.url} health check failed {w.failures} consecutive times, "
                                      "marking unhealthy")
            time.sleep(a.health_check_interval_secs if w.joined else a.worker_startup_check_interval)

    def probe(self, w: Worker) -> bool:
        host, port = w.hostport
        conn = http.client.HTTPConnection(host, port, timeout=self.args.health_check_timeout_secs)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def readiness(self) -> tuple[int, dict[str, Any]]:
        with self.lock:
            healthy = sum(w.healthy for w in self.workers)
            total = len(self.workers)
        if total and healthy == total:
            return 200, {"status": "ready", "healthy_workers": healthy, "total_workers": total}
        return 503, {"status": "not ready", "reason": "insufficient healthy workers"}

    # -- choosing ---------------------------------------------------------------------------------------------
    def candidates(self, kind: str, body: bytes) -> list[Worker]:
        """The healthy workers of a kind in the order the policy tries them: round_robin the next one and then the
        others (its retries); the other policies their one choice."""
        with self.lock:
            healthy = [w for w in self.workers if w.kind == kind and w.healthy]
            if not healthy:
                return []
            policy = self.args.policy
            if policy == "round_robin":
                i = self.rr.get(kind, 0) % len(healthy)
                self.rr[kind] = i + 1
                return healthy[i:] + healthy[:i]
            if policy == "random":
                return [random.choice(healthy)]
            if policy == "power_of_two":
                pair = random.sample(healthy, min(2, len(healthy)))
                return [min(pair, key=lambda w: w.load)]
            # cache_aware: the same prompt goes to the same worker (its prefix tree), whatever the load
            return [healthy[zlib.crc32(_prompt_key(body)) % len(healthy)]]

    def request_forwarded(self, path: str, w: Worker) -> None:
        n = self.knobs.crash_after_requests
        with self.lock:
            self.forwarded += 1
            w.processed += 1
            self.requests_by_route[path] = self.requests_by_route.get(path, 0) + 1
            if n is None or self.forwarded < n or self.crashing:
                return
            self.crashing = True
        panic("src/routers/http/router.rs:734:14", "called `Option::unwrap()` on a `None` value",
              thread="tokio-runtime-worker")

    def exposition(self) -> str:
        with self.lock:
            lines = ["# TYPE sgl_router_requests_total counter"]
            lines += [f'sgl_router_requests_total{{route="{r}"}} {n}'
                      for r, n in sorted(self.requests_by_route.items())]
            lines += ["# TYPE sgl_router_processed_requests_total counter"]
            lines += [f'sgl_router_processed_requests_total{{worker="{w.url}"}} {w.processed}' for w in self.workers]
            lines += ["# TYPE sgl_router_retries_total counter", f"sgl_router_retries_total {self.retries}",
                      "# TYPE sgl_router_active_workers gauge",
                      f"sgl_router_active_workers {sum(w.healthy for w in self.workers)}"]
        return "\n".join(lines) + "\n"


def _prompt_key(body: bytes) -> bytes:
    try:
        obj = json.loads(body or b"{}")
    except json.JSONDecodeError:
        return body
    if not isinstance(obj, dict):
        return body
    for name in ("text", "input_ids", "prompt", "messages"):
        if obj.get(name) is not None:
            return json.dumps(obj[name]).encode()
    return body


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)


def prefill_copy(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The request as the prefill member gets it: the same prompt, one output token, not streamed."""
    copy = dict(body)
    copy.pop("stream", None)
    copy.pop("stream_options", None)
    if path == "/generate":
        sp = copy.get("sampling_params")
        copy["sampling_params"] = {**(sp if isinstance(sp, dict) else {}), "max_new_tokens": 1}
    else:
        copy.pop("max_completion_tokens", None)
        copy["max_tokens"] = 1
    return copy


# -- HTTP ---------------------------------------------------------------------------------------------------

class MetricsHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RouterHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base class signature
        pass

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            data = b"Not Found"
            self.send_response(404)
        else:
            data = self.server.router.exposition().encode()
            self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class RouterHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: RouterHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base class signature
        pass

    @property
    def router(self) -> SimRouter:
        return self.server.router

    def send_json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(self, status: int, code: str, message: str) -> None:
        self.send_json(status, {"error": {"code": code, "message": message,
                                          "type": http.client.responses.get(status, "")}})

    def do_GET(self) -> None:
        self.dispatch("GET")

    def do_POST(self) -> None:
        self.dispatch("POST")

    def dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        r = self.router
        try:
            if path in ("/health", "/liveness") and method == "GET":
                self.send_text(200, "OK")
            elif path == "/readiness" and method == "GET":
                self.send_json(*r.readiness())
            elif path == "/workers" and method == "GET":
                with r.lock:
                    listed = [w.describe() for w in r.workers]
                kinds = [w["worker_type"] for w in listed]
                self.send_json(200, {"workers": listed, "total": len(listed), "stats": {
                    "regular_count": kinds.count("regular"), "prefill_count": kinds.count("prefill"),
                    "decode_count": kinds.count("decode")}})
            elif path == "/get_loads" and method == "GET":
                with r.lock:
                    loads = [{"worker": w.url, "worker_type": w.kind, "load": w.load} for w in r.workers]
                self.send_json(200, {"workers": loads})
            elif path in INFO_PATHS and method == "GET":
                self.forward_info(path)
            elif path in GENERATE_PATHS and method == "POST":
                refused = openai_body_refusal(path, body)
                if not (self.headers.get("Content-Type") or "").startswith("application/json"):
                    self.send_text(415, "Expected request with `Content-Type: application/json`")
                elif refused is not None:
                    self.send_text(422, refused)
                elif r.pd:
                    self.forward_pd(path, body)
                else:
                    self.forward(path, body)
            else:
                self.send_text(404, "")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- forwarding ---------------------------------------------------------------------------------------
    def upstream_headers(self, body: bytes) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        for name in ("Authorization", "Accept"):
            value = self.headers.get(name)
            if value:
                headers[name] = value
        return headers

    def open(self, w: Worker, method: str, path: str, body: bytes) -> http.client.HTTPConnection:
        """A connection with the request sent; Refused when the worker takes no connection."""
        host, port = w.hostport
        conn = http.client.HTTPConnection(host, port, timeout=600)
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise Refused(str(exc)) from exc
        conn.request(method, path, body=body or None, headers=self.upstream_headers(body))
        return conn

    def first_reachable(self, workers: list[Worker], method: str, path: str, body: bytes
                        ) -> tuple[Worker, http.client.HTTPConnection] | None:
        r = self.router
        for i, w in enumerate(workers):
            try:
                return w, self.open(w, method, path, body)
            except Refused:
                r.log.warn("routers::http::router", "routers/http/router.rs:612",
                           f"Failed to send typed request worker_url={w.url} error=error sending request")
                if i + 1 < len(workers):
                    with r.lock:
                        r.retries += 1
        return None

    def forward_info(self, path: str) -> None:
        r = self.router
        with r.lock:
            healthy = [w for w in r.workers if w.healthy]
        healthy.sort(key=lambda w: {"decode": 0, "regular": 0, "prefill": 1}[w.kind])
        got = self.first_reachable(healthy, "GET", path, b"")
        if got is None:
            self.send_error_json(503, "no_available_workers", "No available workers")
            return
        self.relay(got[1])

    def forward(self, path: str, body: bytes) -> None:
        r = self.router
        order = r.candidates("regular", body)
        if not order:
            self.send_error_json(503, "no_available_workers", "No available workers")
            return
        got = self.first_reachable(order, "POST", path, body)
        if got is None:
            if r.args.policy == "round_robin" or len(order) > 1:
                self.send_error_json(503, "no_available_workers", "No available workers")
            else:
                self.send_error_json(500, "call_upstream_request_error",
                                     f"Failed to send request to worker {order[0].url}: error sending request")
            return
        self.relay_counted(path, *got)

    def forward_pd(self, path: str, raw: bytes) -> None:
        r = self.router
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            self.send_error_json(400, "invalid_request", "the request body must be a JSON object")
            return
        decodes = r.candidates("decode", raw)
        if not decodes:
            self.send_error_json(503, "no_available_decode_workers", "No available decode workers")
            return
        prefills = r.candidates("prefill", raw)
        if not prefills:
            self.send_error_json(503, "no_available_prefill_workers", "No available prefill workers")
            return
        room = random.getrandbits(63)

        def with_bootstrap(obj: dict[str, Any], p: Worker) -> bytes:
            return json.dumps({**obj, "bootstrap_host": p.hostport[0], "bootstrap_port": p.bootstrap_port,
                               "bootstrap_room": room}).encode()

        got_p: tuple[Worker, http.client.HTTPConnection] | None = None
        for p in prefills:  # the prefill's copy first: it holds the KV the decode member waits for
            got_p = self.first_reachable([p], "POST", path, with_bootstrap(prefill_copy(path, body), p))
            if got_p is not None:
                break
        if got_p is None:
            self.send_error_json(503, "no_available_prefill_workers", "No available prefill workers")
            return
        prefill, pconn = got_p
        got_d = self.first_reachable(decodes, "POST", path, with_bootstrap(body, prefill))
        if got_d is None:
            pconn.close()
            self.send_error_json(503, "no_available_decode_workers", "No available decode workers")
            return
        done = threading.Thread(target=_drain, args=(pconn,), daemon=True)
        with r.lock:
            prefill.load += 1
        done.start()
        try:
            self.relay_counted(path, *got_d)
        finally:
            done.join()
            with r.lock:
                prefill.load -= 1
                prefill.processed += 1

    def relay_counted(self, path: str, w: Worker, conn: http.client.HTTPConnection) -> None:
        r = self.router
        with r.lock:
            w.load += 1
        try:
            self.relay(conn)
        finally:
            with r.lock:
                w.load -= 1
        r.request_forwarded(path, w)

    def relay(self, conn: http.client.HTTPConnection) -> None:
        """The worker's answer to the client: a sized body whole, a chunked one (a stream) chunk by chunk."""
        try:
            try:
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self.send_error_json(500, "call_upstream_request_error", f"upstream request failed: {exc}")
                return
            ctype = resp.getheader("Content-Type", "application/json")
            if resp.getheader("Content-Length") is not None:
                data = resp.read()
                self.send_response(resp.status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(resp.status)
            self.send_header("Content-Type", ctype)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for piece in _pieces(resp):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        finally:
            conn.close()


def _pieces(resp: http.client.HTTPResponse) -> Iterator[bytes]:
    while True:
        try:
            piece = resp.read1(65536)
        except (OSError, http.client.HTTPException):
            return
        if not piece:
            return
        yield piece


def _drain(conn: http.client.HTTPConnection) -> None:
    """Read the prefill member's answer to its copy of the request, and drop it."""
    try:
        conn.getresponse().read()
    except (OSError, http.client.HTTPException):
        pass
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        knobs = for_member(load_knobs())
    except KnobError as exc:
        print(f"pytest_sglang.sim.router: {exc}", file=sys.stderr, flush=True)
        return 2
    args, workers = parse_args(argv, knobs)
    return SimRouter(args, workers, knobs).run()


def openai_body_refusal(path: str, raw: bytes) -> str | None:
    """sglang-router 0.3.2 parses an OpenAI body into its own types before it forwards it: a completion whose
    prompt is token ids, or a body without "model", is answered 422 with these texts (docs/fleet-real.md);
    SGLang itself takes both, and /generate passes through as it is."""
    if not path.startswith("/v1/"):
        return None
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return "Failed to parse the request body as JSON"
    if not isinstance(body, dict):
        return None
    if "model" not in body:
        return "Failed to deserialize the JSON body into the target type: missing field `model`"
    prompt = body.get("prompt")
    if path == "/v1/completions" and isinstance(prompt, list) and prompt and not isinstance(prompt[0], str):
        return ("Failed to deserialize the JSON body into the target type: prompt: data did not match any variant "
                "of untagged enum StringOrArray")
    return None


if __name__ == "__main__":
    sys.exit(main())

