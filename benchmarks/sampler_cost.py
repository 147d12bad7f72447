"""What the telemetry sampler itself costs (issue 20 point 1): CPU per second of sampling, each source alone, and
the simulator's tok/s with the sampler and without it, interleaved.

    python benchmarks/sampler_cost.py [--cpu-seconds 2] [--cpu-reps 3] [--blocks 4] [--json-out costs.json]

CPU: each GPU source the machine has (NVML where nvidia-ml-py imports and a driver answers; the real
nvidia-smi on PATH; else the tests' fake nvidia-smi, a Python script, tests/helpers.py) runs as the telemetry
runs it (bench/telemetry.py's ``open_gpus``: the sampler thread at GPU_INTERVAL_S, all GPUs), and the /metrics
scraper as a Telemetry with the GPUs off samples the simulator's gauges (SERVER_INTERVAL_S). Each is opened
first (its first query, an NVML session: once per benchmark in a run, not per second), then samples for
``--cpu-seconds``, ``--cpu-reps`` times, interleaved with idle stretches of the same length; the figure is the
CPU this process used (RUSAGE_SELF) and its children (RUSAGE_CHILDREN: the nvidia-smi calls) beyond idle, per
second of sampling, and for the scraper the simulator's CPU beyond idle too (its answers). Medians of the reps.

tok/s: ``run_bench`` on one simulator (with --enable-metrics, so the scraper has gauges) with
``telemetry=False`` (A) and ``telemetry=True`` (B: the machine's best GPU source and the scraper, what a user
gets), ``--blocks`` blocks of A B B A / B A A B alternately, one round each; each block's first two runs and
last two are a pair. The ratio B/A is judged by the plugin's own paired engine (baseline/engine.py's
``judge_paired``: the median of the paired ratios, its Hodges-Lehmann interval and the signed-rank p-value,
stats/inference.py). One client process (``client_processes=1``), so the sampler shares the client's process as
it does in a test. Under 90 s with the defaults on a 16-core host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_sglang.baseline.engine import judge_paired  # noqa: E402
from pytest_sglang.bench import run_bench  # noqa: E402
from pytest_sglang.bench.telemetry import Telemetry, open_gpus  # noqa: E402
from pytest_sglang.envknobs import GPU_QUERY_ENV  # noqa: E402
from pytest_sglang.machine.gpus import GpuReader  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from client_ceiling import exit_on_signal, start_sim, stop_sims  # noqa: E402


@contextlib.contextmanager
def simulator(knobs: dict[str, Any], log: Path) -> Iterator[tuple[str, psutil.Process]]:
    """One simulator with /metrics (client_ceiling's: it dies with this script, however it dies)."""
    proc, url = start_sim(knobs, log, extra=["--enable-metrics"])
    try:
        yield url, psutil.Process(proc.pid)
    finally:
        stop_sims([proc])


@contextlib.contextmanager
def gpu_query(value: str | None, extra: dict[str, str] | None = None) -> Iterator[None]:
    """PYTEST_SGLANG_GPU_QUERY (and ``extra``) set for the block; restored after."""
    names = {GPU_QUERY_ENV: value, **(extra or {})}
    saved = {name: os.environ.get(name) for name in names}
    for name, v in names.items():
        if v is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = v
    try:
        yield
    finally:
        for name, v in saved.items():
            if v is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = v


def gpu_sources(workdir: Path) -> list[tuple[str, str, dict[str, str]]]:
    """(label, PYTEST_SGLANG_GPU_QUERY, extra environment) of each GPU source this machine has."""
    found: list[tuple[str, str, dict[str, str]]] = []
    with gpu_query("nvml"):
        reader = GpuReader()
        if reader.source == "nvml":
            found.append(("NVML", "nvml", {}))
        reader.close()
    if shutil.which("nvidia-smi"):
        found.append(("nvidia-smi", "nvidia-smi", {}))
    else:
        sys.path.insert(0, str(REPO / "tests"))
        from helpers import FakeGpu  # the tests' fake: only where there is no real one

        fake = FakeGpu(workdir)
        fake.read_as(0, **{"power.draw": 300.0})
        found.append(("nvidia-smi (the tests' fake: a Python script)", "nvidia-smi", fake.env()))
    return found


def cpu_now(server: psutil.Process | None) -> tuple[float, float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    served = sum(server.cpu_times()[:2]) if server is not None else 0.0
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, served


class Subject(Protocol):
    """One sampler, opened outside the measured stretch (its first query, an NVML session), sampling inside it."""

    label: str

    def open(self) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> int:
        """Stop and close; how many samples it took."""


@dataclass
class GpuSampler:
    """A GPU source as the telemetry opens it (``open_gpus``: this machine, all GPUs) and samples with it."""

    label: str
    query: str
    extra: dict[str, str]
    source: Any = None
    _env: contextlib.ExitStack[bool | None] = field(default_factory=contextlib.ExitStack)

    def open(self) -> None:
        with gpu_query(self.query, self.extra):
            source = open_gpus(pid=None, elsewhere=None, remote=None)
        if isinstance(source, str):
            raise SystemExit(f"{self.label}: {source}")
        self.source = source

    def start(self) -> None:
        # nvidia-smi's PATH and the fake's files stay set while the thread runs: it reads them at every call
        self._env = contextlib.ExitStack()
        self._env.enter_context(gpu_query(self.query, self.extra))
        self.source.start()

    def stop(self) -> int:
        samples = self.source.stop()
        self.source.close()
        self._env.close()
        return len(samples)


@dataclass
class Scraper:
    """The /metrics scraper: a Telemetry with the GPUs off, one round."""

    url: str
    label: str = "/metrics scraper"
    tel: Any = None

    def open(self) -> None:
        with gpu_query("off"):
            self.tel = Telemetry(base_url=self.url, api_key=None, host="127.0.0.1", pid=None, kind="sglang")

    def start(self) -> None:
        self.tel.round_started()

    def stop(self) -> int:
        self.tel.round_ended()
        self.tel.close()
        return len(self.tel.round_server[-1])


def cpu_during(seconds: float, server: psutil.Process, subject: Subject | None) -> tuple[float, float, float, int]:
    """CPU of (this process, its children, the server) over ``seconds`` with ``subject`` sampling (None: idle),
    and its samples."""
    if subject is not None:
        subject.open()
    before = cpu_now(server)
    if subject is not None:
        subject.start()
    time.sleep(seconds)
    samples = subject.stop() if subject is not None else 0
    after = cpu_now(server)
    return after[0] - before[0], after[1] - before[1], after[2] - before[2], samples


def measure_cpu(args: argparse.Namespace, url: str, server: psutil.Process,
                sources: list[tuple[str, str, dict[str, str]]]) -> list[dict[str, Any]]:
    subjects: list[Subject] = [GpuSampler(label, query, extra) for label, query, extra in sources]
    subjects.append(Scraper(url))
    rows: dict[str, list[tuple[float, float, float, int]]] = {subject.label: [] for subject in subjects}
    idle: list[tuple[float, float, float, int]] = []
    for _ in range(args.cpu_reps):
        idle.append(cpu_during(args.cpu_seconds, server, None))
        for subject in subjects:
            rows[subject.label].append(cpu_during(args.cpu_seconds, server, subject))
    base = [statistics.median(x[k] for x in idle) for k in range(3)]
    out = []
    for label, runs in rows.items():
        extra = [(statistics.median(r[k] for r in runs) - base[k]) / args.cpu_seconds for k in range(3)]
        out.append({"source": label, "self_cpu_per_s": extra[0], "children_cpu_per_s": extra[1],
                    "server_cpu_per_s": extra[2],
                    "samples_per_s": statistics.median(r[3] for r in runs) / args.cpu_seconds,
                    "reps_cpu_s": [[round(v, 4) for v in r[:3]] for r in runs]})
    return out


def measure_tok_s(args: argparse.Namespace, url: str, source: tuple[str, str, dict[str, str]]) -> dict[str, Any]:
    label, query, extra = source
    runs: dict[bool, list[float]] = {False: [], True: []}
    for block in range(args.blocks):
        for telemetry in ((False, True, True, False) if block % 2 == 0 else (True, False, False, True)):
            with gpu_query(query, extra):
                r = run_bench(url, num_requests=args.requests, concurrency=args.concurrency, input_len=args.input_len,
                              output_len=args.output_len, warmup=args.warmup, telemetry=telemetry, client_processes=1)
            if telemetry and r.gpu_unmeasured:
                raise SystemExit(f"the sampler did not read the GPUs: {r.gpu_unmeasured}")
            runs[telemetry].append(r.output_throughput)
    off, on = runs[False], runs[True]  # A B B A and B A A B: the k-th of each side are adjacent, a pair
    judged = judge_paired("output_throughput", off, on, None, first_label="off", second_label="on")
    return {"gpu_source": label, "off_tok_s": off, "on_tok_s": on,
            "ratios": [b / a for a, b in zip(off, on, strict=True)], "off_median": statistics.median(off),
            "on_median": statistics.median(on), "ratio": judged.ratio, "ci95": judged.ci,
            "p_one_sided": judged.p_value, "pairs": judged.pairs, "message": judged.message}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    return (f"{cpu}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, Python {platform.python_version()}")


def print_results(results: dict[str, Any]) -> None:
    print(f"machine: {results['machine']}")
    print("| source | sampler CPU-s/s (its thread) | children CPU-s/s (nvidia-smi) | server CPU-s/s | readings/s |")
    print("|---|---|---|---|---|")
    for row in results["cpu"]:
        print(f"| {row['source']} | {row['self_cpu_per_s']:.4f} | {row['children_cpu_per_s']:.4f} | "
              f"{row['server_cpu_per_s']:.4f} | {row['samples_per_s']:.1f} |")
    tok = results["tok_s"]
    ci = f"95% {tok['ci95'][0]:.4f}-{tok['ci95'][1]:.4f}" if tok["ci95"] else "no interval under 6 pairs"
    print(f"\ntok/s, telemetry on ({tok['gpu_source']} + /metrics) over off, {tok['pairs']} pairs: "
          f"ratio {tok['ratio']:.4f} ({ci}, one-sided p {tok['p_one_sided']:.3f}); "
          f"medians on {tok['on_median']:.1f}, off {tok['off_median']:.1f}")
    print("pairs (on/off): " + " ".join(f"{r:.3f}" for r in tok["ratios"]))
    print(f"took {results['seconds']:.1f} s; load average after {results['load_after']:.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-seconds", type=float, default=2.0, help="each source's sampling stretch")
    ap.add_argument("--cpu-reps", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=4, help="A B B A blocks of the tok/s comparison (2 pairs each)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--decode-tok-s", type=float, default=100.0, help="the simulator's pace per request")
    ap.add_argument("--tok-s-source", choices=("nvml", "nvidia-smi"), default=None,
                    help="the GPU source of the tok/s comparison's sampler (default: the best the machine has)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, exit_on_signal)
    knobs = {"startup_seconds": 0.2, "decode_tok_s": args.decode_tok_s, "ttft_ms": 20, "max_batch": 4096}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sampler-cost-") as tmp, \
            simulator(knobs, Path(tmp) / "sim.log") as (url, server):
        sources = gpu_sources(Path(tmp))
        chosen = next((s for s in sources if args.tok_s_source in (None, s[1])), None)
        if chosen is None:
            raise SystemExit(f"--tok-s-source {args.tok_s_source}: this machine has only "
                             f"{', '.join(label for label, _, _ in sources)}")
        results: dict[str, Any] = {"machine": machine(), "args": vars(args),
                                   "cpu": measure_cpu(args, url, server, sources),
                                   "tok_s": measure_tok_s(args, url, chosen)}
    results["seconds"] = time.monotonic() - started
    results["load_after"] = os.getloadavg()[0]
    print_results(results)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
