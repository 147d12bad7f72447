"""The log replayer: real sample logs through a real process, then serve / hang / exit:N / kill."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import requests
from helpers import SAMPLES
from simtools import Sim, free_port

Launch = Callable[..., Sim]
LOGS = SAMPLES
REPLAY = "pytest_sglang.sim.replay"


def test_replay_exit_code_and_exact_bytes(launch: Launch) -> None:
    log = LOGS / "13_crash_tp2-runtimeerror-sigquit-killed.log"
    sim = launch(None, str(log), "--then", "exit:3", "--model-path", "x", "--tp", "2", module=REPLAY)
    assert sim.proc.wait(10) == 3
    assert sim.log_path.read_bytes() == log.read_bytes()


def test_replay_keeps_tqdm_carriage_returns(launch: Launch) -> None:
    log = LOGS / "21_ready_sglang-0.5.23-cpu.log"
    sim = launch(None, str(log), "--then", "exit:0", module=REPLAY)
    assert sim.proc.wait(10) == 0
    assert b"\rMulti-thread loading shards: 100%" in sim.log_path.read_bytes()
    assert sim.log_path.read_bytes() == log.read_bytes()


def test_replay_serve_health_after_last_line(launch: Launch) -> None:
    log = LOGS / "02_ready_qwq32b-tp4-full-startup.log"
    n_lines = log.read_bytes().count(b"\n")
    port = free_port()
    rate = 100.0
    sim = launch(None, str(log), "--then", "serve", "--port", str(port), "--lines-per-second", str(rate),
                 module=REPLAY)
    base = f"http://127.0.0.1:{port}"
    codes: list[int] = []
    replayed: set[int] = set()  # how many lines the log held at each 503
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = sim.log_path.read_bytes().count(b"\n")
        try:
            code = requests.get(base + "/health", timeout=1).status_code
        except requests.ConnectionError:
            code = 0
        codes.append(code)
        if code == 200:
            break
        if code == 503:
            replayed.add(lines)
        time.sleep(0.02)
    assert codes[-1] == 200 and 503 in codes
    # by what the log held, not by the clock: every 503 came before the last line, the 200 after it, and the log
    # grew between the probes (paced, not written at once)
    assert max(replayed) < n_lines and sim.log_path.read_bytes().count(b"\n") == n_lines
    assert len(replayed) >= 3, sorted(replayed)
    assert sim.log_path.read_bytes() == log.read_bytes()
    assert sim.proc.poll() is None
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.proc.wait(5) == 0


def test_replay_kill_and_hang(launch: Launch) -> None:
    crash_log = LOGS / "04_crash_warmup-assert-502-killed.log"
    killed = launch(None, str(crash_log), "--then", "kill", module=REPLAY)
    assert killed.proc.wait(10) == -signal.SIGKILL
    hung = launch(None, str(LOGS / "18_hang_multinode-nccl-init.log"), module=REPLAY)  # default: hang
    time.sleep(0.5)
    assert hung.proc.poll() is None
    assert hung.log_path.read_bytes() == (LOGS / "18_hang_multinode-nccl-init.log").read_bytes()
    hung.proc.send_signal(signal.SIGTERM)
    assert hung.proc.wait(5) == 0
