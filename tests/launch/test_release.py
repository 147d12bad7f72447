"""GPUs and ports proven free after a teardown, and a port held by a dying predecessor waited out at launch.

The GPU side runs against a fake `nvidia-smi` that this file writes and puts first on PATH: a real process,
found by the real PATH lookup, that reports a pid's GPU memory while its holder process lives (a holder other
than the pid itself stands for a driver that has not let go yet).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from helpers import FakeGpu, dead_pid, die_with_pytest, profile_toml

from pytest_sglang.errors import PortInUseError, ResourcesHeldWarning
from pytest_sglang.launch import release
from pytest_sglang.launch.process import OWNER_ENV, ServerProcess, kill_tree
from pytest_sglang.launch.release import stop_and_release, wait_for_dying_holder, wait_released
from pytest_sglang.machine.gpus import gpu_processes

pytestmark = pytest.mark.timeout(120)

@pytest.fixture
def fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    gpu = FakeGpu(tmp_path)
    for name, value in gpu.env().items():
        monkeypatch.setenv(name, value)
    return gpu


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The release waits' sleeps, recorded (and slept): one that returned at once slept none, however slow a
    loaded runner made its fake nvidia-smi calls (a wall-clock bound would time those)."""
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(release, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    return slept


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_no_gpu_is_skipped_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   sleeper: subprocess.Popen[bytes], sleeps: list[float]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere; pynvml is not installed here either
    monkeypatch.delenv("PYTEST_SGLANG_GPU_QUERY", raising=False)
    assert gpu_processes() is None
    assert wait_released({sleeper.pid}, host="127.0.0.1", port=None, timeout=5) == []
    assert sleeps == [], "nothing to wait for: no GPU, no port"


def test_release_waits_until_the_pids_leave_the_gpu(fake_gpu: FakeGpu, sleeper: subprocess.Popen[bytes],
                                                    sleeps: list[float]) -> None:
    fake_gpu.hold(sleeper.pid)
    gone = threading.Event()
    threading.Timer(1.0, lambda: (sleeper.kill(), sleeper.wait(), gone.set())).start()
    assert wait_released({sleeper.pid}, host="127.0.0.1", port=None, timeout=20) == []  # [] before the bound
    # by order, not by the clock: it returned only once the holder had gone, having slept while it held on
    assert gone.is_set() and sleeps, "it waited for the holder to go"


def test_release_names_the_pid_its_memory_and_gpu_once_the_bound_passes(
    fake_gpu: FakeGpu, sleeper: subprocess.Popen[bytes]
) -> None:
    fake_gpu.hold(sleeper.pid, 77000)
    held = wait_released({sleeper.pid}, host="127.0.0.1", port=None, names={sleeper.pid: "sglang::scheduler_TP0"},
                         timeout=1.0)
    assert held == [f"pid {sleeper.pid} (sglang::scheduler_TP0) holds 77000 MiB on GPU 0"]


def _listener(port_file: Path, *, env: dict[str, str] | None = None, on_term: str = "exit") -> subprocess.Popen[bytes]:
    """A real process listening on a free port (written to port_file); on SIGTERM it exits, exits 1.5 s
    later ("slow"), or ignores it ("ignore")."""
    code = f"""
import signal, socket, sys, time
mode = {on_term!r}
if mode == "slow":
    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), sys.exit(0)))
elif mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen()
open({str(port_file)!r}, "w").write(str(s.getsockname()[1]))
while True:
    time.sleep(0.1)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **(env or {})}, start_new_session=True,
                            preexec_fn=die_with_pytest())
    deadline = time.monotonic() + 10
    while not (port_file.exists() and port_file.read_text()):
        assert time.monotonic() < deadline, "the listener never listened"
        time.sleep(0.05)
    return proc


def test_release_names_a_pid_still_listening_on_the_port(tmp_path: Path) -> None:
    proc = _listener(tmp_path / "port")
    port = int((tmp_path / "port").read_text())
    try:
        held = wait_released({proc.pid}, host="127.0.0.1", port=port, timeout=0.5)
        assert held == [f"port {port} is still listened on by pid {proc.pid}"]
    finally:
        proc.kill()
        proc.wait()
    assert wait_released({proc.pid}, host="127.0.0.1", port=port, timeout=5) == []


def test_a_port_someone_else_took_after_us_is_not_ours_to_wait_for(tmp_path: Path, sleeps: list[float]) -> None:
    other = _listener(tmp_path / "port")
    try:
        assert wait_released({999_999_999}, host="127.0.0.1", port=int((tmp_path / "port").read_text()),
                             timeout=5) == []
        assert sleeps == [], "another process's port is not waited for"
    finally:
        other.kill()
        other.wait()


def test_teardown_warns_naming_what_the_stopped_tree_still_holds(
    fake_gpu: FakeGpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: subprocess.Popen[bytes]
) -> None:
    """ServerProcess + stop_and_release, as LaunchedLiveness.close runs them: the server's pid is gone, but
    the "driver" (the sleeper) still holds its memory."""
    monkeypatch.setenv("PYTEST_SGLANG_RELEASE_TIMEOUT", "1")
    server = ServerProcess(["sleep", "60"], env=dict(os.environ), log_path=tmp_path / "p.log",
                           reap_on_parent_death=False)
    fake_gpu.hold(server.pid, 4096, holder=sleeper.pid)
    with pytest.warns(ResourcesHeldWarning) as caught:
        held = stop_and_release(server, grace=1, profile="p", host="127.0.0.1", port=None)
    assert held == [f"pid {server.pid} (the server's main process) holds 4096 MiB on GPU 0"]
    message = str(caught[0].message)
    assert message.startswith("[sglang p] 1 s after its server was stopped, it still holds resources: pid ")
    assert "PYTEST_SGLANG_RELEASE_TIMEOUT" in message
    sleeper.kill()
    sleeper.wait()
    server = ServerProcess(["sleep", "60"], env=dict(os.environ), log_path=tmp_path / "q.log",
                           reap_on_parent_death=False)
    fake_gpu.hold(server.pid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stop_and_release(server, grace=1, profile="q", host="127.0.0.1", port=None) == []


@contextlib.contextmanager
def _torn_down_by_a_reaper(tmp_path: Path, on_term: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A server (one listening process carrying an owner token) whose pytest is gone: its reaper has begun to
    tear it down. Yields the server and its port."""
    token = "t" + os.urandom(8).hex()
    holder = _listener(tmp_path / "port", env={OWNER_ENV: token}, on_term=on_term)
    reaper = subprocess.Popen([sys.executable, "-m", "pytest_sglang.launch.reaper", str(dead_pid()),
                               str(holder.pid), token])
    try:
        time.sleep(0.7)  # the reaper polls every 0.5 s
        yield holder, int((tmp_path / "port").read_text())
    finally:
        for proc in (holder, reaper):
            proc.kill()
            proc.wait()


def test_a_port_held_by_a_tree_its_reaper_is_tearing_down_is_waited_out(tmp_path: Path) -> None:
    """A predecessor from a pytest that was killed: its reaper has sent SIGTERM and the server takes 1.5 s to
    go. The launch waits for it instead of failing with "port busy"."""
    said: list[str] = []
    with _torn_down_by_a_reaper(tmp_path, "slow") as (holder, port):
        wait_for_dying_holder("127.0.0.1", port, on_status=said.append, timeout=20)  # past the bound: it raises
    assert said and f"pid {holder.pid} (the pytest that launched it is gone and its reaper is tearing" in said[0]


def test_a_dying_holder_past_the_bound_is_named(tmp_path: Path) -> None:
    with _torn_down_by_a_reaper(tmp_path, "ignore") as (holder, port), pytest.raises(PortInUseError) as err:
        wait_for_dying_holder("127.0.0.1", port, timeout=1)
    text = str(err.value)
    assert (f"Port 127.0.0.1:{port} is still held 1 s later by a server that is on its way out: "
            f"pid {holder.pid}") in text
    assert "PYTEST_SGLANG_RELEASE_TIMEOUT" in text


def test_a_live_holder_is_not_waited_for(tmp_path: Path, sleeps: list[float]) -> None:
    """Anything not on its way out is check_port_free's "busy" error at once (tests/test_lifecycle.py)."""
    holder = _listener(tmp_path / "port")
    try:
        wait_for_dying_holder("127.0.0.1", int((tmp_path / "port").read_text()), timeout=10)
        assert sleeps == [], "a live holder is not waited for"
    finally:
        holder.kill()
        holder.wait()


GPU_TESTS = """
import os, psutil
def test_uses_the_gpu(sglang_server):
    tree = [sglang_server.pid] + [c.pid for c in psutil.Process(sglang_server.pid).children(recursive=True)]
    ranks = [c for c in psutil.Process(sglang_server.pid).children(recursive=True)
             if any(a.startswith("scheduler_TP") for a in c.cmdline())]
    assert len(ranks) == 2
    holder = os.environ.get("GPU_HOLDER")
    with open(os.environ["FAKE_GPU_CONFIG"], "a") as fh:
        for pid in tree:
            fh.write(f"{pid} 1000 {pid}\\n")
        if holder:  # the driver keeps rank 0's memory after the rank is gone
            rank0 = next(c for c in ranks if "scheduler_TP0" in c.cmdline())
            fh.write(f"{rank0.pid} 70000 {holder}\\n")
"""


def test_session_teardown_waits_for_the_gpus_and_says_who_still_holds_one(
    pytester: pytest.Pytester, mark: str, fake_gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch,
    sleeper: subprocess.Popen[bytes],
) -> None:
    toml = profile_toml("p", mark, 'args = ["--tp", "2"]')
    pytester.makefile(".toml", pyproject="[tool.pytest.ini_options]\n" + toml)
    pytester.makepyfile(test_user=GPU_TESTS)
    clean = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-profile=p", "--sglang-sim", timeout=90)
    clean.assert_outcomes(passed=1)
    assert "ResourcesHeldWarning" not in clean.stdout.str()
    assert any("--query-compute-apps" in q for q in fake_gpu.queries()), "the teardown never asked the GPUs"

    monkeypatch.setenv("GPU_HOLDER", str(sleeper.pid))
    monkeypatch.setenv("PYTEST_SGLANG_RELEASE_TIMEOUT", "2")
    held = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-profile=p", "--sglang-sim", timeout=90)
    held.assert_outcomes(passed=1, warnings=1)
    held.stdout.fnmatch_lines(["*ResourcesHeldWarning: [[]sglang p[]] 2 s after its server was stopped, it still "
                               "holds resources: pid * (scheduler_TP0) holds 70000 MiB on GPU 0.*"])


@pytest.mark.timeout(60)  # far below the grace: waiting out the grace is the bug, seen as this timeout
def test_stopping_a_tree_another_process_started_does_not_wait_out_its_grace() -> None:
    """An xdist worker stops a server that another worker launched: its root stays a zombie until that parent
    reaps it, and used to hold kill_tree for the whole shutdown grace (30 s per profile switch)."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        kill_tree(child, "no-such-token", grace=300.0)
        status = psutil.Process(child).status() if psutil.pid_exists(child) else None
        assert status in (None, psutil.STATUS_ZOMBIE), status
    finally:
        parent.kill()
        parent.wait()
