"""Servers on an ssh host, through a real sshd on loopback (conftest.py) and the real simulator run by the
"remote" side's python: every row of the fault matrix that applies over ssh leaves 0 processes there."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import Sshd
from helpers import interruptible, marked_processes, profile_toml, wait_for_no_processes
from test_lifecycle import READY_TEST as LOCAL_READY_TEST
from test_lifecycle import project as local_project

pytestmark = pytest.mark.timeout(120)

# The lifecycle tests' ready test (base_url, /health, startup_seconds, phases), and where the server ran.
READY_TEST = LOCAL_READY_TEST + """
def test_remote_tree(sglang_server):
    assert {"load_weights", "kv_cache", "cuda_graph"} <= set(sglang_server.phases)
    print("REMOTE", sglang_server.liveness.process.remote_log, sglang_server.liveness.process.pid)
"""


def project(pytester: pytest.Pytester, toml: str, tests: str = READY_TEST) -> None:
    local_project(pytester, toml, tests)


def remote_profile(sshd: Sshd, name: str, mark: str, body: str = "", sim: str = "startup_seconds = 0.6",
                   alias: str = "sshd-test", python: str = sys.executable) -> str:
    return profile_toml(name, mark, sshd.profile_keys(alias, python) + body, sim)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", *args, timeout=90)


def ssh_clients(sshd: Sshd) -> list[psutil.Process]:
    """Local ssh clients of this sshd that are still running (a dropped or finished server leaves none)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["name"] == "ssh" and str(sshd.client_config) in cmdline and "pytest-sglang" in " ".join(cmdline):
            found.append(proc)
    return found


def nothing_left(sshd: Sshd, mark: str, timeout: float = 15.0) -> None:
    assert not wait_for_no_processes(mark, timeout), "server processes survived on the remote side"
    deadline = time.monotonic() + timeout
    while ssh_clients(sshd) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not ssh_clients(sshd), "ssh clients survived on this side"


def test_ready_through_a_forward_and_directly_with_hostile_values_and_the_hosts_gpus(
    pytester: pytest.Pytester, sshd: Sshd, mark: str, tmp_path: Path
) -> None:
    """Ready over ssh (phases, base_url), the log copied whole; no profile value runs as shell code on the host;
    the baseline key is the host's nvidia-smi seen through the profile's environment; host 0.0.0.0 is direct."""
    bin_dir = tmp_path / "gpu bin"
    bin_dir.mkdir()
    fake_smi = bin_dir / "nvidia-smi"
    fake_smi.write_text("#!/bin/sh\nprintf '0, NVIDIA H200, 550.54.15\\n1, NVIDIA H200, 550.54.15\\n'\n")
    fake_smi.chmod(0o755)
    wrapper = tmp_path / "py $HOME 'q'" / "python"  # the profile's python: quoted for the remote shell
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    pwned = tmp_path / "pwned"
    hostile = f"m'o\"d $(touch {pwned}) ; touch {pwned}2 `touch {pwned}3` | x & y"
    body = (f'args = ["--tp", "2", "--served-model-name", {json.dumps(hostile)}]\n'
            f'env = {{ TEST_MARK = "{mark}", PATH = "{bin_dir}:/usr/bin:/bin", CUDA_VISIBLE_DEVICES = "1", '
            f'HOSTILE = {json.dumps(hostile)} }}\n')
    toml = profile_toml("gpu", mark, sshd.profile_keys(python=str(wrapper)) + body).replace(
        f'env = {{ TEST_MARK = "{mark}" }}\n', "")
    toml += remote_profile(sshd, "direct", mark, 'host = "0.0.0.0"')
    tests = READY_TEST + """
def test_remote_facts(sglang_server, sglang_baseline):
    import json, requests
    if sglang_server.profile == "gpu":
        print("MODEL", json.dumps(requests.get(sglang_server.url("/v1/models"), timeout=5).json()["data"][0]["id"]))
        sglang_baseline.check(sglang_server, startup_seconds="20%")
"""
    project(pytester, toml, tests)
    baseline = tmp_path / "baseline.json"
    result = run(pytester, "--sglang-profile=gpu,direct", "--sglang-sim", f"--sglang-baseline={baseline}",
                 "--sglang-update-baseline")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*[[]sglang gpu[]] launching on sshd-test over ssh: log copied to *gpu.log",
                                 "*[[]sglang gpu[]] started on sshd-test (pid *), reached through ssh -L 127.0.0.1:*"
                                 ": log sshd-test:*gpu-*.log, copied to *gpu.log",
                                 "*[[]sglang direct[]] started on sshd-test (pid *), reached directly: log *",
                                 "gpu: ready over ssh in * s  [[]launch *load_weights*"])
    copied = {Path(line.rsplit(" ", 1)[1]) for line in result.stdout.lines if "copied to" in line}
    remote = {Path(line.split("REMOTE ", 1)[1].split()[0]) for line in result.stdout.lines if "REMOTE " in line}
    assert len(remote) == 2 and all(p.parent.name == "remote" for p in remote), remote  # under the host's temp dir
    assert sorted(p.read_bytes() for p in copied) == sorted(p.read_bytes() for p in remote), "the copy is whole"
    assert json.loads(next(line for line in result.stdout.lines if "MODEL " in line).split("MODEL ", 1)[1]) == hostile
    assert not list(tmp_path.glob("pwned*")), "a profile value ran as shell code on the host"
    keys = list(json.loads(baseline.read_text())["baselines"]["gpu"].values())[0]
    assert [k.split(" | ")[:2] for k in keys] == [["1x NVIDIA H200", "driver 550.54.15"]], keys
    nothing_left(sshd, mark)


