"""GPU telemetry of a server on an ssh host, read there by the agent (issue 20 point 1): through the real sshd on
loopback (conftest.py), the simulator started there by the plugin's remote launch, and a fake nvidia-smi
(tests/helpers.py FakeGpu) on the PATH of the profile's environment, so only the host's side can find it."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from conftest import Sshd
from helpers import BUSY_GPU, IDLE_GPU, FakeGpu, assert_energy_is_power_over_duration
from test_remote import _start_pytest, nothing_left

from pytest_sglang.bench import run_bench
from pytest_sglang.bench.metrics import GPU_FIGURES
from pytest_sglang.config.profiles import load_profiles
from pytest_sglang.launch.plan import plan_launch
from pytest_sglang.launch.remote_gpus import HostGpus
from pytest_sglang.server.handle import ServerHandle
from pytest_sglang.server.remote import launch_remote_server

pytestmark = pytest.mark.timeout(120)



def box_toml(sshd: Sshd, mark: str, env: dict[str, str]) -> str:
    """Profile ``box``: the simulator (with /metrics) on the sshd host, ``env`` its environment there."""
    profile_env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in {"TEST_MARK": mark, **env}.items())
    return (f'[tool.pytest_sglang.profiles.box]\nmodel = "/models/sim-model"\n{sshd.profile_keys()}'
            f'args = ["--enable-metrics"]\nenv = {{ {profile_env} }}\n'
            "sim = { startup_seconds = 0.2, decode_tok_s = 80, ttft_ms = 20, max_batch = 4 }\n")


@contextmanager
def remote_sim(sshd: Sshd, tmp_path: Path, mark: str, env: dict[str, str]) -> Iterator[ServerHandle]:
    """The simulator on the sshd host, launched as an ssh profile is; stopped on the way out."""
    (tmp_path / "pyproject.toml").write_text(box_toml(sshd, mark, env))
    profile = load_profiles(tmp_path, None).profiles["box"]
    handle = launch_remote_server(plan_launch(profile, sim=True, log_dir=tmp_path / "logs"))
    try:
        yield handle
    finally:
        handle.close()


def gpu_agents() -> list[psutil.Process]:
    """The ``gpus`` agents alive on the host and their ssh clients here (the sshd host is this machine)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if "pytest-sglang gpus" in " ".join(proc.info["cmdline"] or []) and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def wait_for_no_gpu_agents(timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while gpu_agents() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not gpu_agents(), "a GPU agent there or its ssh client here survived"


def test_energy_per_token_of_an_ssh_hosts_gpu_is_its_power_over_the_measured_duration(
    sshd: Sshd, tmp_path: Path, mark: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_SGLANG_GPU_QUERY", raising=False)  # the host's environment picks its source
    gpu = FakeGpu(tmp_path)
    gpu.read_as(0, **IDLE_GPU)
    gpu.read_as(1, **BUSY_GPU)
    secret = "hf_do-not-show-4e1f"
    host_env = {**gpu.env(), "CUDA_VISIBLE_DEVICES": "1", "HF_TOKEN": secret}
    with remote_sim(sshd, tmp_path, mark, host_env) as server:
        assert server.remote is not None
        with HostGpus.open(server.remote, query=None, interval=0.1) as agent:
            # the host is this machine: the agent's monotonic clock is this perf_counter's, so the measured
            # offset must come out as (about) none, within its own bound; the bound is half a round trip, which a
            # loaded runner stretches: held to a margin (0.5 s) that a bound gone wrong (seconds, inf) still fails
            assert (agent.host, agent.source, agent.gpus, agent.gpus_from) == (
                "sshd-test", "nvidia-smi", [1], "CUDA_VISIBLE_DEVICES")
            assert abs(agent.offset) <= agent.clock_error_s + 0.002 and agent.clock_error_s < 0.5
            agents = gpu_agents()
            assert len(agents) == 2 and not any(secret in " ".join(proc.cmdline()) for proc in agents)
            agent.start()
            started = time.perf_counter()
            time.sleep(0.5)
            stopped = time.perf_counter()
            samples = agent.stop()
            returned = time.perf_counter()
        assert len(samples) >= 3 and all(started - 0.05 <= t <= returned for t, _ in samples), (started, samples)
        assert samples[-1][0] >= stopped, "the last reading is taken on the way out, as a local sampler's is"
        assert {r.index for _, readings in samples for r in readings} == {1}
        with HostGpus.open(server.remote, query=None, interval=0.1) as dropped:
            dropped.start()
            next(proc for proc in gpu_agents() if proc.name() == "ssh").kill()  # its connection drops mid-round
            dropped.stop()  # returns (with what came before the drop), as does a reading: none
            assert dropped.read() is None
        wait_for_no_gpu_agents()
        r = run_bench(server, num_requests=8, concurrency=8, input_len=16, output_len=20, warmup=1, rounds=2)
    assert not gpu_agents()
    assert "Fatal Python error" not in server.remote.ssh_log_path.read_text(), "an agent aborted on the host"
    power = BUSY_GPU["power.draw"]  # only GPU 1 is the server's; GPU 0 idles at another power
    assert_energy_is_power_over_duration(r, power)
    assert (r.gpu_util_mean_pct, r.gpu_memory_peak_mib, r.gpu_sm_clock_mean_mhz) == (
        BUSY_GPU["utilization.gpu"], BUSY_GPU["memory.used"], BUSY_GPU["clocks.sm"])
    assert r.gpu_unmeasured is None and r.server_unmeasured is None
    assert secret not in json.dumps(r.to_dict()) + json.dumps(r.telemetry)
    series = r.telemetry
    assert series is not None and series["gpu"]["host"] == "sshd-test" and list(series["gpu"]["gpus"]) == ["1"]
    (lo, _), (_, hi) = series["rounds"][0], series["rounds"][-1]
    assert all(lo - 0.2 <= t <= hi + 0.5 for t in series["gpu"]["t"]), "readings in the rounds' time"
    assert any("--id=1" in q for q in gpu.queries())


def test_an_ssh_host_without_nvidia_smi_or_nvml_says_so_naming_the_host(
    sshd: Sshd, tmp_path: Path, mark: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_SGLANG_GPU_QUERY", raising=False)
    with remote_sim(sshd, tmp_path, mark, {"PATH": "/usr/bin:/bin"}) as server:
        r = run_bench(server, num_requests=4, concurrency=4, input_len=8, output_len=8)
    assert all(getattr(r, m) is None for m in GPU_FIGURES)
    assert r.gpu_unmeasured is not None and r.gpu_unmeasured.startswith("no GPU to ask on the ssh host sshd-test: ")
    assert "no nvidia-smi on its PATH (/usr/bin:/bin)" in r.gpu_unmeasured, r.gpu_unmeasured
    assert "no NVML (" in r.gpu_unmeasured  # its python cannot import pynvml, or NVML finds no driver
    assert r.server_unmeasured is None and r.server_queue_mean is not None  # its /metrics still sampled
    assert not gpu_agents()


def test_pytest_killed_mid_benchmark_leaves_no_gpu_agent_or_server_there(
    pytester: pytest.Pytester, sshd: Sshd, mark: str, tmp_path: Path
) -> None:
    gpu = FakeGpu(tmp_path)
    gpu.read_as(0, **BUSY_GPU)
    pytester.makefile(".toml", pyproject=box_toml(sshd, mark, gpu.env()))
    pytester.makepyfile(test_long="""
def test_long_benchmark(sglang_bench):
    sglang_bench(num_requests=400, concurrency=4, input_len=8, output_len=200, warmup=0)
""")
    proc = _start_pytest(pytester, "--sglang-profile=box", "--sglang-sim")
    try:
        deadline = time.monotonic() + 60
        while len(gpu.queries()) < 5:  # the agent there reads the GPUs: a round is being sampled
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the benchmark's GPU sampling never started"
            time.sleep(0.1)
        assert len(gpu_agents()) == 2  # the agent there, its ssh client here
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    wait_for_no_gpu_agents()
    nothing_left(sshd, mark)
