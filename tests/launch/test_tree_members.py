"""Which process of the server's tree died: role or command line, pid, signal or exit code, in the error."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import marked_processes, profile_toml, wait_for_no_processes

from pytest_sglang.launch.members import role_of
from pytest_sglang.launch.process import ServerProcess

pytestmark = pytest.mark.timeout(120)

# A root that starts two titled children (argv[0] as setproctitle leaves it) and one plain one, and never
# waits for them: a dead child stays a zombie, as under SGLang's and the simulator's main processes.
TREE = """
import subprocess, time
kids = [subprocess.Popen(["sglang::scheduler_TP0", "60"], executable="sleep"),
        subprocess.Popen(["sglang::scheduler_TP1", "60"], executable="sleep"),
        subprocess.Popen(["sleep", "61"])]
subprocess.run(["true"])  # a helper that comes and goes: no news
time.sleep(60)
"""


def test_roles_come_from_process_titles_and_the_simulator() -> None:
    assert role_of(["sglang::scheduler_TP0"]) == "sglang::scheduler_TP0"
    assert role_of(["VLLM::EngineCore_DP0 "]) == "VLLM::EngineCore_DP0"
    assert role_of([sys.executable, "-m", "pytest_sglang.sim.worker", "scheduler_TP1", "{}"]) == "scheduler_TP1"
    assert role_of(["/usr/bin/python3", "-m", "sglang.launch_server"]) is None
    assert role_of([]) is None


def _tree(tmp_path: Path) -> ServerProcess:
    server = ServerProcess([sys.executable, "-c", TREE], env=dict(os.environ), log_path=tmp_path / "tree.log",
                           reap_on_parent_death=False)
    deadline = time.monotonic() + 10
    while len(server.members.names()) < 4:
        assert time.monotonic() < deadline, f"members never seen: {server.members.names()}"
        server.poll()
        time.sleep(0.05)
    return server


def _kill(server: ServerProcess, word: str, sig: int) -> int:
    """Send ``sig`` to the member whose name has ``word``, and poll until the tree notices; its pid."""
    pid = next(pid for pid, name in server.members.names().items() if word in name)
    seen = len(server.members.deaths)
    os.kill(pid, sig)
    deadline = time.monotonic() + 5
    while len(server.members.deaths) == seen:
        assert time.monotonic() < deadline, "the death was never noticed"
        server.poll()
        time.sleep(0.02)
    return pid


def test_the_first_member_to_die_is_named_with_its_signal(tmp_path: Path) -> None:
    server = _tree(tmp_path)
    try:
        victim = _kill(server, "scheduler_TP1", signal.SIGKILL)
        lost = server.members.essential_death()
        assert lost is not None and lost.member.pid == victim and lost.status == -signal.SIGKILL
        text = server.members.describe_first()
        assert text is not None
        assert text.startswith(f"sglang::scheduler_TP1 (pid {victim}): killed by SIGKILL (exit code 137), noticed ")
        _kill(server, "scheduler_TP0", signal.SIGKILL)
        assert len(server.members.deaths) == 2
        assert server.members.describe_first() == text, "the first death stays the first"
    finally:
        server.stop(grace=1)
    assert server.members.describe_first() == text, "the teardown's kills are not news"


def test_a_plain_member_is_named_by_its_command_line_and_exit_code(tmp_path: Path) -> None:
    server = _tree(tmp_path)
    try:
        plain = _kill(server, "sleep 61", signal.SIGTERM)
        assert server.members.essential_death() is None, "a process without a role is not the server's death"
        text = server.members.describe_first() or ""
        assert text.startswith(f"sleep 61 (pid {plain}): killed by SIGTERM (exit code 143)")
    finally:
        server.stop(grace=1)


def test_the_main_process_dying_alone_adds_nothing_to_its_exit_code(tmp_path: Path) -> None:
    server = ServerProcess([sys.executable, "-c", "import sys; sys.exit(3)"], env=dict(os.environ),
                           log_path=tmp_path / "x.log", reap_on_parent_death=False)
    deadline = time.monotonic() + 10
    while server.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.members.check(now=time.monotonic() + 1)
    assert [d.status for d in server.members.deaths] == [3]
    assert server.members.describe_first() is None
    server.stop(grace=1)


def _project(pytester: pytest.Pytester, toml: str, tests: str) -> None:
    pytester.makefile(".toml", pyproject="[tool.pytest.ini_options]\n" + toml)
    pytester.makepyfile(test_user=tests)


KILL_A_RANK = """
import os, signal, time, psutil
def test_kill_a_rank(sglang_server):
    rank = next(c for c in psutil.Process(sglang_server.pid).children(recursive=True)
                if "scheduler_TP1" in c.cmdline())
    print("RANK", rank.pid)
    os.kill(rank.pid, signal.SIGKILL)
    time.sleep(0.3)
