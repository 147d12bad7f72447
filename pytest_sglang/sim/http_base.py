"""What every endpoint of the simulator shares: the wire (the head and its uvicorn access line, JSON and text
bodies, SSE events, the request_trace line) and one generation's run (its greedy outputs checked against the
vocabulary, paced by the engine, counted in /metrics)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from pytest_sglang.sim.bodies import BadRequest, Candidates
from pytest_sglang.sim.engine import count_prompt_tokens, output_tokens, prompt_seed, top_candidates

if TYPE_CHECKING:
    from pytest_sglang.sim.server import SimHTTPServer, SimServer

WARMUP_HEADER = "X-Sglang-Sim-Warmup"
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


class BaseHandler(BaseHTTPRequestHandler):
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

    # -- one generation's run ----------------------------------------------------------------------------
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

    def candidates(self, prompt: object, n: int) -> Candidates:
        """The top-k candidates of each output position, for the logprob fields of an answer."""
        knobs = self.sim.knobs
        return lambda k: top_candidates(prompt, n, knobs.output_variant, k, knobs.output_margin)
