"""The ``request_trace`` knob: one JSON line per streamed request, with the simulator's own timestamps.

A load generator that reads a paced server late and a server that falls behind its own schedule look the same
from the client's side. The trace tells them apart: ``arrived`` (the request line was read), ``handled`` (its
headers and body parsed, the route started), ``chunks`` (when each chunk was produced, before its write),
``written`` (the last byte of the answer written), and for the first request of a connection ``accepted``
(when the server's accept loop took the connection: from there to ``arrived`` is the handler thread's start
and the request's wait in the socket), ``prompt`` (a fingerprint of its prompt: equal for equal prompts); the
times are all ``time.monotonic()`` seconds, the clock ``time.perf_counter()`` reads on Linux, so a client on the
same machine can set them beside its own.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any


class RequestTrace:
    """Appends one line per finished request to ``path`` (created or truncated at start)."""

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._file = Path(path).open("w", encoding="utf-8")  # noqa: SIM115 - open for the server's life
        self._accepted: dict[Any, float] = {}

    def accepted(self, client_address: Any) -> None:
        self._accepted[client_address] = time.monotonic()

    def connection_accepted(self, client_address: Any) -> float | None:
        """When the connection of this client address was accepted, once: None for its later requests."""
        return self._accepted.pop(client_address, None)

    def record(self, **entry: Any) -> None:
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
