"""A SLURM cluster as the place a server runs: the srun step, its allocation, its nodes, and its teardown.

Pytest-free. One srun step with one task per node runs the server (or the simulator) on every node. Inside an
allocation (SLURM_JOB_ID set: salloc, sbatch, a CI job on a SLURM runner) the step runs in it; outside one,
srun asks SLURM for a job of its own, named ``pytest-sglang-PROFILE-TOKEN``, and teardown cancels that job.

Each task's rank, port and the head node's address are only known on the node, so the task is a fixed bash
script (NODE_TASK) that fills the placeholders ``{node_rank}``, ``{node_port}``, ``{head_host}`` and
``{headless}`` from SLURM's own environment there (``{nnodes}`` and ``{dist_port}``, the rendezvous port on
the head node, are the same on every node and filled in here). The server's argv travels as the script's
arguments, never as one string for a shell, so nothing in it is quoted or expanded twice. SGLang's own recipe passes
``--node-rank "$SLURM_NODEID"`` on the srun line, where the batch shell expands it before srun runs and every
node gets rank 0.

Each node writes its own log, ``PROFILE.node<N>.log``, through srun's ``--output`` (written by slurmstepd on the
node: the log folder must be on a file system the nodes share, as a cluster's home or scratch is). srun's own
messages (allocation, "task 1: Killed") go to ``PROFILE.srun.log``. Node 0 listens on the profile's port, each
other node on a port of its own (picked free here), so nodes that share one host do not collide.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pytest_sglang.config.slurm import SlurmSpec
from pytest_sglang.errors import ProfileError, SlurmError
from pytest_sglang.launch.plan import LaunchPlan
from pytest_sglang.launch.ports import free_port
from pytest_sglang.launch.process import ServerProcess
from pytest_sglang.launch.srun_log import TaskEnd, cause, failed_task, is_stop_noise, srun_said, task_ends

__all__ = ["LOOPBACK", "NODE_TASK", "TASK_NAME", "Node", "SlurmPlan", "SlurmStep", "TaskEnd", "failed_task",
           "is_stop_noise", "nodes_of", "plan_slurm", "srun_said", "task_ends"]

NODE_TASK = "; ".join((  # one line, so that --sglang-show and an error's Command: print it whole
    "r=$SLURM_NODEID", 'IFS=, read -ra ports <<< "$1"', 'p=${ports[$r]}', "shift",
    'head=$(scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n1)',
    "addr=$(scontrol show node \"$head\" | grep -o 'NodeAddr=[^ ]*' | head -n1 | cut -d= -f2)",
    'a=()', 'for x in "$@"; do if [ "$x" = "{headless}" ]; then [ "$r" -gt 0 ] && a+=(--headless); continue; fi',
    'x=${x//"{node_rank}"/$r}', 'x=${x//"{node_port}"/$p}', 'x=${x//"{head_host}"/${addr:-$head}}', 'a+=("$x")',
    'done', 'exec "${a[@]}"'))
TASK_NAME = "pytest-sglang-node"  # $0 of NODE_TASK
POLL_SECONDS = 0.2
STOP_POLL_SECONDS = 0.02  # stop(): srun's exit, a local poll, is what tells that the step's processes are gone
# a job in any other state has no task left running (COMPLETING: SLURM tidies up after tasks that ended)
LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "STOPPED", "RESIZING", "REQUEUED")
GONE_TIMEOUT_SECONDS = 60.0  # after scancel, how long SLURM may take to end the steps (its KillWait included)
SQUEUE_TIMEOUT_SECONDS = 15.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# squeue's pending reasons that waiting never ends: the job asks for more than the partition or account allows
NEVER_REASONS = frozenset({"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
                           "InvalidAccount", "InvalidQOS", "AssocMaxNodesPerJobLimit", "QOSMaxNodePerJobLimit"})


@dataclass(frozen=True)
class Node:
    rank: int
    hostname: str
    address: str

    @property
    def label(self) -> str:
        return f"node {self.rank} ({self.hostname})"


@dataclass(frozen=True)
class SlurmPlan:
    """A planned server's srun step: the command, its per-node logs, and where its allocation comes from."""

    plan: LaunchPlan
    spec: SlurmSpec
    argv: list[str]  # srun ... bash -c NODE_TASK ...
    job_name: str
    inside_job: str | None  # the allocation the step runs in (SLURM_JOB_ID), or None: srun makes its own job
    dist_port: int
    ports: tuple[int, ...]  # node rank -> its port: rank 0's is the profile's

    @property
    def srun_log(self) -> Path:
        return self.plan.log_path.with_name(f"{self.plan.profile.name}.srun.log")

    def node_log(self, rank: int) -> Path:
        return self.plan.log_path.with_name(f"{self.plan.profile.name}.node{rank}.log")

    def node_port(self, rank: int) -> int:
        return self.ports[rank]


