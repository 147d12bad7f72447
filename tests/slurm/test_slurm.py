"""A server over two SLURM nodes (the simulator on each), on the real two-node cluster of conftest.py: it comes
up, and each fault row of docs/multinode.md shows its message, with nothing left on either node and an empty
queue. A row's promptness is judged against a margin the test sets, never against the machine's speed: the
error comes before the time the startup, the timeout or the blocking job would have taken (each far longer);
the seconds each row took go to the -s output for the docs' table."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO
from slurmtools import Project, profile

PASSING = """
import requests

def test_serves(sglang_server):
    assert requests.get(sglang_server.url("/v1/models"), timeout=5).status_code == 200
    assert sglang_server.log_path.name.endswith(".node0.log")
"""

SLOW = """
import time

def test_waits(sglang_server):
    time.sleep(120)
"""


def _elapsed(output: str) -> float:
    found = re.search(r"\(after ([\d.]+) s", output)
    assert found, output
    return float(found.group(1))


def _assert_nothing_left(project: Project, row: str, seconds: float) -> None:
    """Nothing of the server on either node, an empty queue; the row's figure goes to -s output (docs table)."""
    procs, queue = project.left_behind()
    assert procs == [], procs
    assert queue == [], queue
    print(f"\nfault row {row}: {seconds:.1f} s; left: {len(procs)} processes, {len(queue)} jobs in the queue")


def test_two_nodes_serve_and_leave_nothing(project: Project) -> None:
    project.write(profile("two", project.mark), PASSING)
    out, took = project.run("two")
    assert "1 passed" in out, out
    assert "job " in out and "runs on node1, node2" in out, out
    node1 = project.node_log("two", 1).read_text()
    assert "Init torch distributed begin." in node1 and "fired up" not in node1
    _assert_nothing_left(project, "healthy run (whole pytest run)", took)


def test_crash_on_node_1_during_startup(project: Project) -> None:
    # node 0 would be ready at 60 s and the stall timeout is longer: an error before that is the crash's own
    project.write(profile("crash1", project.mark, sim='startup_seconds = 60, fault = "traceback", fault_node = 1, '
                                                     "fault_after = 1.0", extra="stall_timeout = 120"), PASSING)
    out, _ = project.run("crash1")
    assert "node 1 (node2) crashed during startup" in out, out
    assert "AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute" in out, out
    assert "crash1.node1.log" in out, out
    assert 1.0 <= _elapsed(out) < 60, out
    _assert_nothing_left(project, "crash on node 1 at 1.0 s (error after)", _elapsed(out))


def test_node_1_never_joins(project: Project) -> None:
    project.write(profile("hang1", project.mark, sim='startup_seconds = 2, fault = "hang", fault_node = 1',
                          extra="stall_timeout = 3\nstartup_timeout = 60"), PASSING)
    out, _ = project.run("hang1")
    assert re.search(r"node 1 \(node2\) has logged nothing new for 3 s in phase initialising torch distributed; "
                     r"rank 0 is waiting in initialising torch distributed", out), out
    assert 3.0 <= _elapsed(out) < 60, out  # the stall timeout, not the startup timeout
    _assert_nothing_left(project, "node 1 never joins, stall_timeout 3 s (error after)", _elapsed(out))


def test_node_1_dies_mid_session(project: Project) -> None:
    tests = f"""
import os, signal, time, psutil
import requests

def test_first(sglang_server):
    assert requests.get(sglang_server.url("/v1/models"), timeout=5).status_code == 200
    for proc in psutil.process_iter():
        try:
            env, cmd = proc.environ(), " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if env.get("TEST_MARK") == "{project.mark}" and env.get("SLURM_NODEID") == "1" and \
                cmd.endswith("--dist-init-addr " + cmd.rsplit(" ", 1)[-1]) and "sim.worker" not in cmd:
            os.kill(proc.pid, signal.SIGKILL)
    time.sleep(0.5)

def test_second(sglang_server):
    pass
"""
    project.write(profile("dies1", project.mark), tests)
    out, took = project.run("dies1")
    assert "1 passed" in out and "1 failed" in out, out
    assert "node 1 (node2) died during the session" in out, out
    _assert_nothing_left(project, "node 1 SIGKILLed mid-session (whole pytest run)", took)


