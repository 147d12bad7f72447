"""GPU and server telemetry during the rounds (issue 20 points 1, 2 and 4), without a GPU: a fake nvidia-smi on
PATH (tests/helpers.py FakeGpu) answering --query-gpu for the fields asked, and the simulator's /metrics
gauges following its load. Energy per token is checked against the fake's power, the measured duration and
the tokens of the result itself."""

from __future__ import annotations

import json
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import types
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import BUSY_GPU, IDLE_GPU, FakeGpu, assert_energy_is_power_over_duration

from pytest_sglang.baseline import BaselineStore, Machine, compare
from pytest_sglang.bench import run_bench
from pytest_sglang.bench.metrics import GPU_FIGURES, SERVER_FIGURES, BenchResult, combine_rounds
from pytest_sglang.bench.server_metrics import snapshot
from pytest_sglang.bench.telemetry import Telemetry, _gpu_figures, _integral, server_gpus
from pytest_sglang.machine.gpus import GpuReader, GpuReading

from .simproc import run_sim

pytestmark = pytest.mark.timeout(120)

SIM = {"decode_tok_s": 40, "ttft_ms": 20, "max_batch": 4}


@pytest.fixture
def fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    gpu = FakeGpu(tmp_path).install(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu.read_as(0, **IDLE_GPU)
    gpu.read_as(1, **BUSY_GPU)
    return gpu


def _samplers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("sglang-telemetry")]


def test_the_gauges_in_either_servers_names() -> None:
    sglang = snapshot('sglang:num_running_reqs{tp_rank="0",dp_rank="0"} 3\nsglang:num_running_reqs{dp_rank="1"} 2\n'
                      'sglang:num_queue_reqs 7\nsglang:token_usage{dp_rank="0"} 0.4\nsglang:token_usage 0.9\n'
                      'sglang:gen_throughput 1234.5\n')
    assert sglang is not None
    assert sglang.gauges == {"running": 5.0, "queued": 7.0, "kv_usage": 0.9, "gen_throughput": 1234.5}
    old_vllm = snapshot('vllm:num_requests_running{engine="0"} 4\nvllm:num_requests_waiting 1\n'
                        'vllm:gpu_cache_usage_perc 0.25\n')
    assert old_vllm is not None and old_vllm.gauges == {"running": 4.0, "queued": 1.0, "kv_usage": 0.25}


