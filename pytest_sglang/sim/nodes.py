"""The main process's links to other processes than its ranks: the other nodes of a multi-node server (torch's
TCPStore rendezvous at --dist-init-addr) and a prefill member's KV bootstrap listener."""

from __future__ import annotations

import socket
import threading
import time

from pytest_sglang.sim.config import Knobs, ServerArgs
from pytest_sglang.sim.logfmt import Logger, write_raw

_SITE = "/usr/local/lib/python3.12/dist-packages"
BOOTSTRAP_TRACEBACK = [  # SGLang's bootstrap server binding its port in its own thread (aiohttp's TCPSite)
    "Traceback (most recent call last):",
    f'  File "{_SITE}/sglang/srt/disaggregation/common/conn.py", line 1126, in _run_server',
    "    self._loop.run_until_complete(self._runner.setup())",
    f'  File "{_SITE}/sglang/srt/disaggregation/common/conn.py", line 1131, in _run_server',
    "    self._loop.run_until_complete(site.start())",
    '  File "/usr/lib/python3.12/asyncio/base_events.py", line 691, in run_until_complete',
    "    return future.result()",
    "           ^^^^^^^^^^^^^^^",
    f'  File "{_SITE}/aiohttp/web_runner.py", line 121, in start',
    "    self._server = await loop.create_server(",
    "                   ^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "/usr/lib/python3.12/asyncio/base_events.py", line 1536, in create_server',
    "    sock.bind(sa)",
]


JOIN_WAIT_LOG_SECONDS = 2.0  # rank 0 logs "waiting for N more node(s)" this often while a node has not joined


def start_bootstrap_server(host: str, port: int, log: Logger) -> socket.socket | None:
    """A prefill member's CommonKVBootstrapServer: a real TCP listener on --disaggregation-bootstrap-port
    (the decode members and the router reach the prefill's KV through it). A taken port fails the launch as
    SGLang's does: the bind error's traceback, exit 1."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        write_raw("".join(line + "\n" for line in ["Exception in thread Thread-1 (_run_server):",
                                                    *BOOTSTRAP_TRACEBACK,
                                                    f"OSError: [Errno {exc.errno}] {exc.strerror}"]))
        return None
    threading.Thread(target=serve_bootstrap, args=(sock,), daemon=True).start()
    log.line(f"CommonKVBootstrapServer started successfully on {host}:{port}")
    return sock


def serve_bootstrap(sock: socket.socket) -> None:
    """Accept and close: the simulator moves no KV cache, a decode member only needs the port to answer."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        conn.close()


def join_nodes(args: ServerArgs, knobs: Knobs, log: Logger, peers: list[socket.socket]) -> None:
    """Rank 0 waits for every other node to connect to --dist-init-addr before it loads (torch's TCPStore
    rendezvous); a node >= 1 connects there first, retrying as torch does, or under fault "hang" never does."""
    assert args.dist_init_addr is not None
    host, _, port = args.dist_init_addr.rpartition(":")
    log.line("Init torch distributed begin.")
    if args.node_rank == 0:
        listener = socket.create_server((host.strip("[]"), int(port)))
        listener.settimeout(JOIN_WAIT_LOG_SECONDS)
        while len(peers) < args.nnodes - 1:
            try:
                conn, _ = listener.accept()
            except TimeoutError:  # as torch's store-based barrier does: rank 0 is not silent while it waits
                log.line(f"Init torch distributed: waiting for {args.nnodes - 1 - len(peers)} more node(s)")
                continue
            conn.settimeout(None)
            conn.recv(64)
            peers.append(conn)
        listener.close()
        return
    if knobs.fault == "hang":
        while True:
            time.sleep(3600)
    while True:
        try:
            conn = socket.create_connection((host.strip("[]"), int(port)), timeout=2.0)
            break
        except OSError:
            time.sleep(0.2)
    conn.sendall(f"rank {args.node_rank}\n".encode())
    peers.append(conn)
