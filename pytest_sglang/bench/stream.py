"""The load generator's HTTP: asyncio HTTP/1.1 streaming on raw sockets, with keep-alive connections.

:func:`stream_request` sends one streaming generation request through a :class:`ConnectionPool` and stamps
every SSE event with ``time.perf_counter()`` the moment its bytes arrive; one event loop drives hundreds of
concurrent streams (benchmarks/client_ceiling.py measures how far it goes). It never raises for server
trouble: a :class:`StreamResult` says what happened (``ok``, ``status``, ``error``, ``connection_error``).
The per-API event parsers turn ``data:`` payloads into output events and the server's token counts.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pytest_sglang.bench.answers import first_choice, read_count, read_generate
from pytest_sglang.bench.payloads import API_PATHS, BODY_EXCERPT, Api, auth_headers
from pytest_sglang.errors import BenchmarkError, ServerRequestError


@dataclass
class StreamResult:
    """One streamed request, as the client saw it. Times are ``time.perf_counter()`` seconds."""

    ok: bool = False
    status: int | None = None
    error: str | None = None  # the body of a non-200 answer, an in-stream error, or the exception
    connection_error: bool = False  # could not connect, or the connection broke mid-stream
    start: float = 0.0  # just before the request's first byte was written
    end: float = 0.0  # when the stream finished (or failed)
    chunk_times: list[float] = field(default_factory=list)  # arrival of each event that carried output
    chunk_tokens: list[int] = field(default_factory=list)  # tokens per such event where the server says
    text: str = ""
    prompt_tokens: int | None = None  # server-reported
    completion_tokens: int | None = None  # server-reported
    spec_verify_ct: int | None = None  # native API under speculative decoding

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    @property
    def latency(self) -> float:
        return self.end - self.start


def _newer(value: int | None, before: int | None) -> int | None:
    """A count an event reports, else the one an earlier event did."""
    return before if value is None else value


class _EventParser:
    """Feeds SSE ``data:`` payloads of one API into a StreamResult."""

    def __init__(self, api: Api, result: StreamResult) -> None:
        self.api = api
        self.r = result
        self._native_text_len = 0
        self._native_tokens = 0
        self.done = False
        self.where = f"POST {API_PATHS[api]} (streamed)"

    def feed(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            data = json.loads(payload)
        except ValueError:
            self._fail(f"unparsable stream event: {payload[:200]!r}")
            return
        if not isinstance(data, dict):
            return
        if data.get("error") is not None or data.get("object") == "error":
            err = data.get("error", data)
            self._fail("in-stream error: " + json.dumps(err)[:BODY_EXCERPT])
            return
        try:
            if self.api == "generate":
                self._feed_native(data, now)
            else:
                self._feed_openai(data, now)
        except ServerRequestError as exc:
            self._fail(str(exc))

    def _fail(self, message: str) -> None:
        if self.r.error is None:
            self.r.error = message

    def _feed_openai(self, data: dict[str, Any], now: float) -> None:
        choice = first_choice(data, self.where, chat=self.api == "chat")
        if choice is not None and choice.text:
            self.r.chunk_times.append(now)
            self.r.text += choice.text
        spec = (data.get("sglext") or {}).get("spec_tokens_details") if isinstance(data.get("sglext"), dict) else None
        if isinstance(spec, list):
            spec = spec[0] if spec else None
        if isinstance(spec, dict) and spec.get("spec_verify_ct"):  # SGLang's return_spec_tokens_details
            self.r.spec_verify_ct = int(spec["spec_verify_ct"])
        usage = data.get("usage")
        self.r.completion_tokens = _newer(read_count(usage, "completion_tokens", self.where, data),
                                          self.r.completion_tokens)
        self.r.prompt_tokens = _newer(read_count(usage, "prompt_tokens", self.where, data), self.r.prompt_tokens)

    def _feed_native(self, data: dict[str, Any], now: float) -> None:
        answer = read_generate(data, self.where, ids=False)
        meta, text = answer.meta, answer.text
        tokens = read_count(meta, "completion_tokens", self.where, data)
        grew = False
        if tokens is not None:
            if tokens > self._native_tokens:
                self.r.chunk_tokens.append(tokens - self._native_tokens)
                self._native_tokens = tokens
                grew = True
            self.r.completion_tokens = tokens
        elif len(text) > self._native_text_len:
            grew = True
        if grew:
            self.r.chunk_times.append(now)
        if len(text) >= self._native_text_len:
            self.r.text = text
            self._native_text_len = len(text)
        self.r.prompt_tokens = _newer(read_count(meta, "prompt_tokens", self.where, data), self.r.prompt_tokens)
        self.r.spec_verify_ct = _newer(read_count(meta, "spec_verify_ct", self.where, data), self.r.spec_verify_ct)
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            self._fail("request aborted by the server: " + json.dumps(finish)[:BODY_EXCERPT])


# --------------------------------------------------------------------------------------------------------
# asyncio HTTP/1.1 on raw sockets


class _HTTPError(Exception):
    pass


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


class ConnectionPool:
    """Keep-alive connections to one origin, for one event loop. A base URL that is not http(s) raises
    BenchmarkError."""

    def __init__(self, base_url: str, *, api_key: str | None = None, limit: int = 1024) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise BenchmarkError(f"base_url must be http:// or https://, got {base_url!r}")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc.rsplit("@", 1)[-1]
        self._auth = "".join(f"{k}: {v}\r\n" for k, v in auth_headers(api_key).items())
        self._idle: list[_Conn] = []
        self.limit = limit

    def __repr__(self) -> str:  # never shows the key
        return f"ConnectionPool({self.host}:{self.port})"

    async def acquire(self) -> tuple[_Conn, bool]:
        while self._idle:
            conn = self._idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn, True
            conn.writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=2**20)
        return _Conn(reader, writer), False

    def release(self, conn: _Conn, reusable: bool) -> None:
        if reusable and len(self._idle) < self.limit:
            self._idle.append(conn)
        else:
            conn.writer.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.writer.close()
        for conn in idle:
            try:
                await conn.writer.wait_closed()
            except OSError:
                pass

    def request_bytes(self, path: str, body: bytes) -> bytes:
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{self._auth}"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode("latin-1") + body


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    line = await reader.readline()
    if not line:
        raise ConnectionResetError("server closed the connection before answering")
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise _HTTPError(f"malformed status line {line[:100]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def _body_pieces(reader: asyncio.StreamReader, headers: dict[str, str]) -> Any:
    """Async iterator over the body's bytes as they arrive; sets nothing, yields bytes."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ConnectionResetError("connection closed inside a chunked body")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    elif "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining > 0:
            data = await reader.read(min(remaining, 65536))
            if not data:
                raise ConnectionResetError("connection closed before the body was complete")
            remaining -= len(data)
            yield data
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