def test_pytest_sigkilled(project: Project) -> None:
    project.write(profile("killed", project.mark), SLOW)
    pytest_proc = project.start("killed")
    try:
        project.wait_logged("killed", 0, "fired up and ready to roll")
        time.sleep(0.5)
    finally:
        pytest_proc.kill()
        pytest_proc.wait()
    began = time.monotonic()
    procs, queue = project.left_behind()
    took = time.monotonic() - began
    assert procs == [] and queue == [], (procs, queue)
    _assert_nothing_left(project, "pytest SIGKILLed (all gone after)", took)


def test_ctrl_c_during_startup(project: Project) -> None:
    startup = 120  # pytest exits long before the server would have been ready: it did not wait the startup out
    project.write(profile("ctrlc", project.mark, sim=f"startup_seconds = {startup}"), SLOW)
    pytest_proc = project.start("ctrlc")
    project.wait_logged("ctrlc", 1, "Load weight begin")
    pytest_proc.send_signal(signal.SIGINT)
    began = time.monotonic()
    out, _ = pytest_proc.communicate(timeout=startup - 30)
    took = time.monotonic() - began
    assert "KeyboardInterrupt" in out, out
    _assert_nothing_left(project, "Ctrl-C during startup (pytest exited after)", took)


def test_allocation_refused(project: Project) -> None:
    project.write(profile("three", project.mark, slurm="nodes = 3, queue_timeout = 60"), PASSING)
    out, took = project.run("three")
    assert "SLURM did not give profile 'three' its 3 node(s)" in out, out
    assert "(reason: PartitionConfig): srun: Requested partition configuration not available now" in out, out
    assert took < 60, out  # refused outright: it did not wait out the queue timeout
    _assert_nothing_left(project, "allocation refused (whole pytest run)", took)


BLOCKER_S = 120


def test_allocation_pending_too_long(project: Project) -> None:
    blocker = subprocess.run(["sbatch", "--parsable", "-N2", "--job-name=blocker", "--output=/dev/null",
                              "--wrap", f"sleep {BLOCKER_S}"], capture_output=True, text=True,
                             env=project.cluster.env(), check=True).stdout.strip()
    try:
        project.write(profile("pending", project.mark, slurm="nodes = 2, queue_timeout = 2"), PASSING)
        out, took = project.run("pending")
    finally:
        subprocess.run(["scancel", blocker], env=project.cluster.env(), check=False)
    assert re.search(r"SLURM kept job \d+ \(pytest-sglang-pending-\w+\) of profile 'pending' pending for 2 s "
                     r"\(reason: (Resources|Priority|None)\); it has been cancelled", out), out
    assert took < BLOCKER_S, out  # cancelled at its queue timeout, not run once the blocker ended
    _assert_nothing_left(project, "pending past queue_timeout 2 s (whole pytest run)", took)


def test_each_task_fills_its_own_rank_port_and_head(project: Project) -> None:
    from pytest_sglang.launch.slurm import NODE_TASK, TASK_NAME

    out = subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "-l", "bash", "-c", NODE_TASK, TASK_NAME, "5000,5001",
                          "printf", "%s|", "{node_rank}", "{node_port}", "{head_host}", "{headless}", "$SLURM_NODEID"],
                         capture_output=True, text=True, env=project.cluster.env(), timeout=30, check=True).stdout
    assert sorted(line.strip() for line in out.splitlines()) == [
        "0: 0|5000|127.0.0.1|$SLURM_NODEID|", "1: 1|5001|127.0.0.1|--headless|$SLURM_NODEID|"]


