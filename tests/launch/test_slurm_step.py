"""SlurmStep.stop() and srun's task ends, without a cluster: srun is a fake, squeue and scancel are recorded, and
time is a fake clock, so each test judges what stop() asks and waits on, never the machine's speed."""

from __future__ import annotations

import subprocess
import types
from pathlib import Path

import pytest

import pytest_sglang.launch.slurm as slurm
from pytest_sglang.config.profiles import load_profiles
from pytest_sglang.launch.plan import plan_launch
from pytest_sglang.launch.slurm import Node, SlurmStep, plan_slurm, task_ends


class FakeSrun:
    """srun here: it exits ``after`` fake seconds once SLURM was asked to signal (or kill) the step."""

    def __init__(self, clock: FakeClock, exits_on: tuple[str, ...], after: float = 0.3) -> None:
        self.clock, self.exits_on, self.after = clock, exits_on, after
        self.asked_at: float | None = None
        self.stopped = False

    def asked(self, options: list[str]) -> None:
        if self.asked_at is None and any(o in self.exits_on for o in (options or ["kill"])):
            self.asked_at = self.clock.now

    def poll(self) -> int | None:
        return 0 if self.asked_at is not None and self.clock.now >= self.asked_at + self.after else None

    def stop(self, grace: float = 30.0) -> int | None:
        self.stopped = True
        return self.poll()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SlurmStep, FakeClock, list[list[str]]]:
    (tmp_path / "pyproject.toml").write_text("[tool.pytest_sglang.profiles.two]\nslurm = { nodes = 2 }\n")
    profile = load_profiles(tmp_path, None).profiles["two"]
    splan = plan_slurm(plan_launch(profile, sim=True, log_dir=tmp_path), "f" * 32, environ={})
    clock = FakeClock()
    monkeypatch.setattr(slurm, "time", types.SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep))
    calls: list[list[str]] = []
    step = SlurmStep(splan, nodes=[Node(0, "node1", "127.0.0.1"), Node(1, "node2", "127.0.0.1")], job_id="7")

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        if argv[0] == "scancel":
            step.srun.asked([a for a in argv[1:-1] if a.startswith("--")])  # type: ignore[attr-defined]
            return subprocess.CompletedProcess(argv, 0, "", "")
        # The job has ended but stays listed, COMPLETING, for ever: only a --states filter leaves it out.
        listed = "" if any(a.startswith("--states=") for a in argv) else "7\n"
        return subprocess.CompletedProcess(argv, 0, listed, "")

    monkeypatch.setattr(slurm.subprocess, "run", run)
    return step, clock, calls


def test_stop_returns_once_srun_exits_not_once_the_queue_forgets_the_job(step) -> None:  # type: ignore[no-untyped-def]
    s, clock, calls = step
    s.srun = FakeSrun(clock, exits_on=("--signal=TERM",))  # type: ignore[assignment]
    began = clock.now
    assert s.stop(grace=0.5) == 0
    assert [c for c in calls if c[0] == "scancel"] == [["scancel", "--signal=TERM", "7"]]
    squeues = [c for c in calls if c[0] == "squeue"]
    assert len(squeues) == 1 and any(a.startswith("--states=") for a in squeues[0]), squeues  # only for `left`
    # srun's exit (0.3 s after the signal) is polled at STOP_POLL_SECONDS: it returns within one poll of it
    assert clock.now - began <= 0.3 + slurm.STOP_POLL_SECONDS + 1e-9
    assert s.left == [] and s.srun.stopped  # type: ignore[attr-defined]


def test_a_step_that_outlives_the_grace_gets_slurms_kill_then_stop_returns_once_srun_exits(step) -> None:  # type: ignore[no-untyped-def]
    s, clock, calls = step
    s.srun = FakeSrun(clock, exits_on=("kill",), after=2.0)  # type: ignore[assignment]  # ignores SIGTERM
    began = clock.now
    s.stop(grace=0.5)
    assert [c for c in calls if c[0] == "scancel"] == [["scancel", "--signal=TERM", "7"], ["scancel", "7"]]
    assert 0.5 + 2.0 <= clock.now - began <= 0.5 + 2.0 + 2 * slurm.STOP_POLL_SECONDS + 1e-9
    assert len([c for c in calls if c[0] == "squeue"]) == 1


def test_srun_task_ends_give_each_nodes_own_status_and_whether_it_failed_of_itself() -> None:
    said = ["srun: error: node2: task 1: Exited with exit code 1",
            "srun: launch/slurm: _step_signal: Terminating StepId=5.0",
            "srun: error: node1: task 0: Terminated",
            "srun: Force Terminated StepId=5.0"]
    assert [(e.rank, e.host, e.code, e.after_stop) for e in task_ends(said)] == [(1, "node2", 1, False),
                                                                                 (0, "node1", -15, True)]
    both = ["srun: error: node2: task 1: Exited with exit code 2",
            "srun: launch/slurm: _step_signal: Terminating StepId=6.0",
            "srun: error: node1: task 0: Exited with exit code 2"]
    assert [(e.rank, e.code, e.after_stop) for e in task_ends(both)] == [(1, 2, False), (0, 2, True)]
    assert [(e.rank, e.code) for e in task_ends(["srun: error: node[1-2]: tasks 0-1: Killed"])] == [(0, -9), (1, -9)]


class ExitedSrun:
    """srun that has already exited with ``code``: its tasks ran and ended, or SLURM refused it."""

    def __init__(self, code: int) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


def _cluster_that_lists(row: str, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """squeue lists the job only with --states=all (it has ended); scontrol knows node1 and node2."""
    calls: list[list[str]] = []

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, row if "--states=all" in argv else "", "")
        if argv[1:3] == ["show", "hostnames"]:
            return subprocess.CompletedProcess(argv, 0, "node1\nnode2\n", "")
        return subprocess.CompletedProcess(argv, 0, f"NodeName={argv[-1]} NodeAddr=127.0.0.1 State=IDLE", "")

    monkeypatch.setattr(slurm.subprocess, "run", run)
    return calls


def test_a_step_whose_tasks_all_ended_between_two_looks_is_allocated_not_refused(step, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A node that fails at once can end the whole step before squeue is first asked (CI saw it: node 1 exited 1
    and srun's --kill-on-bad-exit ended node 0 within one poll): the job did run on its nodes, so the startup
    goes on to name the failing node from srun's log, instead of saying SLURM refused the job."""
    s, _, _ = step
    fresh = SlurmStep(s.splan)
    fresh.srun = ExitedSrun(137)  # type: ignore[assignment]
    calls = _cluster_that_lists("7|FAILED|node[1-2]|NonZeroExitCode\n", monkeypatch)
    fresh._wait_allocated()
    assert fresh.job_id == "7" and [n.label for n in fresh.nodes] == ["node 0 (node1)", "node 1 (node2)"]
    assert ["scontrol", "show", "hostnames", "node[1-2]"] in calls


def test_srun_that_exits_with_no_job_listed_is_a_refusal_naming_srun(step, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    s, _, _ = step
    s.splan.srun_log.write_text("srun: error: Unable to allocate resources: Requested node configuration is not "
                                "available\n")
    fresh = SlurmStep(s.splan)
    fresh.srun = ExitedSrun(1)  # type: ignore[assignment]
    _cluster_that_lists("", monkeypatch)
    with pytest.raises(slurm.SlurmError, match=r"srun exited with code 1 before its tasks started: srun: error: "
                                                r"Unable to allocate resources: Requested node configuration"):
        fresh._wait_allocated()
    assert fresh.nodes == []
