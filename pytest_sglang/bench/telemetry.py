"""What the server's GPUs and its own gauges did during each benchmark round, and the figures drawn from it.

During every measured round (the warmup excluded) two background threads sample: the GPUs the server uses at
about :data:`GPU_INTERVAL_S` (utilisation, memory used, power, SM clock, temperature: machine/gpus.py's
:class:`~pytest_sglang.machine.gpus.GpuReader`, NVML or nvidia-smi), and the server's ``/metrics`` gauges at
about :data:`SERVER_INTERVAL_S` (requests running and queued, KV-cache usage, generation throughput:
server_metrics.GAUGES). Each thread is started when a round starts and joined when it ends, so none outlives
its round; :data:`MAX_ROUND_S` bounds one that is never told to stop.

The server's GPUs: those its process tree holds memory on (the driver's process list), else its
``CUDA_VISIBLE_DEVICES``, else every GPU (machine/gpus.py's ``pick_gpus``). A :class:`GpuSource` reads them: the
server's own machine decides which, :func:`open_gpus`: this one (:class:`LocalGpus`), or its ssh host through
the agent (launch/remote_gpus.py's ``HostGpus``: the readings taken there, their times mapped onto this
machine's clock). A server elsewhere that is neither (another machine's URL, SLURM nodes) is not sampled; its
figures are None and ``gpu_unmeasured`` says why, as it does where the machine has no GPU source.

Per round, over the measured duration (first request sent to last response done), :meth:`Telemetry.apply`
sets: ``gpu_energy_j``, from the GPUs' own energy counters where every one of the server's GPUs has one
(NVML's total energy, here or on the ssh host: the counter at the window's end minus the counter at its
start, each interpolated between the readings around it, summed over the GPUs), else from their power
(summed over them, integrated over time: linear between readings, the first and last held to the edges), and
``gpu_energy_source`` says which ("counter" or "power_integral"). The power a GPU reports is an average over
a window of its own (up to a second), so it lags a ramp such as the one from idle to load, and readings
taken every GPU_INTERVAL_S miss what happens between them; the counter accumulates every joule (on the H200
the two differed by 0.8 % over a round). A counter that goes backwards during the round (a driver reload
resets it, a wrap), or stands still while the GPU draws power, is not trusted: that round falls back to the
power integral. Then ``gpu_power_mean_w`` (that energy over the duration), ``energy_per_output_token_j``
and ``output_tokens_per_joule``, ``gpu_util_mean_pct`` and ``gpu_sm_clock_mean_mhz`` (means over the
round's readings and GPUs), ``gpu_memory_peak_mib`` (the most any one GPU held), ``server_queue_mean`` and
``server_kv_usage_peak`` (a share, 0 to 1). :meth:`Telemetry.series` is the time series for the report
(docs/report-schema.md, "telemetry"). Knows nothing about pytest.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from pytest_sglang.bench.client import Client
from pytest_sglang.bench.energy import _gpu_figures, _mean, _measured_window
from pytest_sglang.bench.energy import _integral as _integral  # tests reach it here
from pytest_sglang.bench.server_metrics import scrape
from pytest_sglang.envknobs import GPU_QUERY_ENV, env_knobs
from pytest_sglang.errors import RemoteError
from pytest_sglang.launch.remote import RemoteServer
from pytest_sglang.launch.remote_gpus import HostGpus
from pytest_sglang.machine.gpus import SMI_TIMEOUT_SECONDS, GpuReader, GpuReading, gpu_processes, pick_gpus

if TYPE_CHECKING:
    from pytest_sglang.bench.result import BenchResult

GPU_INTERVAL_S = 0.1
SERVER_INTERVAL_S = 1 / 3
SCRAPE_TIMEOUT_S = 2.0
MAX_ROUND_S = 6 * 3600.0  # a sampler never told to stop ends by itself after this long
_READING_FIELDS = ("util_pct", "memory_used_mib", "power_w", "sm_clock_mhz", "temperature_c")
_GAUGE_FIELDS = ("running", "queued", "kv_usage", "gen_throughput")


@dataclass
class _Sampler:
    """One background thread calling ``take`` every ``interval`` seconds until stopped; ``take`` returns the
    sample to keep (stamped with time.perf_counter()) or None."""

    name: str
    interval: float
    take: Callable[[], Any]
    samples: list[tuple[float, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join; one last sample is taken on the way out, so the round's end is covered."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=SMI_TIMEOUT_SECONDS + SCRAPE_TIMEOUT_S)

    def _run(self) -> None:
        deadline = time.perf_counter() + MAX_ROUND_S
        while True:
            self._keep()
            if self._stop.wait(self.interval) or time.perf_counter() > deadline:
                self._keep()
                return

    def _keep(self) -> None:
        value = self.take()
        if value is not None:
            self.samples.append((time.perf_counter(), value))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tree(pid: int) -> tuple[set[int], dict[str, str]]:
    """The pids of ``pid``'s tree and the root's environment (empty where it cannot be read)."""
    pids = {pid}
    env: dict[str, str] = {}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        pids.update(child.pid for child in root.children(recursive=True))
        env = root.environ()
    return pids, env


def server_gpus(pid: int | None) -> tuple[list[int] | None, str]:
    """The GPUs of the server whose root is ``pid`` on this machine (None: every GPU), and how that was found."""
    pids, env = _tree(pid) if pid is not None else (set(), {})
    held = [use.index for use in gpu_processes() or [] if use.pid in pids and use.index is not None]
    return pick_gpus(held, env.get("CUDA_VISIBLE_DEVICES") if env else os.environ.get("CUDA_VISIBLE_DEVICES"))


class GpuSource(Protocol):
    """The readings of a server's GPUs, from the machine it runs on: ``read`` once, or ``start`` sampling about
    every GPU_INTERVAL_S and ``stop`` for the round's readings, each stamped in this machine's perf_counter."""

    @property
    def source(self) -> str:
        """nvml | nvidia-smi"""

    @property
    def host(self) -> str | None:
        """The ssh host the GPUs are on; None: this machine."""

    @property
    def gpus(self) -> list[int] | None: ...

    @property
    def gpus_from(self) -> str: ...

    def read(self) -> list[GpuReading] | None: ...

    def start(self) -> None: ...

    def stop(self) -> list[tuple[float, list[GpuReading]]]: ...

    def close(self) -> None: ...


class LocalGpus:
    """This machine's GPUs of the server whose root is ``pid``: a :class:`_Sampler` thread over a GpuReader."""

    host: str | None = None

    def __init__(self, reader: GpuReader, pid: int | None) -> None:
        assert reader.source is not None
        self.source, self._reader = reader.source, reader
        self.gpus, self.gpus_from = server_gpus(pid)
        self._sampler = _Sampler("sglang-telemetry-gpu", GPU_INTERVAL_S, self.read)

    def read(self) -> list[GpuReading] | None:
        return self._reader.read(self.gpus) or None

    def start(self) -> None:
        self._sampler.samples = []
        self._sampler.start()

    def stop(self) -> list[tuple[float, list[GpuReading]]]:
        self._sampler.stop()
        return list(self._sampler.samples)

    def close(self) -> None:
        self._reader.close()


