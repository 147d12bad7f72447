"""The simulator's HTTP endpoints: SGLang's native API, the OpenAI API, /metrics, as SGLang answers them."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pytest_sglang.sim.bodies import BadRequest, int_field, is_batch, logprob_count, native_logprobs
from pytest_sglang.sim.engine import count_prompt_tokens, detokenize, output_tokens
from pytest_sglang.sim.http_base import WARMUP_HEADER
from pytest_sglang.sim.metrics import detokenize_any, tokenize
from pytest_sglang.sim.openai_api import DEFAULT_MAX_TOKENS, OpenAIHandler

__all__ = ["DEFAULT_MAX_TOKENS", "FLUSH_BODY", "ROUTES", "VERSION", "WARMUP_HEADER", "Handler"]

VERSION = "0.0.0-sim"
FLUSH_BODY = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


class Handler(OpenAIHandler):
    """Every endpoint: the dispatch (node rank, API key, 404/405), the simple ones, SGLang's native /generate."""

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


