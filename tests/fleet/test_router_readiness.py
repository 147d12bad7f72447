"""The fleet's readiness at its router: /readiness answering 200 is not enough, every server must be counted."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pytest_sglang.server.fleet import RouterReadiness


class Answers(BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, object]] = {}
    asked: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.asked.append(self.path)
        status, body = self.answers.get(self.path, (404, {}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def router() -> Iterator[str]:
    Answers.answers, Answers.asked = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_ready_only_when_every_server_is_counted(router: str) -> None:
    probe = RouterReadiness(router, {}, expected=2)
    Answers.answers["/readiness"] = (503, {"status": "not ready", "reason": "insufficient healthy workers"})
    assert not probe.ok() and probe.last_status == 503
    Answers.answers["/readiness"] = (200, {"status": "ready", "healthy_workers": 1, "total_workers": 1})
    assert not probe.ok()
    assert probe.last == "HTTP 200 with 1 of 2 servers healthy"
    Answers.answers["/readiness"] = (200, {"status": "ready", "healthy_workers": 2, "total_workers": 2})
    assert probe.ok()
    assert Answers.asked == ["/readiness"] * 3  # one request a look


def test_a_router_without_readiness_is_asked_its_health(router: str) -> None:
    Answers.answers["/health"] = (200, "OK")  # SGLang's mini_lb
    probe = RouterReadiness(router, {}, expected=2)
    assert probe.ok()
    assert Answers.asked == ["/readiness", "/health"] and probe.path == "/health"