def test_inside_an_allocation_runs_a_step_of_it_and_leaves_the_job(project: Project) -> None:
    project.write(profile("inside", project.mark), PASSING)
    script = f"{shlex.join(project.argv('inside'))}; echo pytest-exit=$?; echo steps-left=$(squeue -h --steps " \
             "--jobs=$SLURM_JOB_ID | wc -l); echo job-left=$(squeue -h --jobs=$SLURM_JOB_ID | wc -l)"
    out = subprocess.run(["salloc", "-N2", "bash", "-c", script], cwd=project.path, capture_output=True, text=True,
                         env=project.cluster.env(), timeout=90, check=False)
    text = out.stdout + out.stderr
    assert "pytest-exit=0" in text and "1 passed" in text, text
    assert re.search(r"asking SLURM for 2 node\(s\) in job \d+", text), text
    assert "steps-left=0" in text and "job-left=1" in text, text  # the step is gone; the user's job is the user's
    _assert_nothing_left(project, "inside salloc (step ended, allocation given back by salloc)", 0.0)


TORCHRUN = REPO / "benchmarks" / "tp_server" / "server.py"


def _torch_python() -> str:
    for var in ("PYTEST_SGLANG_VLLM_PYTHON", "PYTEST_SGLANG_SGLANG_PYTHON"):
        python = os.environ.get(var, "")
        if python and Path(python).is_file():
            return python
    pytest.skip("no interpreter with torch (PYTEST_SGLANG_VLLM_PYTHON or PYTEST_SGLANG_SGLANG_PYTHON): "
                ".ci/install-servers.sh installs one")
    raise AssertionError  # unreachable


def _torchrun_profile(name: str, mark: str, python: str, model: Path, *extra: str) -> str:
    command = [python, "-m", "torch.distributed.run", "--nnodes", "{nnodes}", "--node-rank", "{node_rank}",
               "--master-addr", "{head_host}", "--master-port", "{dist_port}", "--nproc-per-node", "2",
               str(TORCHRUN), "--model", "{model}", "--host", "{host}", "--port", "{port}", *extra]
    return (f"[tool.pytest_sglang.profiles.{name}]\nkind = \"generic\"\nmodel = {json.dumps(str(model))}\n"
            f"command = {json.dumps(command)}\nready_pattern = \"tp_server ready:\"\nstartup_timeout = 180\n"
            f"shutdown_grace = 5\nslurm = {{ nodes = 2 }}\nenv = {{ TEST_MARK = \"{mark}\", PYTHONPATH = \"\" }}\n")


def test_real_torchrun_ranks_on_both_nodes_serve_then_rank_3_on_node_1_fails_named(project: Project) -> None:
    """A real multi-process server across the two nodes: torchrun with two gloo ranks on each (world 4);
    benchmarks/tp_server needs every rank for each token. Then rank 3 (on node 1) raises in its warmup."""
    python = _torch_python()
    model = project.path / "tp-tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 256, "hidden_size": 64}))
    tests = """
import requests

def test_completes(sglang_server):
    r = requests.post(sglang_server.url("/v1/completions"), json={"prompt": [1, 2, 3], "max_tokens": 8}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8
"""
    project.write(_torchrun_profile("tp4", project.mark, python, model)
                  + _torchrun_profile("tp4fault", project.mark, python, model, "--fault", "exception",
                                      "--fault-rank", "3"), tests)
    out, took = project.run("tp4", timeout=240, sim=False)
    assert "1 passed" in out, out
    node1 = project.node_log("tp4", 1).read_text()
    assert "[rank2]: Init torch distributed begin (backend gloo, world 4)" in node1, node1
    _assert_nothing_left(project, "torchrun world 4 over 2 nodes (whole pytest run)", took)
    out, took = project.run("tp4fault", timeout=240, sim=False)
    assert "node 1 (node2) crashed" in out, out
    assert "RuntimeError: injected fault on rank 3" in out, out
    _assert_nothing_left(project, "torchrun rank 3 on node 1 raises (whole pytest run)", took)


