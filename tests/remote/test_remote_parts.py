"""The remote origin's parts that need no sshd: the profile keys, the endpoint choice, what ssh's refusals
mean, the agent's log stream following a replaced file and its GPU readings (the agent run by this python, as
a host runs it), and what the agent may import where nothing of the plugin is installed."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FakeGpu

from pytest_sglang.config.profiles import load_profiles
from pytest_sglang.errors import ProfileError
from pytest_sglang.launch import agent
from pytest_sglang.launch.plan import plan_launch
from pytest_sglang.launch.remote import BOOTSTRAP, agent_input, plan_remote
from pytest_sglang.launch.remote_gpus import _readings
from pytest_sglang.launch.ssh_errors import explain
from pytest_sglang.machine.gpus import GpuReading


def _profile(tmp_path: Path, body: str, name: str = "p"):  # type: ignore[no-untyped-def]
    (tmp_path / "pyproject.toml").write_text(f'[tool.pytest_sglang.profiles.{name}]\nmodel = "/m"\n{body}\n')
    return load_profiles(tmp_path, None).profiles[name]


def test_ssh_keys_are_checked_and_a_dash_is_never_a_destination(tmp_path: Path) -> None:
    profile = _profile(tmp_path, 'ssh = "root@gpu-box"\nssh_options = ["-p", 2222]\nremote_log_dir = "/data/logs"')
    assert (profile.ssh, profile.ssh_options, profile.remote_log_dir) == ("root@gpu-box", ("-p", "2222"), "/data/logs")
    with pytest.raises(ProfileError, match=r"key 'ssh': '-oProxyCommand=touch x' is not an ssh destination"):
        _profile(tmp_path, 'ssh = "-oProxyCommand=touch x"')
    with pytest.raises(ProfileError, match=r"key 'ssh_options': must be a list of extra ssh client arguments"):
        _profile(tmp_path, 'ssh = "h"\nssh_options = "-v"')


def test_loopback_is_forwarded_and_other_addresses_are_reached_directly(tmp_path: Path) -> None:
    forwarded = plan_remote(plan_launch(_profile(tmp_path, 'ssh = "h"\npython = "/opt/py"'), sim=False,
                                        log_dir=tmp_path))
    assert forwarded.plan.argv[0] == "/opt/py" and forwarded.plan.argv[-2:] == ["--port", str(forwarded.plan.port)]
    assert forwarded.forward == f"127.0.0.1:{forwarded.reach_port}:127.0.0.1:{forwarded.plan.port}"
    assert forwarded.base_url == f"http://127.0.0.1:{forwarded.reach_port}" != forwarded.plan.base_url
    direct = plan_remote(plan_launch(_profile(tmp_path, 'ssh = "h"\nhost = "10.1.2.3"\nport = 30000'), sim=False,
                                     log_dir=tmp_path))
    assert (direct.forward, direct.base_url, direct.python) == (None, "http://10.1.2.3:30000", "python3")


@pytest.mark.parametrize(("code", "stderr", "expected"), [
    (255, "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.",
     "the host key of h has CHANGED"),
    (255, "ssh: Could not resolve hostname gpu-bx: Name or service not known", "the name h does not resolve"),
    (255, "ssh: connect to host 10.0.0.9 port 22: Connection refused", "cannot reach h"),
    (255, "bind [127.0.0.1]:5000: Address already in use\nCould not request local forwarding.",
     "ssh could not open the local end of the port forward"),
    (127, "sh: 1: exec: python3: not found", "the remote python python3 was not found on h"),
    (1, "  File \"<string>\", line 1\nSyntaxError: invalid syntax", "the pytest-sglang agent on h exited with code 1"),
])
def test_each_ssh_refusal_has_its_own_message(code: int, stderr: str, expected: str) -> None:
    what, hint = explain("h", "python3", None, code, stderr.splitlines())
    assert what.startswith(expected), what
    assert hint


def test_the_stream_follows_a_replaced_log_and_ends_once_the_agent_is_gone(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"first\n")
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stream = subprocess.Popen([sys.executable, "-c", BOOTSTRAP, "pytest-sglang", "stream"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    assert stream.stdin is not None and stream.stdout is not None
    stream.stdin.write(agent_input({"log": str(log), "supervisor": agent.pid}))
    stream.stdin.flush()
    time.sleep(0.5)
    rotated = tmp_path / "server.log.new"
    rotated.write_bytes(b"second\n")
    rotated.replace(log)  # a new file under the old name: read from its byte 0
    time.sleep(0.5)
    with log.open("ab") as fh:
        fh.write(b"third, just before the agent exits\n")
    agent.kill()
    agent.wait()
    out, _ = stream.communicate(timeout=10)
    assert out == b"first\nsecond\nthird, just before the agent exits\n"


def test_the_gpu_agent_answers_its_protocol_and_ends_once_the_supervisor_is_gone(tmp_path: Path) -> None:
    gpu = FakeGpu(tmp_path)
    gpu.read_as(1, **{"power.draw": 300.5, "utilization.gpu": 71})
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gpu.hold(supervisor.pid)  # the server's tree holds memory on GPU 0 (the fake's bus id)
    agent = subprocess.Popen([sys.executable, "-c", BOOTSTRAP, "pytest-sglang", "gpus"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    assert agent.stdin is not None and agent.stdout is not None

    def ask(command: dict[str, object]) -> dict[str, object]:
        assert agent.stdin is not None and agent.stdout is not None
        agent.stdin.write((json.dumps(command) + "\n").encode())
        agent.stdin.flush()
        return dict(json.loads(agent.stdout.readline()))

    try:
        agent.stdin.write(agent_input({"env": {**gpu.env(), "CUDA_VISIBLE_DEVICES": "1"}, "token": "no-such-token",
                                       "pid": supervisor.pid, "supervisor": supervisor.pid, "query": None}))
        agent.stdin.flush()
        hello = json.loads(agent.stdout.readline())
        assert (hello["protocol"], hello["source"], hello["held"], hello["visible"]) == (2, "nvidia-smi", [0], "1")
        assert ask({"do": "ping"})["clock"] >= hello["clock"]
        # nvidia-smi: no energy counter, the row's last element
        assert ask({"do": "read", "gpus": [1]})["readings"] == [[1, 71.0, None, 300.5, None, None, None]]
        supervisor.kill()
        supervisor.wait()
        assert agent.wait(timeout=5) == 0, "the agent outlived its supervisor"
    finally:
        for proc in (supervisor, agent):
            proc.kill()
            proc.wait()


def test_the_supervising_agent_exits_cleanly_after_a_stop(tmp_path: Path) -> None:
    """Its stdin reader thread is still blocked when it is done: an interpreter exit would abort (SIGABRT, and
    "Fatal Python error" in ssh's log on the host), so it leaves by os._exit with its own code."""
    agent = subprocess.Popen([sys.executable, "-c", BOOTSTRAP, "pytest-sglang", "supervise"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert agent.stdin is not None and agent.stdout is not None
    try:
        agent.stdin.write(agent_input({"token": "t-supervise-exit", "argv": ["sleep", "60"], "env": {},
                                       "log_dir": str(tmp_path), "log_name": "server.log"}))
        agent.stdin.flush()
        assert json.loads(agent.stdout.readline())["event"] == "started"
        agent.stdin.write(b"stop 0\n")  # and stdin left open, as the controller leaves it until "swept"
        agent.stdin.flush()
        assert [json.loads(agent.stdout.readline())["event"] for _ in range(2)] == ["exit", "swept"]
        assert agent.wait(timeout=15) == 0
        assert agent.stderr is not None and agent.stderr.read() == b""
    finally:
        agent.kill()
        agent.wait()


COUNTING_NVML = '''
"""nvidia-ml-py's names for one GPU whose driver keeps an energy counter (mJ since it loaded)."""
NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0
class _Util:
    gpu = 30
class _Memory:
    used = 2048 * 1024 * 1024
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetUtilizationRates(h): return _Util()
def nvmlDeviceGetMemoryInfo(h): return _Memory()
def nvmlDeviceGetPowerUsage(h): return 120000
def nvmlDeviceGetClockInfo(h, kind): return 1980
def nvmlDeviceGetTemperature(h, kind): return 40
def nvmlDeviceGetTotalEnergyConsumption(h): return 123456789
def nvmlDeviceGetComputeRunningProcesses(h): return []
'''


@pytest.mark.timeout(30)
def test_the_gpu_agent_sends_nvmls_energy_counter_and_the_controller_reads_both_protocols(tmp_path: Path) -> None:
    (tmp_path / "pynvml.py").write_text(COUNTING_NVML)
    agent = subprocess.Popen([sys.executable, "-c", BOOTSTRAP, "pytest-sglang", "gpus"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert agent.stdin is not None and agent.stdout is not None
    try:
        agent.stdin.write(agent_input({"env": {}, "token": "no-such-token", "pid": os.getpid(), "supervisor": 0,
                                       "query": "nvml"}))
        agent.stdin.flush()
        hello = json.loads(agent.stdout.readline())
        agent.stdin.write(b'{"do": "read", "gpus": null}\n')  # after the hello: the spec's reader buffers stdin
        agent.stdin.flush()
        assert (hello["protocol"], hello["source"]) == (2, "nvml")
        rows = json.loads(agent.stdout.readline())["readings"]
        assert rows == [[0, 30.0, 2048.0, 120.0, 1980.0, 40.0, 123456789.0]]
    finally:
        agent.kill()
        agent.wait()
    assert _readings(rows) == [GpuReading(0, 30.0, 2048.0, 120.0, 1980.0, 40.0, 123456789.0)]
    assert _readings([[0, 30, 2048, 120, 1980, 40]]) == [GpuReading(0, 30.0, 2048.0, 120.0, 1980.0, 40.0, None)]


def test_each_agent_module_imports_only_the_stdlib_and_the_modules_shipped_before_it() -> None:
    """The host has only its python: the shipped modules are all of the plugin it can import, in their order."""
    here = Path(agent.__file__).parent
    optional = {"pynvml"}  # imported under try: its absence is gpus.py's "no NVML" answer
    shipped: set[str] = set()
    for name in agent.SHIPPED:
        for node in ast.walk(ast.parse((here / f"{name}.py").read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                assert all(alias.name.split(".")[0] in {*sys.stdlib_module_names, *optional} for alias in node.names), (
                    f"{name}.py line {node.lineno}: an import the host may not have")
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                assert node.level == 0 and node.module is not None, f"{name}.py line {node.lineno}: relative"
                assert node.module in shipped or node.module.split(".")[0] in sys.stdlib_module_names, (
                    f"{name}.py line {node.lineno}: {node.module} is neither stdlib nor shipped before {name}")
        shipped.add(f"{agent.__name__}.{name}")


def test_the_agent_runs_from_its_shipped_sources_alone(tmp_path: Path) -> None:
    """Run where pytest_sglang cannot be imported (-I, another folder): what the host has is what was sent."""
    done = subprocess.run([sys.executable, "-I", "-c", BOOTSTRAP, "pytest-sglang", "sweep"], cwd=tmp_path,
                          input=agent_input({"token": "no-such-token"}), capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout.splitlines()[-1]) == {"event": "swept", "left": 0}
