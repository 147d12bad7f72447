"""A 200 answer of the wrong shape, from a real HTTP server: the plugin's request error naming the body, never
a raw IndexError / AttributeError / ValueError / TypeError; the same for the load generator's streamed events."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pytest_sglang.bench.answers import EXCERPT_CHARS
from pytest_sglang.bench.client import Client
from pytest_sglang.bench.outputs import greedy_outputs
from pytest_sglang.bench.stream import ConnectionPool, stream_request
from pytest_sglang.errors import ServerRequestError

pytestmark = pytest.mark.timeout(60)


class Answers:
    """A server that answers every POST with ``body`` (streamed as one SSE event under ``"stream": true``),
    /health and /v1/models as a real one does."""

    def __init__(self) -> None:
        self.body: Any = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._send(200, {"data": [{"id": "m"}]} if self.path == "/v1/models" else {})

            def do_POST(self) -> None:
                sent = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if sent.get("stream"):
                    data = f"data: {json.dumps(outer.body)}\n\ndata: [DONE]\n\n".encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    self._send(200, outer.body)

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_port}"


@pytest.fixture(scope="module")
def server() -> Iterator[Answers]:
    answers = Answers()
    threading.Thread(target=answers.http.serve_forever, daemon=True).start()
    yield answers
    answers.http.shutdown()
    answers.http.server_close()


GENERATE = [[], "a string", [7], {"text": 5}, {"text": "x", "output_ids": ["a"]},
            {"text": "x", "output_ids": [None]}, {"text": "x", "output_ids": "12"}]
COMPLETIONS = [[], "a string", {"choices": []}, {"choices": {"0": {}}}, {"choices": ["x"]},
               {"choices": [{"text": ["x"]}]}, {"choices": [{"text": "x", "token_ids": ["z"]}]},
               {"choices": [{"text": "x", "token_ids": [1.5]}]}]


@pytest.mark.parametrize("body", GENERATE, ids=[json.dumps(b) for b in GENERATE])
def test_a_bad_generate_answer_is_a_request_error_naming_it(server: Answers, body: Any) -> None:
    server.body = body
    with Client(server.url) as client, pytest.raises(ServerRequestError) as caught:
        greedy_outputs(client, "sglang", ["p"], max_tokens=2)
    assert caught.value.status == 200
    assert str(caught.value).startswith("POST /generate answered 200 with "), caught.value
    assert str(caught.value).endswith(": " + json.dumps(body)), caught.value


@pytest.mark.parametrize("kind", ["vllm", "generic"])
@pytest.mark.parametrize("body", COMPLETIONS, ids=[json.dumps(b) for b in COMPLETIONS])
def test_a_bad_completions_answer_is_a_request_error_naming_it(server: Answers, body: Any, kind: str) -> None:
    server.body = body
    with Client(server.url) as client, pytest.raises(ServerRequestError) as caught:
        greedy_outputs(client, kind, ["p"], max_tokens=2, model="m")
    assert str(caught.value).startswith("POST /v1/completions answered 200 with "), caught.value
    assert str(caught.value).endswith(": " + json.dumps(body)), caught.value


def test_a_long_body_is_trimmed_in_the_message(server: Answers) -> None:
    server.body = {"choices": "x" * 10_000}
    with Client(server.url) as client, pytest.raises(ServerRequestError) as caught:
        greedy_outputs(client, "vllm", ["p"], max_tokens=2, model="m")
    shown = str(caught.value).split(": ", 1)[1]
    assert len(shown) == EXCERPT_CHARS and shown.endswith("\u2026") and shown.startswith('{"choices": "xxx')


def test_good_answers_still_read(server: Answers) -> None:
    server.body = {"text": " a b", "output_ids": [4, 5], "meta_info": {"completion_tokens": 2}}
    with Client(server.url) as client:
        (out,) = greedy_outputs(client, "sglang", ["p"], max_tokens=2)
    assert (out.text, out.token_ids) == (" a b", (4, 5))
    server.body = {"choices": [{"text": " c", "token_ids": [6]}], "usage": {"completion_tokens": 1}}
    with Client(server.url) as client:
        (out,) = greedy_outputs(client, "vllm", ["p"], max_tokens=1, model="m")
    assert (out.text, out.token_ids) == (" c", (6,))


STREAMED = [("completions", {"choices": ["x"]}), ("chat", {"choices": [{"delta": "x"}]}),
            ("completions", {"choices": [{"text": "a"}], "usage": {"completion_tokens": "many"}}),
            ("generate", {"text": 3}), ("generate", {"text": "a", "meta_info": {"completion_tokens": [1]}})]


@pytest.mark.parametrize(("api", "event"), STREAMED, ids=[json.dumps(e) for _, e in STREAMED])
def test_a_bad_streamed_event_fails_that_request_naming_it(server: Answers, api: str, event: Any) -> None:
    server.body = event

    async def one() -> Any:
        pool = ConnectionPool(server.url)
        try:
            return await stream_request(pool, api, {"stream": True}, timeout=10)  # type: ignore[arg-type]
        finally:
            await pool.close()

    result = asyncio.run(one())
    assert not result.ok and not result.connection_error
    assert result.error is not None and " (streamed) answered 200 with " in result.error, result.error
    assert result.error.endswith(": " + json.dumps(event)), result.error