def test_pytest_sigkilled_inside_an_allocation_ends_the_step(project: Project) -> None:
    project.write(profile("killin", project.mark), SLOW)
    log = project.node_log("killin", 0)
    script = (f"{shlex.join(project.argv('killin'))} >/dev/null 2>&1 & p=$!; "
              f"for i in $(seq 300); do grep -q 'fired up' {shlex.quote(str(log))} 2>/dev/null && break; sleep 0.1; "
              "done; echo steps-running=$(squeue -h --steps --jobs=$SLURM_JOB_ID -o %j | grep -c pytest-sglang); "
              "kill -9 $p; t=$(date +%s.%N); for i in $(seq 150); do "
              "[ $(squeue -h --steps --jobs=$SLURM_JOB_ID -o %j | grep -c pytest-sglang) = 0 ] && break; "
              "sleep 0.1; done; "
              "echo step-gone-after=$(echo \"$(date +%s.%N) - $t\" | bc)")
    out = subprocess.run(["salloc", "-N2", "bash", "-c", script], cwd=project.path, capture_output=True, text=True,
                         env=project.cluster.env(), timeout=90, check=False)
    text = out.stdout + out.stderr
    assert "steps-running=1" in text, text
    gone = re.search(r"step-gone-after=([\d.]+)", text)
    assert gone and float(gone.group(1)) < 15.0, text
    _assert_nothing_left(project, "pytest SIGKILLed inside salloc (step gone after)", float(gone.group(1)))


def _generic_sim(name: str, mark: str, knobs: str, extra: str = "") -> str:
    """A generic profile (the torchrun route's kind) whose command is the simulator, run as is on each node with
    its own {node_rank} and {port}: no --sglang-sim, so the generic kind's own rules apply."""
    command = [sys.executable, "-m", "pytest_sglang.sim", "--model-path", "sim-model", "--host", "{host}",
               "--port", "{port}", "--tp", "2", "--nnodes", "{nnodes}", "--node-rank", "{node_rank}",
               "--dist-init-addr", "{head_host}:{dist_port}"]
    return (f"[tool.pytest_sglang.profiles.{name}]\nkind = \"generic\"\ncommand = {json.dumps(command)}\n"
            f"ready_pattern = \"fired up and ready to roll\"\nslurm = {{ nodes = 2 }}\n"
            f"env = {{ TEST_MARK = \"{mark}\", PYTEST_SGLANG_SIM = {json.dumps(knobs)} }}\n{extra}\n")


@pytest.mark.parametrize("health_path", ['health_path = "/health"', ""], ids=["probed", "no-http"])
def test_generic_node_1_that_never_joins_is_named_whatever_rank_0_logs(project: Project, health_path: str) -> None:
    """kind = "generic": node 1 is probed at its own port where the profile sets health_path, and awaited until
    rank 0 is ready where it serves no HTTP (torchrun's other nodes); either way it does not count as up at
    once, and its silence is named at the stall timeout while rank 0 logs "waiting for 1 more node(s)" every
    2 s, long before the startup timeout."""
    hang = '{"startup_seconds": 2, "fault": "hang", "fault_node": 1}'
    project.write(_generic_sim("ghang", project.mark, hang, f"{health_path}\nstall_timeout = 4\nstartup_timeout = 60")
                  + _generic_sim("gok", project.mark, '{"startup_seconds": 2}', health_path), PASSING.replace(
                      'assert sglang_server.log_path.name.endswith(".node0.log")', "pass"))
    out, _ = project.run("ghang", sim=False)
    assert re.search(r"node 1 \(node2\) has logged nothing new for \d+ s in phase starting; rank 0 is waiting",
                     out), out
    assert "waiting for 1 more node(s)" in project.node_log("ghang", 0).read_text()
    assert 4.0 <= _elapsed(out) < 60, out  # the stall timeout, not the startup timeout
    assert "ghang: FAILED TO START" in out and "(log: " + str(project.node_log("ghang", 1)) + ")" in out, out
    _assert_nothing_left(project, f"generic node 1 never joins ({health_path or 'no health_path'})", _elapsed(out))
    out, _ = project.run("gok", sim=False)  # and a healthy generic server over two nodes comes up
    assert "1 passed" in out, out
    _assert_nothing_left(project, "generic healthy", 0.0)


def _first_line(out: str, profile_name: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(f"[sglang {profile_name}] node"))