def test_faults_over_ssh_each_with_its_root_cause_and_both_logs(
    pytester: pytest.Pytester, sshd: Sshd, mark: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash alive, crash exited, argparse exit 2 and a hang: the same errors as a local server, the remote log
    named beside the local copy; children that left the group and ignore SIGTERM are killed there too."""
    monkeypatch.setenv("COLUMNS", "400")
    faults = {"traceback": "", "exit": "", "bad-flag": "", "hang": "startup_timeout = 3\n"}
    toml = "".join(remote_profile(sshd, f"f-{fault}", mark, 'args = ["--tp", "2"]\n' + extra,
                                  f'startup_seconds = 1.5, fault = "{fault}", ignore_sigterm = true')
                   for fault, extra in faults.items())
    project(pytester, toml)
    result = run(pytester, "--sglang-profile=" + ",".join(f"f-{f}" for f in faults), "--sglang-sim", "-rE")
    result.assert_outcomes(errors=8)
    result.stdout.fnmatch_lines([
        "*[[]sglang f-traceback[]] server crashed during startup (its process was still alive*AttributeError: "
        "'KimiK25ForConditionalGeneration' object has no attribute*",
        "Full log: *f-traceback.log (streamed from sshd-test:*/remote/f-traceback-*.log)",
        "Command: ssh -F * sshd-test 'env TEST_MARK=* -m pytest_sglang.sim --model-path /models/sim-model "
        "--host 127.0.0.1 --port * --tp 2 > */remote/f-traceback-*.log 2>&1'",
    ])
    result.stdout.fnmatch_lines(["*[[]sglang f-exit[]] server exited during startup*killed by SIGKILL (exit code 137)*",
                                 "Full log: *f-exit.log (streamed from sshd-test:*)"])
    result.stdout.fnmatch_lines(["*[[]sglang f-bad-flag[]] server exited during startup*exit code 2*",
                                 "*error: unrecognized arguments*",
                                 "*exit code 2 is the server?s command-line parser rejecting a flag*"])
    result.stdout.fnmatch_lines(["*[[]sglang f-hang[]] server was not ready within its startup timeout of 3 s*",
                                 "*Last * log lines:*", "Full log: *f-hang.log (streamed from sshd-test:*)",
                                 "*Try: look at the log (on the host: ssh sshd-test tail -f *"])
    nothing_left(sshd, mark)


def test_ssh_refusals_each_say_what_to_do(pytester: pytest.Pytester, sshd: Sshd, mark: str) -> None:
    """An unknown host key, a refused key, a python the host does not have, a port taken there and a log
    folder it cannot write: each its own message, and what to try."""
    toml = (remote_profile(sshd, "unknown", mark, alias="sshd-unknown-host")
            + remote_profile(sshd, "refused", mark, alias="sshd-wrong-key")
            + remote_profile(sshd, "nopython", mark, python="/no/such/python3")
            + remote_profile(sshd, "nolog", mark, 'remote_log_dir = "/proc/no-such-dir"'))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        project(pytester, toml + remote_profile(sshd, "busy", mark, f"port = {taken.getsockname()[1]}"))
        result = run(pytester, "--sglang-profile=unknown,refused,nopython,nolog,busy", "--sglang-sim")
    result.assert_outcomes(errors=10)
    result.stdout.fnmatch_lines([
        "cannot start the server of profile 'nolog' on sshd-test over ssh: cannot write the log "
        "/proc/no-such-dir/nolog-*.log: No such file or directory",
        "Try: set the profile's `remote_log_dir` to a folder this user can write on sshd-test",
    ])
    result.stdout.fnmatch_lines([
        "cannot start the server of profile 'busy' on sshd-test over ssh: port * on 127.0.0.1 is taken there*",
        "Try: leave `port` out of the profile (a free one is chosen), or stop what holds that port on sshd-test",
    ])
    result.stdout.fnmatch_lines([
        "cannot start the server of profile 'unknown' on sshd-unknown-host over ssh: the host key of "
        "sshd-unknown-host is not known (not in known_hosts)*",
        "*Host key verification failed.",
        "ssh's messages: *unknown.ssh.log",
        "Try: connect once by hand (`ssh sshd-unknown-host true`), check the fingerprint*",
    ])
    result.stdout.fnmatch_lines([
        "cannot start the server of profile 'refused' on sshd-wrong-key over ssh: sshd-wrong-key refused the key*",
        "*Permission denied (publickey).",
        "Try: check that `ssh sshd-wrong-key true` logs in without a prompt*",
    ])
    result.stdout.fnmatch_lines([
        "cannot start the server of profile 'nopython' on sshd-test over ssh: the remote python /no/such/python3 "
        "was not found on sshd-test (the remote shell exited with code 127)",
        "*/no/such/python3: No such file or directory",
        "Try: set the profile's `python` to an interpreter on sshd-test*",
    ])
    result.stdout.fnmatch_lines(["nopython: FAILED TO START: cannot start the server of profile 'nopython'*"])
    nothing_left(sshd, mark)


def _start_pytest(pytester: pytest.Pytester, *args: str, env: dict[str, str] | None = None
                  ) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", *args],
                            cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, preexec_fn=interruptible)


def _pytest_during_a_long_remote_startup(pytester: pytest.Pytester, sshd: Sshd, mark: str,
                                         env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A pytest run whose remote server (tp 2, children setsid'd and deaf to SIGTERM) is in a 600 s start."""
    project(pytester, remote_profile(sshd, "p", mark, 'args = ["--tp", "2"]',
                                     "startup_seconds = 600, ignore_sigterm = true"))
    proc = _start_pytest(pytester, "--sglang-profile=p", "--sglang-sim", env=env)
    deadline = time.monotonic() + 30
    while len(marked_processes(mark)) < 4:  # launcher, two ranks (escaped: setsid), detokenizer
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the remote server never started"
        time.sleep(0.1)
    return proc


def _control_client(sshd: Sshd) -> psutil.Process:
    return next(p for p in ssh_clients(sshd) if "supervise" in " ".join(p.cmdline()))


def test_ctrl_c_during_a_remote_startup_leaves_nothing_there(pytester: pytest.Pytester, sshd: Sshd, mark: str) -> None:
    proc = _pytest_during_a_long_remote_startup(pytester, sshd, mark)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "p: INTERRUPTED during startup after " in out, out
    nothing_left(sshd, mark, timeout=5)


def test_pytest_killed_during_a_remote_startup_leaves_nothing_there(
    pytester: pytest.Pytester, sshd: Sshd, mark: str
) -> None:
    proc = _pytest_during_a_long_remote_startup(pytester, sshd, mark)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    nothing_left(sshd, mark)  # the host's agent saw its stdin end: the controller is gone


def test_connection_lost_during_startup_names_the_host(pytester: pytest.Pytester, sshd: Sshd, mark: str) -> None:
    proc = _pytest_during_a_long_remote_startup(pytester, sshd, mark)
    _control_client(sshd).kill()
    out, _ = proc.communicate(timeout=60)
    assert "[sglang p] lost the ssh connection to sshd-test during startup: the ssh session that runs it ended " \
           "(its local ssh client was killed by SIGKILL)" in out, out
    assert "(streamed from sshd-test:" in out, out
    assert "p: FAILED TO START: " in out, out
    nothing_left(sshd, mark)


def test_connection_dropped_mid_session_fails_later_tests_and_leaves_nothing(
    pytester: pytest.Pytester, sshd: Sshd, mark: str
) -> None:
    tests = """
import os, signal, time
def test_drop_the_connection(sglang_server):
    os.kill(sglang_server.liveness.process.control.pid, signal.SIGKILL)
    time.sleep(0.5)  # the client is gone before the next test asks
def test_after_the_drop(sglang_server):
    pass
"""
    project(pytester, remote_profile(sshd, "p", mark, 'args = ["--tp", "2"]',
                                     "startup_seconds = 0.6, ignore_sigterm = true"), tests)
    result = run(pytester, "--sglang-profile=p", "--sglang-sim")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*[[]sglang p[]] lost the ssh connection to sshd-test during the session: the ssh "
                                 "session that runs it ended (its local ssh client was killed by SIGKILL)*",
                                 "Full log: *p.log (streamed from sshd-test:*)"])
    nothing_left(sshd, mark)


def test_a_silently_dead_connection_is_noticed_by_the_hosts_heartbeat_watchdog(
    pytester: pytest.Pytester, sshd: Sshd, mark: str
) -> None:
    """A connection that neither closes nor answers (its local client frozen): the host stops hearing the
    heartbeat and tears the server down on its own."""
    proc = _pytest_during_a_long_remote_startup(pytester, sshd, mark, env={"PYTEST_SGLANG_SSH_HEARTBEAT_TIMEOUT": "2"})
    control = _control_client(sshd)
    control.suspend()
    try:
        assert not wait_for_no_processes(mark, timeout=15), "the host did not tear down without a heartbeat"
    finally:
        control.kill()  # what ServerAliveInterval does to a client whose connection is dead
    out, _ = proc.communicate(timeout=60)
    assert "[sglang p] lost the ssh connection to sshd-test during startup" in out, out
    nothing_left(sshd, mark)