def test_the_servers_gpus_from_its_pids_else_its_visible_devices(
    fake_gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    with subprocess.Popen(["sleep", "60"]) as server:
        try:
            assert server_gpus(server.pid)[0] is None  # neither says: every GPU
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
            assert server_gpus(None) == ([1], "CUDA_VISIBLE_DEVICES")
            fake_gpu.hold(server.pid)  # the fake reports its compute apps on GPU 0
            assert server_gpus(server.pid) == ([0], "held by the server's processes")
        finally:
            server.kill()


def test_energy_per_token_is_the_servers_gpu_power_over_the_measured_duration(
    fake_gpu: FakeGpu, tmp_path: Path
) -> None:
    with run_sim(tmp_path, SIM, "--enable-metrics", env={"CUDA_VISIBLE_DEVICES": "1"}) as sim:
        r = run_bench(sim, num_requests=8, concurrency=8, input_len=16, output_len=40, warmup=1, rounds=2)
    assert not _samplers()
    power = BUSY_GPU["power.draw"]  # only GPU 1 is the server's; GPU 0 idles at another power
    assert_energy_is_power_over_duration(r, power)
    assert r.gpu_power_mean_w == pytest.approx(power)
    assert (r.gpu_util_mean_pct, r.gpu_memory_peak_mib, r.gpu_sm_clock_mean_mhz) == (
        BUSY_GPU["utilization.gpu"], BUSY_GPU["memory.used"], BUSY_GPU["clocks.sm"])
    assert r.energy_per_output_token_j == statistics.median(one.energy_per_output_token_j for one in r.rounds)
    # 8 in flight, 4 batch slots, two waves of a second: the server's gauges (every 1/3 s; a loaded runner's scrape
    # can come late) saw a queue and a full KV cache
    assert all(one.server_kv_usage_peak == 1.0 and (one.server_queue_mean or 0) > 0 for one in r.rounds)
    assert r.gpu_unmeasured is None and r.server_unmeasured is None
    series = r.telemetry
    assert series is not None and len(series["rounds"]) == 2
    gpu = series["gpu"]
    assert gpu["source"] == "nvidia-smi" and gpu["gpus_from"] == "CUDA_VISIBLE_DEVICES" and list(gpu["gpus"]) == ["1"]
    assert len(gpu["t"]) == len(gpu["gpus"]["1"]["power_w"]) >= 4
    assert set(gpu["gpus"]["1"]["power_w"]) == {power}
    assert series["server"]["family"] == "sglang" and max(series["server"]["running"]) == SIM["max_batch"]
    assert any("--query-gpu=index,utilization.gpu,memory.used,power.draw,clocks.sm,temperature.gpu" in q
               and "--id=1" in q for q in fake_gpu.queries())


def test_without_a_gpu_or_metrics_the_figures_are_none_and_a_check_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_SGLANG_GPU_QUERY", "off")
    with run_sim(tmp_path, SIM) as sim:  # SGLang without --enable-metrics
        r = run_bench(sim, num_requests=4, concurrency=4, input_len=8, output_len=8)
    assert all(getattr(r, m) is None for m in (*GPU_FIGURES, *SERVER_FIGURES)), r.to_dict()
    assert r.gpu_unmeasured == "no GPU to ask: PYTEST_SGLANG_GPU_QUERY=off"
    assert r.server_unmeasured is not None and "--enable-metrics" in r.server_unmeasured
    assert r.telemetry is None
    store = BaselineStore(tmp_path / "baselines.json")
    machine = Machine("cpu: test")
    store.record("sim", "t", machine, {"energy_per_output_token_j": [0.5], "output_throughput": [100.0]})
    comp = compare(r, {"energy_per_output_token_j": "5%", "server_queue_mean": 1}, store=store, profile="sim",
                   test_id="t", machine=machine)
    by_metric = {c.metric: c for c in comp.checks}
    assert by_metric["energy_per_output_token_j"].status == "not-judged"
    assert by_metric["energy_per_output_token_j"].reason == r.gpu_unmeasured
    assert by_metric["server_queue_mean"].status == "not-judged" and comp.gate == "not-judged"
    assert not comp.failed


PLUGIN_TESTS = '''
def test_energy(sglang_bench, sglang_baseline):
    r = sglang_bench(num_requests=8, concurrency=8, input_len=8, output_len=6, rounds=2)
    assert r.energy_per_output_token_j is not None
    sglang_baseline.check(r, output_throughput="50%", energy_per_output_token_j="50%", max_cv="50%")
'''


def test_figures_reach_the_table_junit_summary_report_and_page(
    pytester: pytest.Pytester, fake_gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_SGLANG_MACHINE", "test-machine")
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.makefile(".toml", pyproject=(
        '[tool.pytest_sglang.profiles.p]\nmodel = "sim-model"\nargs = ["--enable-metrics"]\n'
        'env = { CUDA_VISIBLE_DEVICES = "1" }\n'
        "sim = { startup_seconds = 0.3, decode_tok_s = 16, ttft_ms = 5, max_batch = 4 }\n"))  # never client-bound
    pytester.makepyfile(test_perf=PLUGIN_TESTS)

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", "--sglang-profile=p", *args,
                                             timeout=120)

    run("--sglang-update-baseline").assert_outcomes(passed=1)
    report = pytester.path / "report.json"
    out = run(f"--sglang-report={report}", "--junitxml=junit.xml")
    out.assert_outcomes(passed=1)
    out.stdout.fnmatch_lines(["telemetry: p test_energy: * J/output token (* tok/J), GPU util 87%, 412 W, "
                              "71000 MiB peak, SM 1980 MHz, queue *, KV peak *%"])
    bench = json.loads(report.read_text())["profiles"]["p"]["benchmarks"][0]
    assert bench["gate"] == "passed"
    assert bench["baseline"]["energy_per_output_token_j"]["status"] == "ok"
    r = bench["result"]
    assert r["gpu_energy_source"] == "power_integral"  # nvidia-smi offers no energy counter
    assert r["energy_per_output_token_j"] == pytest.approx(r["gpu_power_mean_w"] * r["duration"]
                                                           / r["total_output_tokens"], rel=0.05)
    assert list(bench["telemetry"]["gpu"]["gpus"]) == ["1"] and len(bench["telemetry"]["rounds"]) == 2
    junit = (pytester.path / "junit.xml").read_text()
    assert f'name="sglang_energy_per_output_token_j" value="{r["energy_per_output_token_j"]}"' in junit
    assert 'name="sglang_baseline_energy_per_output_token_j"' in junit
    assert "- p test_energy: " in summary.read_text() and "J/output token" in summary.read_text()
    page = report.with_suffix(".html")
    text = page.read_text()
    assert "GPU utilisation (%)" in text and "server: KV-cache usage (%)" in text
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return  # the page's markup is checked above; CI images without a browser stop here
    shot = pytester.path / "page.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1000,1600", page.as_uri()], capture_output=True, timeout=60, check=True)
    pixels = _png_pixels(shot)
    first_line_color = (0x1F, 0x77, 0xB4)  # timeseries._COLORS[0]: GPU 1's lines, the server's running line
    assert sum(1 for row in pixels for px in row if px[:3] == first_line_color) > 500