def _root_cause_block(out: str) -> str:
    return out.split("Root cause from the server log:", 1)[1].split("Full log:", 1)[0]


def test_node_1_exits_its_own_status_srun_line_and_log_are_named(project: Project) -> None:
    """node 1 rejects its command line (exit 2) and srun's --kill-on-bad-exit stops node 0: the error names
    node 1 with its own exit status and srun's line about it, the summary points at node 1's log, and node 0's
    slurmstepd "*** STEP ... CANCELLED ***" notice is no root cause."""
    project.write(profile("flag1", project.mark, sim='startup_seconds = 30, fault = "bad-flag", fault_node = 1',
                          extra="stall_timeout = 60"), PASSING)
    out, _ = project.run("flag1")
    first = _first_line(out, "flag1")
    assert first.startswith("[sglang flag1] node 1 (node2) exited during startup: sglang serve: error: "
                            "unrecognized arguments: --bad-flag"), out
    assert "exit code 2" in first and "node 0" not in first, out
    assert "srun said: srun: error: node2: task 1: Exited with exit code 2" in out, out
    assert "CANCELLED" not in _root_cause_block(out), out
    assert f"flag1: FAILED TO START: sglang serve: error: unrecognized arguments: --bad-flag (log: " \
           f"{project.node_log('flag1', 1)})" in out, out
    _assert_nothing_left(project, "node 1 exits 2 (error after)", _elapsed(out))


def test_both_nodes_fail_both_are_named(project: Project) -> None:
    """Both nodes fail of themselves: node 0 logs its error at once and hangs, node 1 logs its own and exits 1 a
    moment later; srun then stops node 0. Each log has its own root cause, so both are named (not a race of
    two exits, which srun's --kill-on-bad-exit decides)."""
    command = ["bash", "-c", 'echo "RuntimeError: NCCL error on node $1" >&2; if [ "$1" = 1 ]; then sleep 2; '
               'exit 1; fi; exec sleep 300', "task", "{node_rank}"]
    project.write(f"[tool.pytest_sglang.profiles.both]\nkind = \"generic\"\ncommand = {json.dumps(command)}\n"
                  f"slurm = {{ nodes = 2 }}\nenv = {{ TEST_MARK = \"{project.mark}\" }}\nstall_timeout = 60\n",
                  PASSING)
    out, _ = project.run("both", sim=False)
    first = _first_line(out, "both")
    assert "node 1 (node2)" in first and "node 0 (node1)" in first and "exited during startup" in first, out
    assert "RuntimeError: NCCL error on node" in first, out
    assert "srun: error: node2: task 1: Exited with exit code 1" in out, out
    _assert_nothing_left(project, "both nodes fail (error after)", _elapsed(out))


def test_node_exit_status_is_its_own_not_sruns(project: Project) -> None:
    """node 1 exits 1; srun then kills node 0 and exits with node 0's signal status (137/143): the error's
    exit status is node 1's, and srun's line about node 1 is shown."""
    command = ["bash", "-c", 'echo "starting on node $1"; if [ "$1" = 1 ]; then echo "RuntimeError: rendezvous '
               'refused on node $1" >&2; exit 1; fi; exec sleep 300', "task", "{node_rank}"]
    project.write(f"[tool.pytest_sglang.profiles.exit1]\nkind = \"generic\"\ncommand = {json.dumps(command)}\n"
                  f"slurm = {{ nodes = 2 }}\nenv = {{ TEST_MARK = \"{project.mark}\" }}\nstall_timeout = 60\n",
                  PASSING)
    out, _ = project.run("exit1", sim=False)
    first = _first_line(out, "exit1")
    assert first.startswith("[sglang exit1] node 1 (node2) exited during startup"), out
    assert "exit code 1)" in first or "exit code 1," in first, out
    assert "exit code 137" not in first and "exit code 143" not in first, out
    assert "srun said: srun: error: node2: task 1: Exited with exit code 1" in out, out
    assert f"(log: {project.node_log('exit1', 1)})" in out, out
    _assert_nothing_left(project, "node 1 exits 1 (error after)", _elapsed(out))
