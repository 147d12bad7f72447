"""The simulator's main process: SGLang's HTTP server and tokenizer manager, and the parent of the ranks.

Timeline (S = startup_seconds, all against the launch time, so the log keeps its pace on a slow machine):
`server_args=ServerArgs(...)` at once, then the children (worker.py) log the scheduler phases until they
report ready at about S minus the warmup time; then uvicorn's lines, a real warmup (GET /model_info and a
POST /generate of 8 tokens to this very server) and, at about S, `The server is fired up and ready to roll!`.
HTTP listens from the start: /health answers 503 until the server is ready, 200 after.
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
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from pytest_sglang.sim.config import KNOB_ENV, KnobError, Knobs, ServerArgs, load_knobs, parse_args
from pytest_sglang.sim.engine import (
    Engine,
    Pacing,
    count_prompt_tokens,
    detokenize,
    output_tokens,
    sleep_until,
)
from pytest_sglang.sim.logfmt import Logger, rank_prefix
from pytest_sglang.sim.metrics import Metrics, detokenize_any, tokenize

VERSION = "0.0.0-sim"
DEFAULT_MAX_TOKENS = 16
WARMUP_HEADER = "X-Sglang-Sim-Warmup"
FLUSH_BODY = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


class BadRequest(Exception):
    pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 1024
    sim: SimServer


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class SimServer:
    def __init__(self, args: ServerArgs, knobs: Knobs) -> None:
        self.args = args
        self.knobs = knobs
        self.log = Logger()
        self.rank0_log = Logger(rank_prefix(0, args.tp_size))
        self.t0 = time.monotonic()
        self.pacing = Pacing(
            decode_tok_s=knobs.decode_tok_s,
            ttft_s=knobs.ttft_ms / 1000.0,
            accept_length=knobs.accept_length if args.speculative else None,
            spec_speedup=knobs.spec_speedup,
        )
        self.engine = Engine(self.pacing, knobs.max_batch, jitter=knobs.jitter)
        self.metrics = Metrics(fmt=knobs.metrics_format, model=args.served_model_name, skew=knobs.metrics_skew)
        self.ready = threading.Event()
        self.http_up = False
        self.children: list[subprocess.Popen[bytes]] = []
        self.ranks: list[subprocess.Popen[bytes]] = []
        self.httpd: _HTTPServer | None = None
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
        self.spawn_children(ranks_end)
        self.wait_ranks_ready()
        self.log.uvicorn(f"Started server process [{os.getpid()}]")
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        url = f"http://{self.args.host}:{self.args.port}"
        self.log.uvicorn(f"Uvicorn running on {url} (Press CTRL+C to quit)")
        self.http_up = True
        sleep_until(self.t0 + S - warmup)
        self.warmup()
        self.ready.set()
        self.log.line("The server is fired up and ready to roll!")
        threading.Thread(target=self.decode_stats, daemon=True).start()
        while True:
            time.sleep(3600)

    def bind(self) -> None:
        cls = _HTTPServer6 if ":" in self.args.host else _HTTPServer
        self.httpd = cls((self.args.host, self.args.port), Handler)
        self.httpd.sim = self

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
        for rank in range(self.args.tp_size):
            r, w = os.pipe()
            cfg = dict(base, rank=rank, ready_fd=w)
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

    def prefill_line(self, n_prompt: int) -> None:
        self.rank0_log.line(
            f"Prefill batch. #new-seq: 1, #new-token: {n_prompt}, #cached-token: 0, token usage: 0.00, "
            f"#running-req: {self.engine.running}, #queue-req: {self.engine.queued}, "
        )

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


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _HTTPServer
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base class signature
        pass  # our own uvicorn-style access line is written in send_head()

    @property
    def sim(self) -> SimServer:
        return self.server.sim

    # -- plumbing -----------------------------------------------------------------------------------------
    def send_head(self, status: int, ctype: str, length: int | None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache")
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()
        if not self.sim.http_up:
            return  # uvicorn is not running yet in the real server: no access line before its startup lines
        phrase = self.responses.get(status, ("",))[0]
        self.sim.log.access(f"{self.client_address[0]}:{self.client_address[1]}", self.command,
                            self.path, status, phrase)

    def send_json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_head(status, "application/json", len(data))
        self.wfile.write(data)

    def send_text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_head(status, "text/plain; charset=utf-8", len(data))
        self.wfile.write(data)

    def sse(self, obj: Any) -> None:
        payload = b"data: " + (obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()) + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))

    def end_sse(self) -> None:
        self.sse("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            raise BadRequest(f"invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    @property
    def is_warmup(self) -> bool:
        return self.headers.get(WARMUP_HEADER) == "1"

    # -- dispatch -----------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self.dispatch("GET")

    def do_POST(self) -> None:
        self.dispatch("POST")

    def do_PUT(self) -> None:
        self.dispatch("PUT")

    def dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        try:
            body: dict[str, Any] = {}
            if method in ("POST", "PUT"):
                body = self.read_json()
            key = self.sim.args.api_key
            if key and not path.startswith(("/health", "/metrics")):
                if self.headers.get("Authorization") != f"Bearer {key}":
                    self.send_json(401, {"error": "Unauthorized"})
                    return
            route = ROUTES.get((method, path)) or (ROUTES.get(("POST", path)) if method == "PUT" else None)
            if route is None:
                self.send_json(404 if not any(p == path for _, p in ROUTES) else 405,
                               {"detail": "Not Found" if not any(p == path for _, p in ROUTES)
                                else "Method Not Allowed"})
                return
            route(self, body)
        except BadRequest as exc:
            self.send_json(400, {"object": "error", "message": str(exc), "type": "BadRequest", "param": None,
                                 "code": 400})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- simple endpoints ---------------------------------------------------------------------------------
    def health(self, body: dict[str, Any]) -> None:
        self.send_text(200 if self.sim.ready.is_set() else 503, "")

    def health_generate(self, body: dict[str, Any]) -> None:
        if not self.sim.ready.is_set():
            self.send_text(503, "")
            return
        for _ in self.sim.engine.stream(output_tokens([0], 1)):
            pass
        self.send_text(200, "")

    def model_info(self, body: dict[str, Any]) -> None:
        self.send_json(200, self.sim.model_info())

    def server_info(self, body: dict[str, Any]) -> None:
        self.send_json(200, self.sim.server_info())

    def flush_cache(self, body: dict[str, Any]) -> None:
        self.send_text(200, FLUSH_BODY)

    def metrics(self, body: dict[str, Any]) -> None:
        """Prometheus text: SGLang's only under --enable-metrics (404 otherwise), vLLM's always."""
        if self.sim.knobs.metrics_format == "sglang" and not self.sim.args.enable_metrics:
            self.send_json(404, {"detail": "Not Found"})
            return
        self.send_text(200, self.sim.metrics.exposition())

    def tokenize(self, body: dict[str, Any]) -> None:
        """SGLang's and vLLM's shape: {"tokens", "count", "max_model_len"}."""
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string")
        ids = tokenize(prompt, self.sim.knobs.vocab_size)
        self.send_json(200, {"tokens": ids, "count": len(ids), "max_model_len": self.sim.args.context_length})

    def detokenize(self, body: dict[str, Any]) -> None:
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise BadRequest("tokens must be a list of integers")
        self.send_json(200, {"text": detokenize_any(tokens)})

    def models(self, body: dict[str, Any]) -> None:
        a = self.sim.args
        self.send_json(200, {"object": "list", "data": [{
            "id": a.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
            "root": a.model_path, "max_model_len": a.context_length}]})

    # -- generation ---------------------------------------------------------------------------------------
    def generate_one(self, prompt: object, n: int) -> tuple[list[int], float, int]:
        """Run one non-streamed request to its end: (output ids, e2e seconds, verify steps)."""
        start = time.monotonic()
        tokens = self.outputs(prompt, n)
        self.sim.prefill_line(count_prompt_tokens(prompt))
        steps = 0
        times = []
        for ids, _last in self.sim.engine.stream(tokens):
            steps += 1
            times.append(time.monotonic())
            self.sim.tokens_out += len(ids)
        self.finished(prompt, len(tokens), steps, start, times)
        return tokens, time.monotonic() - start, steps

    def outputs(self, prompt: object, n: int) -> list[int]:
        """The greedy output; token ids the model lacks are answered 400, as vLLM answers them."""
        if isinstance(prompt, list):
            bad = [t for t in prompt if isinstance(t, int) and not 0 <= t < self.sim.knobs.vocab_size]
            if bad:
                raise BadRequest(f"Token id {bad[0]} is out of vocabulary")
        return output_tokens(prompt, n, self.sim.knobs.output_variant)

    def finished(self, prompt: object, n_out: int, steps: int, start: float, times: list[float]) -> None:
        """Count a finished request in /metrics (times: when each chunk left)."""
        self.sim.metrics.finished(
            prompt_tokens=count_prompt_tokens(prompt), generation_tokens=n_out,
            verify_steps=steps if self.sim.args.speculative else None,
            ttft=times[0] - start if times else None, itls=[b - a for a, b in zip(times, times[1:], strict=False)],
            e2e=time.monotonic() - start)

    def meta(self, rid: str, prompt: object, out: list[int], n: int, steps: int,
             e2e: float | None) -> dict[str, Any]:
        m: dict[str, Any] = {
            "id": rid,
            "finish_reason": {"type": "length", "length": n} if e2e is not None else None,
            "prompt_tokens": count_prompt_tokens(prompt),
            "weight_version": "default",
            "completion_tokens": len(out),
            "cached_tokens": 0,
        }
        if e2e is not None:
            m["e2e_latency"] = e2e
        if self.sim.args.speculative:
            m["spec_verify_ct"] = steps
            m["spec_accept_length"] = len(out) / steps if steps else 0.0
        return m

    def generate(self, body: dict[str, Any]) -> None:
        prompt = body.get("input_ids") if body.get("input_ids") is not None else body.get("text")
        if prompt is None:
            raise BadRequest("Either text or input_ids should be provided.")
        sp = body.get("sampling_params") or {}
        if isinstance(sp, list):
            sp = sp[0] if sp else {}
        n = _int(sp.get("max_new_tokens", DEFAULT_MAX_TOKENS), "max_new_tokens")
        batch = _is_batch(prompt)
        if body.get("stream"):
            if batch:
                raise BadRequest("the simulator streams single requests only")
            self.generate_stream(prompt, n)
        elif batch:
            assert isinstance(prompt, list)
            for p in prompt:
                self.outputs(p, 0)  # every prompt's ids checked before any runs
            results: list[Any] = [None] * len(prompt)

            def one(i: int, p: object) -> None:
                out, e2e, steps = self.generate_one(p, n)
                results[i] = {"text": detokenize(out), "output_ids": out,
                              "meta_info": self.meta(uuid.uuid4().hex, p, out, n, steps, e2e)}

            threads = [threading.Thread(target=one, args=(i, p), daemon=True) for i, p in enumerate(prompt)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.send_json(200, results)
        else:
            out, e2e, steps = self.generate_one(prompt, n)
            self.send_json(200, {"text": detokenize(out), "output_ids": out,
                                 "meta_info": self.meta(uuid.uuid4().hex, prompt, out, n, steps, e2e)})
        self.sim.request_done(self.is_warmup)

    def generate_stream(self, prompt: object, n: int) -> None:
        rid = uuid.uuid4().hex
        start = time.monotonic()
        tokens = self.outputs(prompt, n)
        self.sim.prefill_line(count_prompt_tokens(prompt))
        self.send_head(200, "text/event-stream", None)
        out: list[int] = []
        steps = 0
        times: list[float] = []
        gen = self.sim.engine.stream(tokens)
        try:
            for ids, last in gen:
                out += ids
                steps += 1
                times.append(time.monotonic())
                self.sim.tokens_out += len(ids)
                if last:
                    self.finished(prompt, len(out), steps, start, times)
                self.sse({"text": detokenize(out), "output_ids": ids,
                          "meta_info": self.meta(rid, prompt, out, n, steps,
                                                 time.monotonic() - start if last else None)})
            self.end_sse()
        finally:
            gen.close()

    def completions(self, body: dict[str, Any]) -> None:
        self.openai(body, chat=False)

    def chat_completions(self, body: dict[str, Any]) -> None:
        self.openai(body, chat=True)

    def openai(self, body: dict[str, Any], *, chat: bool) -> None:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages must be a non-empty list")
            prompts: list[object] = [[_message_text(m) for m in messages]]
        else:
            prompt = body.get("prompt")
            if prompt is None:
                raise BadRequest("prompt is required")
            prompts = list(prompt) if _is_batch(prompt) else [prompt]
        n = _int(body.get("max_tokens", body.get("max_completion_tokens")) or DEFAULT_MAX_TOKENS,
                 "max_tokens")
        model = self.sim.args.served_model_name
        created = int(time.time())
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion" if chat else "text_completion"
        n_prompt = sum(count_prompt_tokens(p) for p in prompts)
        if body.get("stream"):
            if len(prompts) != 1:
                raise BadRequest("the simulator streams single prompts only")
            self.openai_stream(prompts[0], n, chat=chat, cid=cid, created=created, model=model,
                               include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
                               spec_details=bool(body.get("return_spec_tokens_details")))
        else:
            choices = []
            total_out = 0
            for i, p in enumerate(prompts):
                out, _e2e, _steps = self.generate_one(p, n)
                total_out += len(out)
                text = detokenize(out)
                if chat:
                    choices.append({"index": i, "message": {"role": "assistant", "content": text,
                                                            "reasoning_content": None, "tool_calls": None},
                                    "logprobs": None, "finish_reason": "length", "matched_stop": None})
                else:
                    choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": "length",
                                    "matched_stop": None})
            self.send_json(200, {"id": cid, "object": obj, "created": created, "model": model,
                                 "choices": choices, "usage": _usage(n_prompt, total_out)})
        self.sim.request_done(self.is_warmup)

    def openai_stream(self, prompt: object, n: int, *, chat: bool, cid: str, created: int, model: str,
                      include_usage: bool, spec_details: bool = False) -> None:
        start = time.monotonic()
        tokens = self.outputs(prompt, n)
        n_prompt = count_prompt_tokens(prompt)
        self.sim.prefill_line(n_prompt)
        self.send_head(200, "text/event-stream", None)
        obj = "chat.completion.chunk" if chat else "text_completion"
        first = True
        sent = 0
        steps = 0
        times: list[float] = []
        gen = self.sim.engine.stream(tokens)
        try:
            for ids, last in gen:
                sent += len(ids)
                steps += 1
                times.append(time.monotonic())
                self.sim.tokens_out += len(ids)
                if last:
                    self.finished(prompt, sent, steps, start, times)
                text = detokenize(ids)
                finish = "length" if last else None
                if chat:
                    delta: dict[str, Any] = {"content": text}
                    if first:
                        delta = {"role": "assistant", "content": text}
                    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                              "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
                if finish:
                    choice["matched_stop"] = None
                first = False
                self.sse({"id": cid, "object": obj, "created": created, "model": model, "choices": [choice],
                          "usage": None})
            if spec_details and self.sim.args.speculative:  # SGLang's sglext chunk, at response level
                self.sse({"id": cid, "object": obj, "created": created, "model": model, "choices": [],
                          "sglext": {"spec_tokens_details": {"spec_verify_ct": steps,
                                                             "spec_accept_length": sent / steps if steps else 0.0}}})
            if include_usage:
                self.sse({"id": cid, "object": obj, "created": created, "model": model, "choices": [],
                          "usage": _usage(n_prompt, sent)})
            self.end_sse()
        finally:
            gen.close()


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise BadRequest(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _is_batch(prompt: object) -> bool:
    """A list of strings or of id lists is a batch; a flat list of ints is one prompt of token ids."""
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(p, (str, list)) for p in prompt)


def _message_text(message: object) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


ROUTES: dict[tuple[str, str], Any] = {
    ("GET", "/health"): Handler.health,
    ("GET", "/health_generate"): Handler.health_generate,
    ("GET", "/model_info"): Handler.model_info,
    ("GET", "/get_model_info"): Handler.model_info,
    ("GET", "/server_info"): Handler.server_info,
    ("GET", "/get_server_info"): Handler.server_info,
    ("GET", "/flush_cache"): Handler.flush_cache,
    ("POST", "/flush_cache"): Handler.flush_cache,
    ("GET", "/v1/models"): Handler.models,
    ("GET", "/metrics"): Handler.metrics,
    ("POST", "/tokenize"): Handler.tokenize,
    ("POST", "/v1/tokenize"): Handler.tokenize,
    ("POST", "/detokenize"): Handler.detokenize,
    ("POST", "/v1/detokenize"): Handler.detokenize,
    ("POST", "/generate"): Handler.generate,
    ("POST", "/v1/completions"): Handler.completions,
    ("POST", "/v1/chat/completions"): Handler.chat_completions,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        knobs = load_knobs()
    except KnobError as exc:
        print(f"pytest_sglang.sim: {exc}", file=sys.stderr, flush=True)
        return 2
    args = parse_args(argv, knobs)
    return SimServer(args, knobs).run()