def plan_slurm(plan: LaunchPlan, token: str, environ: dict[str, str] | None = None) -> SlurmPlan:
    """The srun step that runs ``plan`` on its profile's nodes; SlurmError/ProfileError if it cannot."""
    profile, spec = plan.profile, plan.profile.slurm
    assert spec is not None, "plan_slurm needs a slurm profile"
    environ = dict(os.environ) if environ is None else environ
    inside = environ.get("SLURM_JOB_ID") or None
    dist_port = free_port("127.0.0.1")
    # Each node its own port, free here (nodes that share one host must not collide; a cluster's rarely do).
    ports = (plan.port, *(free_port("127.0.0.1") for _ in range(spec.nodes - 1)))
    node_argv = [_per_node_port(part, before, plan.port)
                 for before, part in zip(["", *plan.argv[:-1]], plan.argv, strict=True)]
    node_argv = [part.replace("{nnodes}", str(spec.nodes)).replace("{dist_port}", str(dist_port))
                 for part in node_argv]
    kind = "sglang" if plan.sim else plan.kind.name
    if kind == "sglang":
        node_argv += ["--nnodes", str(spec.nodes), "--node-rank", "{node_rank}",
                      "--dist-init-addr", f"{{head_host}}:{dist_port}"]
    elif kind == "vllm":
        _check_vllm_multinode(plan)
        node_argv += ["--nnodes", str(spec.nodes), "--node-rank", "{node_rank}", "--master-addr", "{head_host}",
                      "--master-port", str(dist_port), "{headless}"]
    job_name = f"pytest-sglang-{profile.name}-{token[:8]}"
    srun = ["srun", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", f"--job-name={job_name}", "--open-mode=append",
            f"--output={plan.log_path.with_name(f'{profile.name}.node%n.log')}"]
    if inside is None:
        srun += [f"--partition={spec.partition}"] if spec.partition else []
        srun += [f"--time={spec.time}"] if spec.time else []
    if spec.gpus_per_node is not None:
        srun.append(f"--gpus-per-node={spec.gpus_per_node}")
    srun += list(spec.args)
    argv = [*srun, "bash", "-c", NODE_TASK, TASK_NAME, ",".join(map(str, ports)), *node_argv]
    return SlurmPlan(plan=plan, spec=spec, argv=argv, job_name=job_name, inside_job=inside, dist_port=dist_port,
                     ports=ports)


def _per_node_port(part: str, before: str, port: int) -> str:
    """The profile's port as this node's own, where plan_launch wrote it as a port flag's value (``--port
    31000``, ``--port=31000``, a generic command's ``--http-port {port}``)."""
    if part == str(port) and before.startswith("-") and before.endswith("port"):
        return "{node_port}"
    flag, sep, value = part.partition("=")
    if sep and value == str(port) and flag.startswith("-") and flag.endswith("port"):
        return flag + "={node_port}"
    return part


def _check_vllm_multinode(plan: LaunchPlan) -> None:
    """vLLM's multiprocessing multi-node flags (--nnodes, --node-rank, --master-addr, --headless) are recent:
    look for them in the installed vLLM's sources (importing vLLM takes seconds)."""
    python = plan.argv[0]
    try:
        out = subprocess.run([python, "-c", "import importlib.util as u; s = u.find_spec('vllm'); "
                              "print(s.submodule_search_locations[0] if s else '')"],
                             capture_output=True, text=True, timeout=60, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise ProfileError(f"profile {plan.profile.name!r}: cannot run {python} to look for vLLM: {exc}") from None
    sources = [Path(out, "engine", "arg_utils.py"), Path(out, "entrypoints", "launchers", "cli_args.py"),
               Path(out, "entrypoints", "openai", "cli_args.py")]
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sources if out and p.is_file())
    missing = [flag for flag in ('"--nnodes"', '"--node-rank"', '"--master-addr"', '"--headless"') if flag not in text]
    if missing:
        raise ProfileError(
            f"profile {plan.profile.name!r} (kind 'vllm') spans nodes, but the vLLM of {python} "
            f"({out or 'not installed'}) has no multiprocessing multi-node flags "
            f"({', '.join(m.strip(chr(34)) for m in missing)} missing): upgrade vLLM, or run it with Ray yourself and "
            "give kind = 'generic' with a `command`.")


