"""The router's HTTP side: the Prometheus exporter, the endpoints, and the forwarding of a request to the worker
(or the prefill and decode members) the policy picked, answers relayed chunk by chunk."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from pytest_sglang.sim.router_cli import Worker

if TYPE_CHECKING:
    from pytest_sglang.sim.router import SimRouter

GENERATE_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
INFO_PATHS = ("/v1/models", "/get_model_info", "/model_info", "/get_server_info", "/server_info")


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


def server_class(host: str) -> type[RouterHTTPServer]:
    return RouterHTTPServer6 if ":" in host else RouterHTTPServer


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
