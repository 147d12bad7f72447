"""The GPUs of a server on an ssh host, read there by the agent (agent/gpus.py, mode ``gpus``) for the telemetry.

One more ssh connection per sampler (``ssh HOST ... pytest-sglang gpus``), beside the server's control and log
connections. The agent picks the host's source (NVML where its python imports pynvml, else the nvidia-smi on
the PATH of the profile's environment), says which GPUs the server's tree holds memory on there and its
``CUDA_VISIBLE_DEVICES``, and from then on reads the GPUs on request: once, or every ``interval`` seconds
between "start" and "stop", each reading one JSON line.

Clock: a reading is stamped on the host with the agent's ``time.monotonic()`` right after the GPUs answered,
and mapped onto this machine's ``time.perf_counter()`` (the clock of the rounds) by an offset measured when
the connection opens: the best of :data:`SYNC_PINGS` ping round trips, whose midpoint is taken as the agent's
moment. The error is at most half that round trip (:attr:`HostGpus.clock_error_s`, a millisecond or less on
a LAN); the offset is measured once per connection, that is per benchmark, over which two hosts' monotonic
clocks drift apart by parts per million (a millisecond in a quarter of an hour). Receive time was not used:
a reading reaches this side after the network's and ssh's buffering, late by a varying amount, while the
energy integral's edges are the round's first request and last response, stamped here.

Pytest-free; nothing passes through a shell but the quoted agent command line (RemotePlan.ssh_argv).
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pytest_sglang.errors import RemoteError
from pytest_sglang.launch.agent.gpus import GPU_PROTOCOL
from pytest_sglang.launch.remote import HANDSHAKE_SECONDS, RemoteServer, agent_input
from pytest_sglang.machine.gpus import SMI_TIMEOUT_SECONDS, GpuReading, pick_gpus

SYNC_PINGS = 5
REPLY_SECONDS = SMI_TIMEOUT_SECONDS + 5.0  # a reading's nvidia-smi call may take its whole timeout
CLOSE_SECONDS = 5.0


@dataclass(eq=False)
class HostGpus:
    """An open ``gpus`` agent on the server's ssh host: a GPU source for bench/telemetry.py (``read``, ``start``,
    ``stop``, ``close``), whose readings carry this machine's ``perf_counter`` times."""

    host: str
    source: str  # the host's: "nvml" or "nvidia-smi"
    gpus: list[int] | None
    gpus_from: str
    offset: float  # this machine's perf_counter minus the agent's monotonic clock
    clock_error_s: float
    interval: float
    ssh_log: Path  # ssh's messages, beside the server's (RemoteServer.ssh_log_path)
    _proc: subprocess.Popen[bytes] = field(repr=False)
    _stderr: IO[bytes] = field(repr=False)
    _replies: queue.Queue[dict[str, Any] | None] = field(default_factory=queue.Queue, repr=False)
    _samples: list[tuple[float, list[GpuReading]]] = field(default_factory=list, repr=False)
    _sampling: bool = field(default=False, repr=False)

    @classmethod
    def open(cls, remote: RemoteServer, *, query: str | None, interval: float) -> HostGpus:
        """Start the agent for ``remote``'s server and measure the clock offset; RemoteError (naming the host) if
        the host has no GPU source or the agent does not answer. Nothing is left running if this raises."""
        stderr = open(remote.ssh_log_path, "ab")  # noqa: SIM115 - closed in close()
        spec = {"env": remote.rplan.env, "token": remote.token, "pid": remote.pid,
                "supervisor": remote.supervisor, "query": query}
        try:
            proc = subprocess.Popen(remote.rplan.ssh_argv("gpus"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=stderr, start_new_session=True)
        except OSError as exc:
            stderr.close()
            raise RemoteError(f"cannot run ssh to read the GPUs of {remote.host}: {exc.strerror}") from None
        replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        gpus = cls(host=remote.host, source="", gpus=None, gpus_from="", offset=0.0, clock_error_s=0.0,
                   interval=interval, ssh_log=remote.ssh_log_path, _proc=proc, _stderr=stderr, _replies=replies)
        threading.Thread(target=gpus._read_events, name="sglang-telemetry-host-gpus", daemon=True).start()
        try:
            assert proc.stdin is not None
            proc.stdin.write(agent_input(spec))
            proc.stdin.flush()
            hello = gpus._reply("gpus", HANDSHAKE_SECONDS)
            if hello.get("protocol") != GPU_PROTOCOL:
                raise RemoteError(f"the GPU agent on {remote.host} speaks protocol {hello.get('protocol')!r}, "
                                  f"not {GPU_PROTOCOL}")
            if not hello.get("source"):
                raise RemoteError(f"no GPU to ask on the ssh host {remote.host}: {hello.get('why')}")
            gpus.source = str(hello["source"])
            gpus.gpus, gpus.gpus_from = pick_gpus([int(i) for i in hello.get("held") or []], hello.get("visible"))
            gpus.offset, gpus.clock_error_s = gpus._sync()
        except BaseException:
            gpus.close()
            raise
        return gpus

    def read(self) -> list[GpuReading] | None:
        """The server's GPUs as they read on the host now; None where they do not answer."""
        self._send({"do": "read", "gpus": self.gpus})
        try:
            reply = self._reply("reading", REPLY_SECONDS)
        except RemoteError:
            return None
        return _readings(reply.get("readings"))

    def start(self) -> None:
        self._drain()  # a "stopped" that came after its stop() gave up must not answer this round's stop()
        self._samples = []
        self._sampling = True
        self._send({"do": "start", "gpus": self.gpus, "interval": self.interval})

    def stop(self) -> list[tuple[float, list[GpuReading]]]:
        """Stop the agent's readings and return the round's, in this machine's perf_counter time."""
        if self._sampling:
            self._send({"do": "stop"})
            with contextlib.suppress(RemoteError):
                self._reply("stopped", REPLY_SECONDS)
            self._sampling = False
        return list(self._samples)

    def close(self) -> None:
        """End the agent (end-of-file on its stdin) and its ssh client."""
        with contextlib.suppress(OSError, ValueError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=CLOSE_SECONDS)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._stderr.close()

    def __enter__(self) -> HostGpus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sync(self) -> tuple[float, float]:
        best: tuple[float, float] | None = None  # (round trip, offset)
        for _ in range(SYNC_PINGS):
            sent = time.perf_counter()
            self._send({"do": "ping"})
            clock = float(self._reply("pong", REPLY_SECONDS)["clock"])
            back = time.perf_counter()
            if best is None or back - sent < best[0]:
                best = (back - sent, (sent + back) / 2 - clock)
        assert best is not None
        return best[1], best[0] / 2

    def _drain(self) -> None:
        while True:
            try:
                reply = self._replies.get_nowait()
            except queue.Empty:
                return
            if reply is None:  # the connection's end stays for every later wait
                self._replies.put(None)
                return

    def _send(self, command: dict[str, Any]) -> None:
        with contextlib.suppress(OSError, ValueError):  # a gone agent: the reply wait says so
            assert self._proc.stdin is not None
            self._proc.stdin.write((json.dumps(command) + "\n").encode())
            self._proc.stdin.flush()

    def _reply(self, event: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RemoteError(f"the GPU agent on {self.host} did not answer within {timeout:g} s") from None
            if reply is None:
                self._replies.put(None)  # for every later wait too: the connection does not come back
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=CLOSE_SECONDS)
                raise RemoteError(f"the GPU agent's connection to {self.host} ended (ssh exited with code "
                                  f"{self._proc.returncode}); ssh's messages: {self.ssh_log}")
            if reply.get("event") == event:
                return reply

    def _read_events(self) -> None:
        assert self._proc.stdout is not None
        try:
            with self._proc.stdout:
                for line in iter(self._proc.stdout.readline, b""):
                    try:
                        event = json.loads(line)
                        if not isinstance(event, dict):
                            continue
                        if event.get("event") == "reading" and self._sampling:
                            readings = _readings(event.get("readings"))
                            if readings:
                                self._samples.append((float(event["t"]) + self.offset, readings))
                        else:
                            self._replies.put(event)
                    except (KeyError, TypeError, ValueError):  # a malformed line is skipped, not the end
                        continue
        finally:
            self._replies.put(None)


def _readings(rows: Any) -> list[GpuReading] | None:
    """The agent's rows ([index, util, memory, power, sm clock, temperature, energy mJ]; protocol 1's lack the
    energy) as readings; None for none."""
    if not isinstance(rows, list):
        return None
    found = [GpuReading(int(row[0]), *(None if v is None else float(v) for v in row[1:7]))
             for row in rows if isinstance(row, list) and len(row) in (6, 7)]
    return found or None