def _png_pixels(path: Path) -> list[list[tuple[int, ...]]]:
    """The RGB(A) rows of an 8-bit truecolour PNG (what Chromium writes): enough to count a colour's pixels."""
    data = path.read_bytes()
    pos, idat, width, height, channels = 8, b"", 0, 0, 3
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            channels = 4 if color == 6 else 3
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[list[tuple[int, ...]]] = []
    prev = bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append([tuple(line[x:x + channels]) for x in range(0, stride, channels)])
        prev = line
    return rows


FAKE_NVML = '''
"""nvidia-ml-py's names, answering for two GPUs; GPU 1's clock is not supported (MIG, some boards)."""
NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0
class NVMLError(Exception):
    pass
class _Util:
    def __init__(self, gpu): self.gpu = gpu
class _Memory:
    def __init__(self, used): self.used = used
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetUtilizationRates(h): return _Util(40 + h)
def nvmlDeviceGetMemoryInfo(h): return _Memory((1000 + h) * 1024 * 1024)
def nvmlDeviceGetPowerUsage(h): return 250500 + h  # milliwatts
def nvmlDeviceGetClockInfo(h, kind):
    if h == 1:
        raise NVMLError("Not Supported")
    return 1755
def nvmlDeviceGetTemperature(h, kind): return 44
'''


def test_nvml_readings_when_the_gpu_extra_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pynvml.py").write_text(FAKE_NVML)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTEST_SGLANG_GPU_QUERY", "nvml")
    with GpuReader() as reader:
        assert reader.source == "nvml"
        assert reader.read([1]) == [GpuReading(1, 41.0, 1001.0, 250.501, None, 44.0)]
        assert [r.index for r in reader.read() or []] == [0, 1]


def test_the_power_integral_is_exact_for_a_ramp_and_held_past_the_readings() -> None:
    ramp = [(float(t), 100.0 + 10.0 * t) for t in range(11)]  # 100 W rising 10 W a second
    assert _integral(ramp, 2.5, 7.5) == pytest.approx(5.0 * (100.0 + 10.0 * 5.0))  # mean of a line: its midpoint
    assert _integral(ramp, -1.0, 0.0) == pytest.approx(100.0)  # before the first reading: held
    assert _integral([(1.0, 300.0)], 0.0, 4.0) == pytest.approx(1200.0)


def test_a_server_on_another_machine_is_not_sampled_here(fake_gpu: FakeGpu) -> None:
    for where in ({"ssh_host": "gpu-box", "host": "127.0.0.1"}, {"host": "10.1.2.3"}):  # through ssh -L, or direct
        tel = Telemetry(base_url="http://127.0.0.1:9", api_key=None, pid=None, kind="sglang", **where)
        try:
            assert tel.gpu_unmeasured is not None and "not this machine" in tel.gpu_unmeasured
            assert (where.get("ssh_host") or where["host"]) in tel.gpu_unmeasured
        finally:
            tel.close()
    assert not any("--query-gpu=index,utilization" in q for q in fake_gpu.queries())


# The GPU's own energy counter (issue 26 point 1): NVML's total energy in mJ, here counting 310 W on each GPU
# while the power it reports says 250.5 W (an average that lags, as a real GPU's does after a ramp).
COUNTING_NVML = FAKE_NVML + '''
import time
_T0 = time.perf_counter()
def nvmlDeviceGetTotalEnergyConsumption(h):
    return int(7_000_000 + 310_000 * (time.perf_counter() - _T0))  # mJ since the "driver" loaded
'''
UNSUPPORTED_NVML = FAKE_NVML + '''
class NVMLError_NotSupported(NVMLError):
    pass
def nvmlDeviceGetTotalEnergyConsumption(h):
    raise NVMLError_NotSupported("Not Supported")  # a pre-Volta GPU, a vGPU
'''


