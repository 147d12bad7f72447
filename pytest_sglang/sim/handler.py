"""The simulator's HTTP endpoints: SGLang's native API, the OpenAI API, /metrics, as SGLang answers them."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from pytest_sglang.sim.bodies import (
    BadRequest,
    Candidates,
    int_field,
    is_batch,
    logprob_count,
    message_text,
    native_logprobs,
    openai_logprobs,
    usage,
)
from pytest_sglang.sim.engine import (
    count_prompt_tokens,
    detokenize,
    output_tokens,
    prompt_seed,
    top_candidates,
)
from pytest_sglang.sim.metrics import detokenize_any, tokenize

VERSION = "0.0.0-sim"
DEFAULT_MAX_TOKENS = 16
WARMUP_HEADER = "X-Sglang-Sim-Warmup"
FLUSH_BODY = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)

if TYPE_CHECKING:
    from pytest_sglang.sim.server import SimHTTPServer, SimServer

TEXT_MARK = "@@sim-text@@"


def sse_event(payload: bytes) -> bytes:
    """One ``data:`` event as one HTTP chunk."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


SSE_DONE = sse_event(b"[DONE]") + b"0\r\n\r\n"


def text_event(template: dict[str, Any]) -> Callable[[str], bytes]:
    """The events of a stream that differ only in one text field, serialised once: ``template`` holds
    TEXT_MARK where the text goes, and the result makes the SSE chunk of one text, byte for byte what
    ``json.dumps`` of the filled-in object would give."""
    head, tail = json.dumps(template).encode().split(json.dumps(TEXT_MARK).encode())

    def event(text: str) -> bytes:
        return sse_event(head + json.dumps(text).encode() + tail)

    return event


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: SimHTTPServer
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base class signature
        pass  # our own uvicorn-style access line is written in send_head()

    @property
    def sim(self) -> SimServer:
        return self.server.sim

    def setup(self) -> None:
        super().setup()
        # taken once per connection (the trace forgets it), so a reused address cannot read a stale one
        trace = self.sim.trace
        self.accepted_at = trace.connection_accepted(self.client_address) if trace is not None else None
        self.requests_read = 0  # on this connection

    def parse_request(self) -> bool:
        self.arrived = time.monotonic()  # the request line has just been read
        self.requests_read += 1
        return super().parse_request()

    def traced(self, started: float, times: list[float], tokens: int, prompt: object) -> None:
        """The request_trace knob's line for a streamed request that has been answered in full; ``accepted``
        only on the connection's first request (later ones did not wait for an accept); ``prompt``: its prompt's
        fingerprint (engine.prompt_seed), to tell which requests sent the same prompt."""
        if self.sim.trace is not None and not self.is_warmup:
            self.sim.trace.record(path=self.path, accepted=self.accepted_at if self.requests_read == 1 else None,
                                  arrived=self.arrived, handled=started, chunks=times, written=time.monotonic(),
                                  tokens=tokens, prompt=prompt_seed(prompt))

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
        self.wfile.write(sse_event(json.dumps(obj).encode()))

    def end_sse(self, *last: Any) -> None:
        """The stream's last events, its ``[DONE]`` and the chunked body's end, in one write."""
        events = [sse_event(json.dumps(obj).encode()) for obj in last]
        self.wfile.write(b"".join(events) + SSE_DONE)

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
            if self.sim.args.node_rank > 0 and path != "/health":  # a node >= 1 runs SGLang's health server only
                self.send_json(404, {"detail": "Not Found"})
                return
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
        """SGLang's: flushed only when nothing runs or waits, else 400; ``?timeout=S`` (0.5.23) waits up to S
        seconds for that before it answers "Timed out waiting for idle state."."""
        query = parse_qs(urlsplit(self.path).query)
        try:
            wait = float(query.get("timeout", ["0"])[0])
        except ValueError:
            self.send_json(422, {"detail": "timeout must be a number"})
            return
        if self.sim.flush_when_idle(wait):
            self.send_text(200, FLUSH_BODY)
        else:
            self.send_text(400, "Timed out waiting for idle state." if wait > 0 else "Flush cache failed.\n")

    def reset_prefix_cache(self, body: dict[str, Any]) -> None:
        """vLLM's (VLLM_SERVER_DEV_MODE=1): ``{"success": false}`` while requests hold blocks."""
        if self.sim.knobs.metrics_format != "vllm":
            self.send_json(404, {"detail": "Not Found"})  # an SGLang server has no such route
            return
        self.send_json(200, {"success": self.sim.flush_when_idle(0.0)})

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
    def generate_one(self, prompt: object, n: int) -> tuple[list[int], float, int, int]:
        """Run one non-streamed request to its end: (output ids, e2e seconds, verify steps, cached tokens)."""
        start = time.monotonic()
        tokens = self.outputs(prompt, n)
        cached = self.sim.prefill(prompt)
        steps = 0
        times = []
        for ids, _last in self.sim.engine.stream(tokens):
            steps += 1
            times.append(time.monotonic())
            self.sim.tokens_out += len(ids)
        self.finished(prompt, len(tokens), steps, start, times, cached)
        return tokens, time.monotonic() - start, steps, cached

    def outputs(self, prompt: object, n: int) -> list[int]:
        """The greedy output; token ids the model lacks are answered 400, as vLLM answers them."""
        if isinstance(prompt, list):
            bad = [t for t in prompt if isinstance(t, int) and not 0 <= t < self.sim.knobs.vocab_size]
            if bad:
                raise BadRequest(f"Token id {bad[0]} is out of vocabulary")
        return output_tokens(prompt, n, self.sim.knobs.output_variant)

    def finished(self, prompt: object, n_out: int, steps: int, start: float, times: list[float],
                 cached: int) -> None:
        """Count a finished request in /metrics (times: when each chunk left; cached: its prompt tokens that
        came from the prefix cache)."""
        self.sim.metrics.finished(
            prompt_tokens=count_prompt_tokens(prompt), generation_tokens=n_out, cached_tokens=cached,
            verify_steps=steps if self.sim.args.speculative else None,
            ttft=times[0] - start if times else None, itls=[b - a for a, b in zip(times, times[1:], strict=False)],
            e2e=time.monotonic() - start)

    def meta(self, rid: str, prompt: object, out: list[int], n: int, steps: int,
             e2e: float | None, cached: int = 0) -> dict[str, Any]:
        m: dict[str, Any] = {
            "id": rid,
            "finish_reason": {"type": "length", "length": n} if e2e is not None else None,
            "prompt_tokens": count_prompt_tokens(prompt),
            "weight_version": "default",
            "completion_tokens": len(out),
            "cached_tokens": cached,
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
        n = int_field(sp.get("max_new_tokens", DEFAULT_MAX_TOKENS), "max_new_tokens")
        logprob_count(body, "generate")  # a bad field is answered 400 before any work
        batch = is_batch(prompt)
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
                out, e2e, steps, cached = self.generate_one(p, n)
                results[i] = {"text": detokenize(out), "output_ids": out,
                              "meta_info": {**self.meta(uuid.uuid4().hex, p, out, n, steps, e2e, cached),
                                            **native_logprobs(body, self.candidates(p, n))}}

            threads = [threading.Thread(target=one, args=(i, p), daemon=True) for i, p in enumerate(prompt)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.send_json(200, results)
        else:
            out, e2e, steps, cached = self.generate_one(prompt, n)
            self.send_json(200, {"text": detokenize(out), "output_ids": out,
                                 "meta_info": {**self.meta(uuid.uuid4().hex, prompt, out, n, steps, e2e, cached),
                                               **native_logprobs(body, self.candidates(prompt, n))}})
        self.sim.request_done(self.is_warmup)

    def candidates(self, prompt: object, n: int) -> Candidates:
        """The top-k candidates of each output position, for the logprob fields of an answer."""
        knobs = self.sim.knobs
        return lambda k: top_candidates(prompt, n, knobs.output_variant, k, knobs.output_margin)

    def generate_stream(self, prompt: object, n: int) -> None:
        rid = uuid.uuid4().hex
        start = time.monotonic()
        tokens = self.outputs(prompt, n)
        cached = self.sim.prefill(prompt)
        self.send_head(200, "text/event-stream", None)
        out: list[int] = []
        text = ""  # the text so far, as SGLang streams it: grown by each chunk's words, not redone
        steps = 0
        times: list[float] = []
        gen = self.sim.engine.stream(tokens)
        try:
            for ids, last in gen:
                out += ids
                text += detokenize(ids)
                steps += 1
                times.append(time.monotonic())
                self.sim.tokens_out += len(ids)
                if last:
                    self.finished(prompt, len(out), steps, start, times, cached)
                event = {"text": text, "output_ids": ids,
                         "meta_info": self.meta(rid, prompt, out, n, steps, time.monotonic() - start if last else None,
                                                cached)}
                if last:
                    self.end_sse(event)
                else:
                    self.sse(event)
            self.traced(start, times, len(out), prompt)
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
            prompts: list[object] = [[message_text(m) for m in messages]]
        else:
            prompt = body.get("prompt")
            if prompt is None:
                raise BadRequest("prompt is required")
            prompts = list(prompt) if is_batch(prompt) else [prompt]
        n = int_field(body.get("max_tokens", body.get("max_completion_tokens")) or DEFAULT_MAX_TOKENS,
                      "max_tokens")
        logprob_count(body, "completions")
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
                out, _e2e, _steps, _cached = self.generate_one(p, n)
                total_out += len(out)
                text = detokenize(out)
                if chat:
                    choices.append({"index": i, "message": {"role": "assistant", "content": text,
                                                            "reasoning_content": None, "tool_calls": None},
                                    "logprobs": None, "finish_reason": "length", "matched_stop": None})
                else:
                    choices.append({"index": i, "text": text, "logprobs": openai_logprobs(body, self.candidates(p, n)),
                                    "finish_reason": "length", "matched_stop": None})
            self.send_json(200, {"id": cid, "object": obj, "created": created, "model": model,
                                 "choices": choices, "usage": usage(n_prompt, total_out)})
        self.sim.request_done(self.is_warmup)

    def openai_stream(self, prompt: object, n: int, *, chat: bool, cid: str, created: int, model: str,
                      include_usage: bool, spec_details: bool = False) -> None:
        start = time.monotonic()
        tokens = self.outputs(prompt, n)
        n_prompt = count_prompt_tokens(prompt)
        cached = self.sim.prefill(prompt)
        self.send_head(200, "text/event-stream", None)
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": cid, "object": obj, "created": created, "model": model}
        middle = text_event({**head, "choices": [self.openai_choice(TEXT_MARK, chat=chat, first=False, last=False)],
                             "usage": None})
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
                text = detokenize(ids)
                if not last:
                    self.wfile.write(middle(text) if steps > 1 else sse_event(json.dumps(
                        {**head, "choices": [self.openai_choice(text, chat=chat, first=True, last=False)],
                         "usage": None}).encode()))
                    continue
                self.finished(prompt, sent, steps, start, times, cached)
                closing = [{**head, "choices": [self.openai_choice(text, chat=chat, first=steps == 1, last=True)],
                            "usage": None}]
                if spec_details and self.sim.args.speculative:  # SGLang's sglext chunk, at response level
                    closing.append({**head, "choices": [], "sglext": {"spec_tokens_details": {
                        "spec_verify_ct": steps, "spec_accept_length": sent / steps if steps else 0.0}}})
                if include_usage:
                    closing.append({**head, "choices": [], "usage": usage(n_prompt, sent)})
                self.end_sse(*closing)
            self.traced(start, times, sent, prompt)
        finally:
            gen.close()

    @staticmethod
    def openai_choice(text: str, *, chat: bool, first: bool, last: bool) -> dict[str, Any]:
        """One streamed choice: a chat delta (its first with the role) or a completion's text."""
        finish = "length" if last else None
        choice: dict[str, Any]
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if last:
            choice["matched_stop"] = None
        return choice


ROUTES: dict[tuple[str, str], Any] = {
    ("GET", "/health"): Handler.health,
    ("GET", "/ready"): Handler.health,  # SGLang 0.5.23: 200 once the server is Up, no key needed
    ("GET", "/health_generate"): Handler.health_generate,
    ("GET", "/model_info"): Handler.model_info,
    ("GET", "/get_model_info"): Handler.model_info,
    ("GET", "/server_info"): Handler.server_info,
    ("GET", "/get_server_info"): Handler.server_info,
    ("GET", "/flush_cache"): Handler.flush_cache,
    ("POST", "/flush_cache"): Handler.flush_cache,
    ("POST", "/reset_prefix_cache"): Handler.reset_prefix_cache,
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