def test_after(sglang_server):
    pass
"""


def test_a_rank_killed_mid_session_fails_the_next_test_naming_it(
    pytester: pytest.Pytester, mark: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    _project(pytester, profile_toml("p", mark, 'args = ["--tp", "2"]'), KILL_A_RANK)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "-rf", "--sglang-profile=p",
                                           "--sglang-sim", timeout=90)
    result.assert_outcomes(passed=1, failed=1)
    rank = next(line.split()[1] for line in result.stdout.lines if line.startswith("RANK"))
    # The simulator's main process serves on with a dead rank, as SGLang's does when a scheduler is
    # SIGKILLed (no SIGQUIT comes): the tree says what happened.
    result.stdout.fnmatch_lines([f"FAILED test_user.py::test_after?p? - Failed: [[]sglang p[]] server died during the "
                                 f"session: a process of its tree died: scheduler_TP1 (pid {rank}): killed by "
                                 "SIGKILL (exit code 137), noticed *"])
    assert not wait_for_no_processes(mark, timeout=15)


def test_a_rank_killed_during_startup_fails_the_startup_at_once_naming_it(
    pytester: pytest.Pytester, mark: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    # the startup and its timeout far past the wait below: an error within it is the dead rank's own
    toml = profile_toml("p", mark, 'args = ["--tp", "2"]\nstartup_timeout = 120', sim="startup_seconds = 120")
    _project(pytester, toml, "def test_ready(sglang_server):\n    pass\n")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rE", "--sglang-profile=p",
                             "--sglang-sim"], cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 30
    rank = None
    while rank is None:
        assert time.monotonic() < deadline, "the ranks never started"
        rank = next((p for p in marked_processes(mark) if "scheduler_TP1" in _cmdline(p)), None)
        time.sleep(0.1)
    time.sleep(0.5)  # seen by the tree's first rescans
    rank.kill()
    killed_at = time.monotonic()
    out, _ = proc.communicate(timeout=90)
    assert time.monotonic() - killed_at < 120, "a dead rank must not wait out the startup timeout"
    assert (f"a process of the server's tree died during startup (the tree has been killed): scheduler_TP1 "
            f"(pid {rank.pid}): killed by SIGKILL") in out, out
    assert not wait_for_no_processes(mark, timeout=15)


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


# A supervisor as torchrun's agent is one: it reaps the rank that died at once (its status is then no longer
# readable by anyone else) and SIGTERMs the survivor, which stays a zombie (its status readable).
SUPERVISOR = """
import os, signal, subprocess, time
a = subprocess.Popen(["sglang::scheduler_TP0", "60"], executable="sleep")
b = subprocess.Popen(["sglang::scheduler_TP1", "60"], executable="sleep")
b.wait()
os.kill(a.pid, signal.SIGTERM)
time.sleep(60)
"""


@contextlib.contextmanager
def _running_tree(tmp_path: Path, script: str, roles: set[str]) -> Iterator[ServerProcess]:
    """A tree from ``script``, once every member with one of ``roles`` (and any other child) has been seen."""
    server = ServerProcess([sys.executable, "-c", script], env=dict(os.environ), log_path=tmp_path / "s.log",
                           reap_on_parent_death=False)
    try:
        deadline = time.monotonic() + 10
        while not roles <= set(server.members.names().values()) or len(server.members.names()) < len(roles) + 1:
            assert time.monotonic() < deadline, f"members never seen: {server.members.names()}"
            server.poll()
            time.sleep(0.05)
        yield server
    finally:
        server.stop(grace=1)


def _pid_of(server: ServerProcess, role: str) -> int:
    return next(pid for pid, name in server.members.names().items() if name == role)


def _look_once_all_are_zombies(server: ServerProcess, pids: list[int]) -> None:
    """Wait until each of ``pids`` has ended, then let the tree look: every death is noticed in that one look."""
    deadline = time.monotonic() + 10
    while any(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.members.check(now=time.monotonic() + 1)


def test_a_rank_terminated_as_a_consequence_is_not_named_first(tmp_path: Path) -> None:
    """Both deaths noticed in one look: the rank SIGKILLed (reaped by its supervisor, status unknown) is named
    before the one its supervisor SIGTERMed afterwards, though only the latter's status is known."""
    with _running_tree(tmp_path, SUPERVISOR, {"sglang::scheduler_TP0", "sglang::scheduler_TP1"}) as server:
        killed, survivor = _pid_of(server, "sglang::scheduler_TP1"), _pid_of(server, "sglang::scheduler_TP0")
        os.kill(killed, signal.SIGKILL)
        _look_once_all_are_zombies(server, [survivor])
        assert {d.member.pid: d.status for d in server.members.deaths} == {killed: None, survivor: -signal.SIGTERM}
        text = server.members.describe_first() or ""
        assert text.startswith(f"sglang::scheduler_TP1 (pid {killed}): gone"), text
        assert f"with it: sglang::scheduler_TP0 (pid {survivor}, killed by SIGTERM (exit code 143))" in text, text


