"""The simulator's main process: SGLang's HTTP server and tokenizer manager, and the parent of the ranks.

Timeline (S = startup_seconds, all against the launch time, so the log keeps its pace on a slow machine):
`server_args=ServerArgs(...)` at once, then the children (worker.py) log the scheduler phases until they
report ready at about S minus the warmup time; then uvicorn's lines, a real warmup (GET /model_info and a
POST /generate of 8 tokens to this very server) and, at about S, `The server is fired up and ready to roll!`.
HTTP listens from the start: /health answers 503 until the server is ready, 200 after. The endpoints are in
handler.py.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from http.server import ThreadingHTTPServer
from types import FrameType
from typing import Any

from pytest_sglang.sim.config import KNOB_ENV, KnobError, Knobs, ServerArgs, for_member, load_knobs, parse_args
from pytest_sglang.sim.drift import INSTANCE_ENV, HostSpeed, RunError, SimRun
from pytest_sglang.sim.engine import (
    Engine,
    Pacing,
    count_prompt_tokens,
    sleep_until,
)
from pytest_sglang.sim.handler import VERSION, WARMUP_HEADER, Handler
from pytest_sglang.sim.logfmt import Logger, rank_prefix
from pytest_sglang.sim.metrics import Metrics, tokenize
from pytest_sglang.sim.nodes import join_nodes, start_bootstrap_server
from pytest_sglang.sim.prefix import PrefixCache
from pytest_sglang.sim.trace import RequestTrace


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 1024
    sim: SimServer
    share_port = False  # the reuse_port knob: SO_REUSEPORT, several simulators splitting one port's connections

    def process_request(self, request: Any, client_address: Any) -> None:
        if self.sim.trace is not None:  # the connection's accept time, for its first request's trace line
            self.sim.trace.accepted(client_address)
        super().process_request(request, client_address)

    def server_bind(self) -> None:
        if self.share_port:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


class SimHTTPServer6(SimHTTPServer):
    address_family = socket.AF_INET6


class SimServer:
    def __init__(self, args: ServerArgs, knobs: Knobs, run: SimRun) -> None:
        self.args = args
        if (knobs.fault_node or 0) != args.node_rank:  # the fault belongs to another node
            knobs = replace(knobs, fault=None, crash_after_requests=None)
        self.knobs = knobs
        self.peers: list[socket.socket] = []  # rank 0: the other nodes' connections; a node >= 1: its own
        self.log = Logger()
        self.rank0_log = Logger(rank_prefix(0, args.tp_size))
        self.t0 = time.monotonic()
        self.pacing = Pacing(
            decode_tok_s=knobs.decode_tok_s,
            ttft_s=knobs.ttft_ms / 1000.0,
            accept_length=knobs.accept_length if args.speculative else None,
            spec_speedup=knobs.spec_speedup,
            stream_interval=args.stream_interval,
        )
        self.host_speed = HostSpeed(run, knobs.session_drift, knobs.wander, knobs.instance_drift,
                                    os.environ.get(INSTANCE_ENV))
        self.engine = Engine(self.pacing, knobs.max_batch, jitter=knobs.jitter, host_speed=self.host_speed.factor)
        self.metrics = Metrics(fmt=knobs.metrics_format, model=args.served_model_name, skew=knobs.metrics_skew,
                               load=lambda: (self.engine.running, self.engine.queued), max_batch=knobs.max_batch)
        self.trace = RequestTrace(knobs.request_trace) if knobs.request_trace else None
        self.prefix = PrefixCache()
        self.ready = threading.Event()
        self.http_up = False
        self.children: list[subprocess.Popen[bytes]] = []
        self.ranks: list[subprocess.Popen[bytes]] = []
        self.httpd: SimHTTPServer | None = None
        self.bootstrap: socket.socket | None = None  # a prefill member's KV bootstrap listener
        self._count_lock = threading.Lock()
        self.completed = 0
        self.tokens_out = 0
        self.crashing = False
        self.shutting_down = False

    # -- launch -------------------------------------------------------------------------------------------
    def run(self) -> int:
        S = self.knobs.startup_seconds
        warmup = self.pacing.ttft_s + 7 / self.pacing.pace + 0.05
        ranks_end = max(0.5 * S, S - warmup - 0.03 * S)
        self.log.line(f"server_args={self.args.repr_line()}")
        if self.host_speed.drifts:
            self.log.line(f"sim host speed: session factor {self.host_speed.session:.4f} "
                          f"(session_drift {self.knobs.session_drift}, wander {self.knobs.wander} per minute, "
                          f"seed {self.host_speed.run.seed})")
        if self.knobs.instance_drift:
            self.log.line(f"sim host speed: instance factor {self.host_speed.instance:.4f} "
                          f"(instance_drift {self.knobs.instance_drift}, instance {os.environ.get(INSTANCE_ENV)})")
        try:
            self.bind()
        except OSError as exc:
            self.log.line(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                          f"({self.args.host!r}, {self.args.port}): {exc.strerror}")
            return 1
        signal.signal(signal.SIGTERM, self.on_shutdown_signal)
        signal.signal(signal.SIGINT, self.on_shutdown_signal)
        signal.signal(signal.SIGQUIT, self.on_sigquit)
        assert self.httpd is not None
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        if self.args.disaggregation_mode == "prefill" and not self.start_bootstrap_server():
            return 1
        if self.args.nnodes > 1:
            try:
                self.join_nodes()
            except OSError as exc:
                self.log.line(f"RuntimeError: dist init at {self.args.dist_init_addr} failed: {exc}")
                return 1
            self.t0 = time.monotonic()  # the load starts once every node has joined
        self.spawn_children(ranks_end)
        self.wait_ranks_ready()
        if self.args.node_rank > 0:  # SGLang's ranks >= 1: a health server only, no banner, no warmup
            self.ready.set()
            while True:
                time.sleep(3600)
        self.log.uvicorn(f"Started server process [{os.getpid()}]")
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        url = f"http://{self.args.host}:{self.args.port}"
        self.log.uvicorn(f"Uvicorn running on {url} (Press CTRL+C to quit)")
        self.http_up = True
        sleep_until(self.t0 + S - warmup)
        if self.args.disaggregated:
            self.log.line("Start of pd disaggregation warmup ...")
        self.warmup()
        if self.args.disaggregated:
            self.log.line("End of disaggregation warmup")
        self.ready.set()
        self.log.line("The server is fired up and ready to roll!")
        threading.Thread(target=self.decode_stats, daemon=True).start()
        while True:
            time.sleep(3600)

    def bind(self) -> None:
        cls = SimHTTPServer6 if ":" in self.args.host else SimHTTPServer
        cls.share_port = self.knobs.reuse_port
        self.httpd = cls((self.args.host, self.args.port), Handler)
        self.httpd.sim = self

    def start_bootstrap_server(self) -> bool:
        self.bootstrap = start_bootstrap_server(self.args.host, self.args.disaggregation_bootstrap_port, self.log)
        return self.bootstrap is not None

    def join_nodes(self) -> None:
        join_nodes(self.args, self.knobs, self.log, self.peers)

    def spawn_children(self, ranks_end: float) -> None:
        base = {
            "server_args": self.args.as_dict(),
            "knobs": json.loads(self.knobs.to_json()),
            "t0": self.t0,
            "ranks_end": ranks_end,
            "fault_at": self.knobs.fault_at,
            "parent_pid": os.getpid(),
        }
        env = dict(os.environ)
        env.pop(KNOB_ENV, None)
        cmd = [sys.executable, "-m", "pytest_sglang.sim.worker"]
        detok = subprocess.Popen([*cmd, "detokenizer", json.dumps(base)], stdin=subprocess.PIPE, env=env)
        self.children.append(detok)
        self.ready_fds: list[int] = []
        local = self.args.local_tp
        first = self.args.node_rank * local
        for rank in range(first, first + local):
            r, w = os.pipe()
            cfg = dict(base, rank=rank, ready_fd=w, fault_rank=first + min(1, local - 1))
            proc = subprocess.Popen([*cmd, f"scheduler_TP{rank}", json.dumps(cfg)], stdin=subprocess.PIPE,
                                    env=env, pass_fds=(w,))
            os.close(w)
            self.ready_fds.append(r)
            self.ranks.append(proc)
            self.children.append(proc)

    def wait_ranks_ready(self) -> None:
        """Block until every rank says ready. A rank that dies first leaves the parent waiting forever and
        silent, as SGLang's parent often does after a scheduler dies without SIGQUIT."""
        pending = set(self.ready_fds)
        ready = 0
        while ready < len(self.ready_fds):
            if not pending:
                time.sleep(3600)
                continue
            rl, _, _ = select.select(list(pending), [], [], 0.5)
            for fd in rl:
                data = os.read(fd, 64)
                pending.discard(fd)
                os.close(fd)
                if data.startswith(b"ready"):
                    ready += 1

    def warmup(self) -> None:
        host = self.args.host
        if host in ("0.0.0.0", "", "::"):
            host = "127.0.0.1"
        headers = {WARMUP_HEADER: "1", "Content-Type": "application/json"}
        if self.args.api_key:
            headers["Authorization"] = f"Bearer {self.args.api_key}"
        try:
            conn = http.client.HTTPConnection(host, self.args.port, timeout=600)
            conn.request("GET", "/model_info", headers=headers)
            conn.getresponse().read()
            body = json.dumps({"text": "The capital city of France is",
                               "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
            conn.request("POST", "/generate", body=body, headers=headers)
            conn.getresponse().read()
            conn.close()
        except OSError as exc:  # SGLang would fail here; the simulator only reports it
            self.log.line(f"Warmup request failed: {exc!r}")

    # -- signals and shutdown -----------------------------------------------------------------------------
    def on_shutdown_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.shutting_down:  # `timeout` and Ctrl-C deliver the signal twice (to the pid and the group)
            return
        self.shutting_down = True
        if self.http_up:
            self.log.uvicorn("Shutting down")
            self.log.uvicorn("Waiting for application shutdown.")
            self.log.uvicorn("Application shutdown complete.")
            self.log.uvicorn(f"Finished server process [{os.getpid()}]")
        for child in self.children:
            try:
                child.terminate()
            except OSError:
                pass
        if not self.knobs.ignore_sigterm:
            deadline = time.monotonic() + 3.0
            for child in self.children:
                try:
                    child.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
        os._exit(0)

    def on_sigquit(self, signum: int, frame: FrameType | None) -> None:
        self.log.line("Received sigquit from a child process. It usually means the child failed.")
        self.kill_tree()

    def kill_tree(self) -> None:
        """SGLang's kill_process_tree(os.getpid()): SIGKILL every child, then itself."""
        for child in self.children:
            try:
                child.kill()
            except OSError:
                pass
        os.kill(os.getpid(), signal.SIGKILL)

    # -- requests -----------------------------------------------------------------------------------------
    def request_done(self, warmup: bool) -> None:
        n = self.knobs.crash_after_requests
        if warmup or n is None:
            return
        with self._count_lock:
            self.completed += 1
            if self.completed < n or self.crashing:
                return
            self.crashing = True
        threading.Thread(target=self.crash_now, daemon=True).start()

    def crash_now(self) -> None:
        """The mid-session scheduler crash: the rank prints its traceback and sends SIGQUIT to us."""
        rank = self.ranks[1 if len(self.ranks) > 1 else 0]
        try:
            assert rank.stdin is not None
            rank.stdin.write(b"crash\n")
            rank.stdin.flush()
        except (OSError, AssertionError):
            pass
        time.sleep(5.0)  # the rank should have signalled by now; if not, die the same way regardless
        self.on_sigquit(signal.SIGQUIT, None)

    def prefill(self, prompt: object) -> int:
        """A request's prefill: its tokens looked up in (and then kept by) the prefix cache, SGLang's log line;
        returns how many came from the cache."""
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            texts = prompt if isinstance(prompt, list) else [prompt]
            ids = tokenize(" ".join(t for t in texts if isinstance(t, str)), self.knobs.vocab_size)
        cached = self.prefix.serve(ids)
        self.rank0_log.line(
            f"Prefill batch. #new-seq: 1, #new-token: {count_prompt_tokens(prompt) - cached}, "
            f"#cached-token: {cached}, token usage: 0.00, "
            f"#running-req: {self.engine.running}, #queue-req: {self.engine.queued}, "
        )
        return cached

    def flush_when_idle(self, wait: float) -> bool:
        """Empty the prefix cache once no request runs or waits, waiting up to ``wait`` seconds for that."""
        deadline = time.monotonic() + wait
        while self.engine.running or self.engine.queued:
            if time.monotonic() >= deadline:
                self.rank0_log.line(f"Cache not flushed because there are pending requests. #queue-req: "
                                    f"{self.engine.queued}, #running-req: {self.engine.running}")
                return False
            time.sleep(0.01)
        self.prefix.clear()
        self.rank0_log.line("Cache flushed successfully!")
        return True

    def decode_stats(self) -> None:
        """SGLang's periodic `Decode batch.` line, every 2 s while requests run."""
        last_tokens, last_t = self.tokens_out, time.monotonic()
        while True:
            time.sleep(2.0)
            now, tokens = time.monotonic(), self.tokens_out
            if self.engine.running:
                accept = f"accept len: {self.knobs.accept_length:.2f}, " if self.args.speculative else ""
                rate = (tokens - last_tokens) / (now - last_t)
                self.rank0_log.line(
                    f"Decode batch. #running-req: {self.engine.running}, #token: {tokens}, "
                    "token usage: 0.00, "
                    f"{accept}cuda graph: True, gen throughput (token/s): {rate:.2f}, "
                    f"#queue-req: {self.engine.queued}, "
                )
            last_tokens, last_t = tokens, now

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "served_model_name": self.args.served_model_name,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
        }

    def server_info(self) -> dict[str, Any]:
        state: dict[str, Any] = {"last_gen_throughput": 0.0, "load": self.engine.running}
        if self.args.speculative:
            state["avg_spec_accept_length"] = self.knobs.accept_length
        return {
            **self.args.as_dict(),
            "max_total_num_tokens": 834615,
            "max_req_input_len": self.args.context_length - 1,
            "max_running_requests": self.knobs.max_batch,
            "internal_states": [state],
            "version": VERSION,
        }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        knobs = for_member(load_knobs())
        run = SimRun.from_env()
    except (KnobError, RunError) as exc:
        print(f"pytest_sglang.sim: {exc}", file=sys.stderr, flush=True)
        return 2
    args = parse_args(argv, knobs)
    try:
        server = SimServer(args, knobs, run)
    except OSError as exc:
        print(f"pytest_sglang.sim: request_trace: cannot write {knobs.request_trace!r} ({exc.strerror}): "
              "give a path in a writable folder", file=sys.stderr, flush=True)
        return 2
    return server.run()
