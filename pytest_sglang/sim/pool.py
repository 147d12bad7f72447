"""The simulator's handler threads, started ahead of the connections they will serve.

``ThreadingHTTPServer`` starts a thread per accepted connection in its accept loop, and ``Thread.start`` waits
for the new thread to run: under a burst of connects (a benchmark's first wave opens one per request) every
connection queues behind the start of the ones before it, about 0.3 ms each on a loaded 2-core machine, which
the client counts in its time to first token (benchmarks/ceiling_anatomy.py measured 5 to 11 ms on average at
16 and 32 connections). Here the accept loop only queues the connection; one of the threads started
beforehand takes it, and a spawner thread keeps ``SPARE`` of them idle. A thread serves one connection to
its end, then waits for the next: the pool keeps the size of the largest burst it has seen.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

SPARE = 8  # idle threads kept ready beyond those serving connections

Serve = Callable[[Any, Any], None]  # (the accepted socket, the client's address)


class HandlerPool:
    def __init__(self, serve: Serve, *, ready: int) -> None:
        """``ready``: threads started now (the server's batch size: a first wave of that many connects finds
        a thread each); ``serve`` runs a connection to its end and closes it."""
        self._serve = serve
        self._connections: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._want = threading.Event()
        for _ in range(ready):
            self._start_one()
        threading.Thread(target=self._spawner, daemon=True, name="sim-handler-spawner").start()

    def hand(self, request: Any, client_address: Any) -> None:
        """From the accept loop: queue the connection for an idle thread, never waiting for one to start."""
        self._connections.put((request, client_address))
        with self._lock:
            self._idle -= 1
            short = self._idle < SPARE
        if short:
            self._want.set()

    def _start_one(self) -> None:
        with self._lock:
            self._idle += 1
        threading.Thread(target=self._work, daemon=True).start()

    def _spawner(self) -> None:
        while True:
            self._want.wait()
            self._want.clear()
            while True:
                with self._lock:
                    enough = self._idle >= SPARE
                if enough:
                    break
                self._start_one()

    def _work(self) -> None:
        while True:
            request, client_address = self._connections.get()
            self._serve(request, client_address)
            with self._lock:
                self._idle += 1