def nodes_of(nodelist: str, count: int) -> list[Node]:
    """The first ``count`` nodes of a SLURM node list (``node[1-2]``), with the addresses SLURM reaches them at."""
    names = _run(["scontrol", "show", "hostnames", nodelist]).split()[:count]
    if len(names) < count:
        raise SlurmError(f"SLURM's node list {nodelist!r} has {len(names)} node(s); the profile needs {count}.")
    nodes = []
    for rank, name in enumerate(names):
        found = re.search(r"NodeAddr=(\S+)", _run(["scontrol", "show", "node", name]))
        nodes.append(Node(rank=rank, hostname=name, address=found.group(1) if found else name))
    return nodes


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SQUEUE_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmError(f"`{' '.join(argv)}` failed: {exc}") from None
    if done.returncode != 0:
        raise SlurmError(f"`{' '.join(argv)}` failed (exit code {done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass(eq=False)
class SlurmStep:
    """The srun step of one server (a ProcessTree): srun runs here; its tasks run on the nodes.

    ``poll()`` is srun's exit code once it exited (srun exits once every task has, and ``--kill-on-bad-exit``
    ends the others when one fails). ``stop()`` cancels the step (the job too, where srun made it), then waits
    until SLURM lists neither any more: SLURM confirms that every node's step daemon has ended its tasks."""

    splan: SlurmPlan
    srun: ServerProcess = field(init=False)
    nodes: list[Node] = field(default_factory=list)
    job_id: str | None = None
    started_at: float = 0.0
    pid: int = 0  # srun's, here
    token: str = ""  # the owner token in srun's environment, which srun passes on to every task
    left: list[str] = field(default_factory=list)  # what teardown could not end (empty: nothing left)

    def start(self, *, token: str, guardian_pid: int | None = None) -> None:
        """Start srun and wait until SLURM has given it its nodes; SlurmError if SLURM refuses or keeps the
        job pending past the queue timeout. Nothing is left in the queue if this raises."""
        if shutil.which("srun") is None:
            raise SlurmError(f"profile {self.splan.plan.profile.name!r} runs through SLURM, but this machine has no "
                             "srun on its PATH: run pytest on a SLURM login node (or in salloc/sbatch), or install "
                             "SLURM's client (Debian: slurm-client).")
        cancel = [] if self.splan.inside_job else ["--name", self.splan.job_name]
        self.srun = ServerProcess(self.splan.argv, env=self.splan.plan.env, log_path=self.splan.srun_log,
                                  guardian_pid=guardian_pid, token=token, reaper_scancel=cancel)
        self.pid, self.token = self.srun.pid, token
        try:
            self._wait_allocated()
        except BaseException:
            self.stop(grace=0.0)
            raise
        self.started_at = time.monotonic()

    def _wait_allocated(self) -> None:
        spec, inside = self.splan.spec, self.splan.inside_job
        if inside is not None:
            self.job_id = inside
            self.nodes = nodes_of(os.environ.get("SLURM_JOB_NODELIST", ""), spec.nodes)
            return
        timeout = spec.queue_timeout or self.splan.plan.startup_timeout
        began = time.monotonic()
        while True:
            code = self.srun.poll()
            if code is not None:
                ran = self._queue_row(states="all")
                if ran is not None and ran[1] != "PENDING" and ran[2] not in ("", "(null)", "n/a"):
                    # Its tasks ran and all ended between two looks (a node that fails at once): how each
                    # ended is the startup's to tell, from srun's log and each node's, not a refusal.
                    self.job_id, self.nodes = ran[0], nodes_of(ran[2], spec.nodes)
                    return
                raise self._refused(f"srun exited with code {code} before its tasks started")
            row = self._queue_row()
            if row is not None and row[1] == "RUNNING":
                self.job_id = row[0]
                self.nodes = nodes_of(row[2], spec.nodes)
                return
            if row is not None and row[3] in NEVER_REASONS:
                raise self._refused(f"SLURM will never run job {row[0]} as asked (reason: {row[3]})")
            waited = time.monotonic() - began
            if waited > timeout:
                reason = row[3] if row is not None else "not in the queue yet"
                job = row[0] if row is not None else "?"
                raise SlurmError(
                    f"SLURM kept job {job} ({self.splan.job_name}) of profile {self.splan.plan.profile.name!r} "
                    f"pending for {waited:.0f} s (reason: {reason}); it has been cancelled.\n"
                    "Try: `squeue` shows what holds the nodes; raise slurm.queue_timeout (default: startup_timeout) "
                    "to wait longer, or ask for fewer nodes or another partition")
            time.sleep(POLL_SECONDS)

    def _refused(self, what: str) -> SlurmError:
        splan = self.splan
        return SlurmError(
            f"SLURM did not give profile {splan.plan.profile.name!r} its {splan.spec.nodes} node(s): {what}: "
            f"{cause(srun_said(splan.srun_log))}\nsrun's log: {splan.srun_log}\n"
            f"Command: {' '.join(splan.argv[:splan.argv.index('bash')])} ...\n"
            "Try: `sinfo -N` shows the nodes and partitions there are; ask for no more nodes, GPUs or time than a "
            "partition has (slurm = { nodes, gpus_per_node, partition, time, args })")

    def _queue_row(self, states: str = "") -> tuple[str, str, str, str] | None:
        """(job id, state, node list, reason) of the job srun made, or None while SLURM does not list it;
        ``states="all"`` finds it too once it has ended (SLURM keeps an ended job listed for MinJobAge)."""
        with contextlib.suppress(SlurmError):
            out = _run(["squeue", "-h", f"--name={self.splan.job_name}", "-o", "%i|%T|%N|%r",
                        *([f"--states={states}"] if states else [])])
            for line in out.splitlines():
                parts = line.strip().split("|")
                if len(parts) == 4:
                    return parts[0], parts[1], parts[2], parts[3]
        return None

    def poll(self) -> int | None:
        return self.srun.poll()

    def stop(self, grace: float = 30.0) -> int | None:
        """End the step on every node (SIGTERM, ``grace`` s, then SLURM's kill) and return as soon as its
        processes are gone: srun here exits once every node's step daemon has reported its task ended, so its
        exit is what is waited on (polled here, every STOP_POLL_SECONDS), not the queue, which lists a job
        that has ended as COMPLETING for seconds more. SLURM is asked only where srun cannot tell: a job still
        pending, or srun gone while SLURM still runs the step. What SLURM still runs then is named in ``left``."""
        if self.srun.poll() is None:
            if self.nodes:  # scancel --signal blocks on a job that is still pending: only a running one is asked
                self._scancel("--signal=TERM")
                self._wait_srun(grace)
            if self.srun.poll() is None:
                self._scancel()  # SLURM's kill: SIGTERM, KillWait, SIGKILL on every node; a pending job dequeued
                self._wait_srun(GONE_TIMEOUT_SECONDS)
        code = self.srun.stop(grace=min(grace, 5.0))
        self.left = self._listed(running=True)
        if self.left:  # srun is gone but SLURM still runs the step (srun was killed): SLURM must end it
            self._scancel()
            deadline = time.monotonic() + GONE_TIMEOUT_SECONDS
            while (left := self._listed(running=True)) and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
            self.left = left
        return code

    def _wait_srun(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.srun.poll() is None and time.monotonic() < deadline:
            time.sleep(STOP_POLL_SECONDS)

    def _scancel(self, *options: str) -> None:
        # the job srun made is known by its id: no squeue before the signal (inside an allocation the step's id
        # is only known to squeue)
        targets = [self.job_id] if self.splan.inside_job is None and self.job_id else self._listed()
        if targets:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["scancel", *options, *targets], capture_output=True, timeout=SQUEUE_TIMEOUT_SECONDS,
                               check=False)

    def _listed(self, running: bool = False) -> list[str]:
        """What SLURM still lists of this server: its steps (inside an allocation), or its job. ``running``:
        only what has not ended (a job COMPLETING has no task left; SLURM is tidying up after it)."""
        states = "" if not running else ",".join(LIVE_STATES)
        with contextlib.suppress(SlurmError):
            if self.splan.inside_job is None:
                out = _run(["squeue", "-h", f"--name={self.splan.job_name}", "-o", "%i",
                            *([f"--states={states}"] if states else [])])
                return out.split()
            out = _run(["squeue", "-h", "--steps", f"--jobs={self.splan.inside_job}", "-o", "%i %j"])
            return [line.split()[0] for line in out.splitlines() if line.split()[1:] == [self.splan.job_name]]
        return []