@pytest.mark.parametrize(("nvml", "source", "watts"), [
    (COUNTING_NVML, "counter", 310.0),
    (FAKE_NVML, "power_integral", 250.501),  # an nvidia-ml-py without the function
    (UNSUPPORTED_NVML, "power_integral", 250.501),
], ids=["counter", "no-function", "not-supported"])
def test_energy_from_the_gpus_counter_where_it_has_one_else_the_power_integral(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nvml: str, source: str, watts: float
) -> None:
    fake = types.ModuleType("pynvml")
    exec(compile(nvml, "fake_pynvml.py", "exec"), fake.__dict__)  # noqa: S102 - the test's own fake module
    monkeypatch.setitem(sys.modules, "pynvml", fake)  # and gone again after the test
    monkeypatch.setenv("PYTEST_SGLANG_GPU_QUERY", "nvml")
    with run_sim(tmp_path, SIM, env={"CUDA_VISIBLE_DEVICES": "1"}) as sim:
        r = run_bench(sim, num_requests=4, concurrency=4, input_len=8, output_len=12, rounds=2)
    assert r.gpu_unmeasured is None and r.telemetry is not None and list(r.telemetry["gpu"]["gpus"]) == ["1"]
    for one in r.rounds:
        assert one.gpu_energy_source == source
        # the counter is exact to its millijoule and the readings' stamps; the integral of a constant power exact
        assert one.gpu_energy_j == pytest.approx(watts * one.duration, rel=2e-3, abs=2e-3)
        assert one.gpu_power_mean_w == pytest.approx(watts, rel=2e-3, abs=2e-3)
    report = r.to_dict()
    assert report["gpu_energy_source"] == source
    assert [one["gpu_energy_source"] for one in report["rounds"]] == [source, source]


def _samples(counter: list[float | None], power: float = 300.0, index: int = 0) -> list[tuple[float, list[GpuReading]]]:
    """A reading a second from t=0, GPU ``index`` reporting ``power`` W and the counter values (mJ) given."""
    return [(float(t), [GpuReading(index, 50.0, 1000.0, power, 1980.0, 50.0, energy)])
            for t, energy in enumerate(counter)]


def test_the_counter_is_read_at_the_windows_edges_and_summed_over_the_gpus() -> None:
    gpu0 = _samples([1_000_000, 1_400_000, 1_800_000, 2_200_000])  # 400 W by its counter, 300 W by its power
    gpu1 = _samples([9_000_000, 9_100_000, 9_200_000, 9_300_000], power=100.0, index=1)  # 100 W
    both = [(t, a + b) for (t, a), (_, b) in zip(gpu0, gpu1, strict=True)]
    one = SimpleNamespace(**_gpu_figures(100, both, 0.5, 2.5))  # edges between readings: the counters interpolated
    assert one.gpu_energy_source == "counter"
    assert one.gpu_energy_j == pytest.approx(2.0 * (400 + 100))
    assert one.gpu_power_mean_w == pytest.approx(500.0) and one.energy_per_output_token_j == pytest.approx(10.0)


@pytest.mark.parametrize(("counter", "why"), [
    ([1_000_000, 1_300_000, 5_000, 305_000], "went backwards: the driver reloaded"),
    ([2.0**64 - 200_000, 2.0**64 - 100_000, 100_000, 400_000], "wrapped"),
    ([1_000_000, 1_000_000, 1_000_000, 1_000_000], "stood still while the GPU drew power"),
    ([1_000_000, None, 1_600_000, 1_900_000], "one reading without it"),
    ([1_000_000, 1_300_000], "does not reach the window's end"),
])
def test_a_counter_that_cannot_be_trusted_over_the_round_falls_back_to_the_power_integral(
    counter: list[float | None], why: str
) -> None:
    one = SimpleNamespace(**_gpu_figures(100, _samples(counter), 0.0, 3.0))
    if why == "one reading without it":  # a reading that missed the counter once: the others still bracket it
        assert one.gpu_energy_source == "counter" and one.gpu_energy_j == pytest.approx(900.0), why
        return
    assert one.gpu_energy_source == "power_integral", why
    assert one.gpu_energy_j == pytest.approx(300.0 * 3.0), why


def test_a_gpu_without_a_counter_beside_one_with_makes_the_round_integrate_the_power() -> None:
    gpu0 = _samples([0, 400_000, 800_000, 1_200_000])
    gpu1 = _samples([None, None, None, None], power=100.0, index=1)
    both = [(t, a + b) for (t, a), (_, b) in zip(gpu0, gpu1, strict=True)]
    one = SimpleNamespace(**_gpu_figures(10, both, 0.0, 3.0))
    assert (one.gpu_energy_source, one.gpu_energy_j) == ("power_integral", pytest.approx(3.0 * 400.0))


def test_the_headline_says_mixed_where_rounds_found_their_energy_differently() -> None:
    rounds = [BenchResult(output_throughput=float(k), gpu_energy_j=10.0 + k, gpu_energy_source=s)
              for k, s in enumerate(("counter", "power_integral", "counter"))]
    assert combine_rounds(rounds).gpu_energy_source == "mixed"
    assert combine_rounds(rounds[::2]).gpu_energy_source == "counter"
    assert combine_rounds([BenchResult()]).gpu_energy_source is None