def open_gpus(*, pid: int | None, elsewhere: str | None, remote: RemoteServer | None) -> GpuSource | str:
    """The GPU source of the server (whose root is ``pid`` here, or ``remote`` on its ssh host, or on the machine
    ``elsewhere``), or why its GPUs cannot be read."""
    choice = env_knobs().gpu_query
    if choice == "off":
        return f"no GPU to ask: {GPU_QUERY_ENV}=off"
    if remote is not None:
        try:
            return HostGpus.open(remote, query=choice, interval=GPU_INTERVAL_S)
        except RemoteError as exc:
            return str(exc)
    if elsewhere:
        return (f"the server runs on {elsewhere}, not this machine: its GPUs are read only here or on the ssh "
                "host of an ssh profile (through the agent)")
    reader = GpuReader()
    if reader.source is None:
        return "no GPU to ask: no NVML (pip install 'pytest-sglang[gpu]') and no nvidia-smi on PATH"
    return LocalGpus(reader, pid)


class Telemetry:
    """The runner's sampler: :meth:`round_started` / :meth:`round_ended` around each measured round, then
    :meth:`apply` writes each round's figures and :meth:`series` gives the time series; :meth:`close` at the
    end, whatever happened."""

    def __init__(self, *, base_url: str, api_key: str | None, host: str | None, pid: int | None, kind: str,
                 ssh_host: str | None = None, remote: RemoteServer | None = None, enabled: bool = True) -> None:
        self.gpus: list[int] | None = None
        self.gpus_from: str | None = None
        self.gpu_unmeasured: str | None = None
        self.server_unmeasured: str | None = None
        self._gpu: GpuSource | None = None
        self._server: _Sampler | None = None
        self._client: Client | None = None
        self.windows: list[tuple[float, float]] = []  # each round's samplers' start and stop
        self.round_gpu: list[list[tuple[float, list[GpuReading]]]] = []
        self.round_server: list[list[tuple[float, dict[str, float]]]] = []
        if not enabled:
            self.gpu_unmeasured = self.server_unmeasured = "telemetry was turned off (telemetry=False)"
            return
        self._open_gpus(pid, ssh_host or (host if host is not None and not _loopback(host) else None), remote)
        self._client = Client(base_url, api_key=api_key, timeout=SCRAPE_TIMEOUT_S)  # the sampler thread's own
        first = scrape(self._client, timeout=SCRAPE_TIMEOUT_S)
        self.family = first.family if first is not None else None
        if first is None:
            hint = " (SGLang serves it with --enable-metrics in the profile's args)" if kind == "sglang" else ""
            self.server_unmeasured = f"the server at {base_url} has no /metrics{hint}"
        else:
            self._server = _Sampler("sglang-telemetry-server", SERVER_INTERVAL_S, self._gauges)

    def _open_gpus(self, pid: int | None, elsewhere: str | None, remote: RemoteServer | None) -> None:
        source = open_gpus(pid=pid, elsewhere=elsewhere, remote=remote)
        if isinstance(source, str):
            self.gpu_unmeasured = source
            return
        self.gpus, self.gpus_from = source.gpus, source.gpus_from
        if source.read() is None:
            where = f" on {source.host}" if source.host else ""
            self.gpu_unmeasured = f"{source.source}{where} did not answer for GPUs {self._gpu_names()}"
            source.close()
            return
        self._gpu = source

    def _gpu_names(self) -> str:
        return "all" if self.gpus is None else ",".join(map(str, self.gpus))

    def _gauges(self) -> dict[str, float] | None:
        snap = scrape(self._client, timeout=SCRAPE_TIMEOUT_S)
        return dict(snap.gauges) if snap is not None and snap.gauges else None

    def round_started(self) -> None:
        if self._gpu is not None:
            self._gpu.start()
        if self._server is not None:
            self._server.samples = []
            self._server.start()
        self.windows.append((time.perf_counter(), math.nan))

    def round_ended(self) -> None:
        if not self.windows or not math.isnan(self.windows[-1][1]):
            return
        self.round_gpu.append(self._gpu.stop() if self._gpu is not None else [])
        if self._server is not None:
            self._server.stop()
        self.windows[-1] = (self.windows[-1][0], time.perf_counter())
        self.round_server.append(list(self._server.samples) if self._server else [])

    def close(self) -> None:
        self.round_ended()
        if self._gpu is not None:
            self._gpu.close()
        if self._client is not None:
            self._client.close()

    def apply(self, rounds: Sequence[BenchResult]) -> list[BenchResult]:
        """Each round with its figures (metrics.GPU_FIGURES, SERVER_FIGURES) and why those left None are, a new
        result of each."""
        if self.server_unmeasured is None and not any(self.round_server):
            self.server_unmeasured = "the server's /metrics has none of the running/queued/KV-cache gauges"
        out = []
        for k, one in enumerate(rounds):
            figures: dict[str, Any] = {"gpu_unmeasured": self.gpu_unmeasured,
                                       "server_unmeasured": self.server_unmeasured}
            if k < len(self.round_gpu):
                lo, hi = _measured_window(one)
                if self.gpu_unmeasured is None and self.round_gpu[k]:
                    figures.update(_gpu_figures(one.total_output_tokens, self.round_gpu[k], lo, hi))
                if self.server_unmeasured is None and self.round_server[k]:
                    gauges = [g for _, g in self.round_server[k]]
                    kv = [g["kv_usage"] for g in gauges if "kv_usage" in g]
                    figures.update(server_queue_mean=_mean([g.get("queued") for g in gauges]),
                                   server_kv_usage_peak=max(kv) if kv else None)
            out.append(one.with_figures(**figures))
        return out

    def series(self, rounds: Sequence[Any]) -> dict[str, Any] | None:
        """The report's ``telemetry``: seconds from the first round's start; None where nothing was sampled."""
        if not self.windows or (not any(self.round_gpu) and not any(self.round_server)):
            return None
        origin = self.windows[0][0]

        def rel(t: float) -> float:
            return round(t - origin, 4)

        gpu_t = [t for samples in self.round_gpu for t, _ in samples]
        per_gpu: dict[int, dict[str, list[float | None]]] = {}
        for samples in self.round_gpu:
            for _, readings in samples:
                for reading in readings:
                    per_gpu.setdefault(reading.index, {name: [] for name in _READING_FIELDS})
        for samples in self.round_gpu:
            for _, readings in samples:
                by_index = {r.index: r for r in readings}
                for index, columns in per_gpu.items():
                    found = by_index.get(index)
                    for name in _READING_FIELDS:
                        columns[name].append(getattr(found, name) if found else None)
        server_t = [t for samples in self.round_server for t, _ in samples]
        server = {name: [g.get(name) for samples in self.round_server for _, g in samples] for name in _GAUGE_FIELDS}
        return {
            "rounds": [[rel(lo), rel(hi)] for lo, hi in (_measured_window(one) for one in rounds)],
            "gpu": None if not gpu_t else {"source": self._gpu.source if self._gpu else None,
                                           "host": self._gpu.host if self._gpu else None,
                                           "gpus_from": self.gpus_from, "t": [rel(t) for t in gpu_t],
                                           "gpus": {str(i): cols for i, cols in sorted(per_gpu.items())}},
            "server": None if not server_t else {"family": self.family, "t": [rel(t) for t in server_t],
                                                 **{k: v for k, v in server.items() if any(x is not None for x in v)}},
            "gpu_unmeasured": self.gpu_unmeasured,
            "server_unmeasured": self.server_unmeasured,
        }