# The order on the GPU host (real SGLang 0.5.23, its scheduler SIGKILLed): the main process reaps the scheduler at
# once (its status is then no one else's to read), logs SGLang's SIGQUIT line and SIGKILLs the rest of the tree,
# the detokenizer and a multiprocessing helper without a role, which stay readable as zombies for a while.
GPU_ORDER = """
import os, signal, subprocess, sys, time
scheduler = subprocess.Popen(["sglang::scheduler_TP0", "60"], executable="sleep")
detokenizer = subprocess.Popen(["sglang::detokenizer", "60"], executable="sleep")
helper = subprocess.Popen([sys.executable, "-B", "-c", "import time; time.sleep(60)  # resource_tracker"])
scheduler.wait()
print("[2026-12-01 10:00:00] Received sigquit from a child process. It usually means the child failed.", flush=True)
for child in (helper, detokenizer):
    os.kill(child.pid, signal.SIGKILL)
time.sleep(8)
"""


def test_the_scheduler_its_launcher_reaped_is_named_before_the_tree_it_killed(tmp_path: Path) -> None:
    with _running_tree(tmp_path, GPU_ORDER, {"sglang::scheduler_TP0", "sglang::detokenizer"}) as server:
        scheduler = _pid_of(server, "sglang::scheduler_TP0")
        rest = [pid for pid in server.members.names() if pid not in (scheduler, server.pid)]
        os.kill(scheduler, signal.SIGKILL)
        _look_once_all_are_zombies(server, rest)
        assert {d.member.pid: d.status for d in server.members.deaths} == {
            scheduler: None, **{pid: -signal.SIGKILL for pid in rest}}
        text = server.members.describe_first() or ""
        assert text.startswith(f"sglang::scheduler_TP0 (pid {scheduler}): gone"), text
        with_it = text.split("; with it: ", 1)[1]
        assert with_it.index("sglang::detokenizer") < with_it.index("resource_tracker"), text


def test_where_the_order_cannot_be_known_the_message_says_so(tmp_path: Path) -> None:
    with _running_tree(tmp_path, TREE, {"sglang::scheduler_TP0", "sglang::scheduler_TP1"}) as server:
        ranks = [_pid_of(server, "sglang::scheduler_TP0"), _pid_of(server, "sglang::scheduler_TP1")]
        for pid in ranks:  # both SIGKILLed at once (the OOM killer, or a launcher): nothing tells them apart
            os.kill(pid, signal.SIGKILL)
        _look_once_all_are_zombies(server, ranks)
        text = server.members.describe_first() or ""
        assert text.startswith("not knowable: sglang::scheduler_TP"), text
        assert all(f"(pid {pid}, killed by SIGKILL (exit code 137))" in text for pid in ranks), text


EXIT_THREAD = {"x86_64": 60, "aarch64": 93}  # the exit syscall: ends the calling thread only, not the process
LEADER_GONE_FIRST = """
import ctypes, os, sys, threading, time
def last_thread():
    time.sleep(1.5)  # what a SIGKILLed launcher's other threads do: unwind for a while
    os._exit(7)
threading.Thread(target=last_thread).start()
ctypes.CDLL(None).syscall({exit_nr}, 0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine not in EXIT_THREAD,
                    reason="a zombie main thread beside live threads is Linux's, made with its exit syscall")
def test_a_process_whose_main_thread_is_gone_is_not_alive_while_its_threads_unwind(tmp_path: Path) -> None:
    from pytest_sglang.launch.members import leader_exited

    script = LEADER_GONE_FIRST.format(exit_nr=EXIT_THREAD[os.uname().machine])
    process = ServerProcess([sys.executable, "-c", script], env=dict(os.environ), log_path=tmp_path / "log",
                            reap_on_parent_death=False)
    try:
        deadline = time.monotonic() + 30
        while not leader_exited(process.pid):
            assert time.monotonic() < deadline and process.popen.poll() is None, "the main thread never exited"
            time.sleep(0.01)
        assert process.popen.poll() is None  # waitpid has nothing to say yet: the other thread runs
        assert process.poll() == 7  # the check waits for the exit instead of calling the process alive
    finally:
        process.stop(grace=1)