def _sse_payloads(buffer: bytearray) -> Iterator[bytes]:
    """Complete ``data:`` payloads at the front of ``buffer`` (consumed); a partial event stays."""
    while True:
        # Events end with a blank line; accept \n\n and \r\n\r\n.
        idx = buffer.find(b"\n\n")
        idx_crlf = buffer.find(b"\r\n\r\n")
        if idx < 0 and idx_crlf < 0:
            return
        if idx_crlf >= 0 and (idx < 0 or idx_crlf < idx):
            event, cut = bytes(buffer[:idx_crlf]), idx_crlf + 4
        else:
            event, cut = bytes(buffer[:idx]), idx + 2
        del buffer[:cut]
        data_lines = [ln[5:].lstrip(b" ") for ln in event.splitlines() if ln.startswith(b"data:")]
        if data_lines:
            yield b"\n".join(data_lines)


async def stream_request(
    pool: ConnectionPool,
    api: Api,
    body: Mapping[str, Any],
    *,
    timeout: float | None = None,
    path: str | None = None,
) -> StreamResult:
    """Send one streaming generation request and time every event. Never raises for server trouble:
    failures come back in ``StreamResult.ok/status/error/connection_error``."""
    result = StreamResult()
    state: dict[str, Any] = {"conn": None, "reusable": False}
    try:
        await asyncio.wait_for(_stream(pool, api, body, path, result, state), timeout)
    except (OSError, asyncio.IncompleteReadError) as exc:
        result.connection_error = True
        result.error = f"{type(exc).__name__}: {exc}"
    except asyncio.TimeoutError:
        result.error = f"timed out after {timeout} s"
    except (_HTTPError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        if not result.end:
            result.end = time.perf_counter()
        if result.error is not None:
            result.ok = False
        conn = state["conn"]
        if conn is not None:
            pool.release(conn, bool(state["reusable"]) and result.ok)
    return result


async def warm_up(pool: ConnectionPool, api: Api, bodies: Sequence[Mapping[str, Any]], timeout: float | None
                  ) -> list[StreamResult]:
    """The warmup requests: the first alone (the server's first request pays its one-time costs), then the
    rest together."""
    warm = [await stream_request(pool, api, b, timeout=timeout) for b in bodies[:1]]
    if len(bodies) > 1:
        warm += await asyncio.gather(*(stream_request(pool, api, b, timeout=timeout) for b in bodies[1:]))
    return warm


async def _stream(pool: ConnectionPool, api: Api, body: Mapping[str, Any], path: str | None,
                  result: StreamResult, state: dict[str, Any]) -> None:
    parser = _EventParser(api, result)
    raw = pool.request_bytes(path or API_PATHS[api], json.dumps(body).encode())
    # As sglang.bench_serving and vllm bench serve do: the clock starts before the connection is taken, so a
    # new connection's set-up counts towards TTFT and latency.
    result.start = time.perf_counter()
    for attempt in (0, 1):
        conn, was_idle = await pool.acquire()
        state["conn"] = conn
        conn.writer.write(raw)
        try:
            await conn.writer.drain()
            status, headers = await _read_head(conn.reader)
            break
        except (ConnectionResetError, BrokenPipeError):
            conn.writer.close()
            state["conn"] = None
            if not was_idle or attempt:
                raise  # a fresh connection failed: a real error; an idle one may just have gone stale
    result.status = status
    framed = "chunked" in headers.get("transfer-encoding", "").lower() or "content-length" in headers
    keep_alive = framed and headers.get("connection", "").lower() != "close"
    if status != 200:
        pieces = [piece async for piece in _body_pieces(conn.reader, headers)]
        text = b"".join(pieces).decode("utf-8", "replace")
        result.error = text[:BODY_EXCERPT] or f"HTTP {status} with an empty body"
        result.end = time.perf_counter()
        state["reusable"] = keep_alive
        return
    buffer = bytearray()
    async for piece in _body_pieces(conn.reader, headers):
        now = time.perf_counter()
        buffer += piece
        for payload in _sse_payloads(buffer):
            parser.feed(payload, now)
    if buffer.strip():
        buffer += b"\n\n"
        for payload in _sse_payloads(buffer):
            parser.feed(payload, time.perf_counter())
    result.end = time.perf_counter()
    state["reusable"] = keep_alive
    result.ok = result.error is None
    if result.ok and not result.chunk_times and not result.completion_tokens:
        result.ok = False
        result.error = "the stream ended without any output"
    # Tokens that decode to no text (random weights, special tokens) stream no content but are counted in
    # `usage`: a success whose TTFT is unknown (None keeps it out of the TTFT figures rather than faking one).


