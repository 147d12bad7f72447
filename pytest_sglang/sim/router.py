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
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from pytest_sglang.sim.config import KnobError, Knobs, for_member, load_knobs
from pytest_sglang.sim.logfmt import STDERR, write_raw
from pytest_sglang.sim.router_cli import (
    DEFAULT_PROMETHEUS_PORT,
    POLICIES,
    RustLog,
    Worker,
    build_parser,
    panic,
    parse_args,
)
from pytest_sglang.sim.router_http import (
    GENERATE_PATHS,
    INFO_PATHS,
    MetricsHandler,
    RouterHandler,
    openai_body_refusal,
    prefill_copy,
    server_class,
)

__all__ = ["DEFAULT_PROMETHEUS_PORT", "GENERATE_PATHS", "INFO_PATHS", "POLICIES", "SimRouter", "Worker",
           "build_parser", "main", "openai_body_refusal", "parse_args", "prefill_copy"]


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
            metrics = server_class(a.prometheus_host)((a.prometheus_host, a.prometheus_port), MetricsHandler)
        except OSError as exc:
            panic("src/metrics.rs:469:10", "failed to install Prometheus metrics exporter: FailedToCreateHTTPListener("
                  f'"{exc.strerror} (os error {exc.errno})")')
        metrics.router = self
        threading.Thread(target=metrics.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        self.log.info("metrics", "metrics.rs:472",
                      f"Prometheus metrics exporter listening on {a.prometheus_host}:{a.prometheus_port}")
        try:
            httpd = server_class(a.host)((a.host, a.port), RouterHandler)
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



def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        knobs = for_member(load_knobs())
    except KnobError as exc:
        print(f"pytest_sglang.sim.router: {exc}", file=sys.stderr, flush=True)
        return 2
    args, workers = parse_args(argv, knobs)
    return SimRouter(args, workers, knobs).run()



if __name__ == "__main__":
    sys.exit(main())

