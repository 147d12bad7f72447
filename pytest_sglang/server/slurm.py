"""A server spread over the nodes of a SLURM cluster: the slurm origin of the handle. launch/slurm.py does the
SLURM work (the srun step, its allocation, its teardown).

The same readiness loop and log rules as a server launched here, once per node: rank 0's log and HTTP probe,
and each other node as a Peer with its own log and its own /health, composed whatever the profile's kind (a
node nothing can ask is still awaited, so its silence names it). What differs is the process tree (a
SlurmStep, srun here and its tasks on the nodes) and the liveness, which names the node that failed.
"""

from __future__ import annotations

import shlex
import time
import uuid
import warnings
from dataclasses import dataclass, field

from pytest_sglang.errors import (
    ProfileError,
    ResourcesHeldWarning,
    ServerDiedError,
)
from pytest_sglang.launch.logdir import open_log
from pytest_sglang.launch.plan import LaunchPlan, base_url
from pytest_sglang.launch.release import stop_and_release
from pytest_sglang.launch.slurm import (
    LOOPBACK,
    Node,
    SlurmPlan,
    SlurmStep,
    TaskEnd,
    is_stop_noise,
    plan_slurm,
    srun_said,
    task_ends,
)
from pytest_sglang.server.handle import FAILURE_GRACE_SECONDS, LaunchedLiveness, ServerHandle
from pytest_sglang.server.origins import startup_wait
from pytest_sglang.server.ready import (
    NodeEnd,
    Peer,
    Probe,
    RecordCallback,
    StatusCallback,
    health_probe,
    ignore,
    wait_for,
)
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.watch import LogTail, LogWatcher

PEER_HEALTH_PATH = "/health"  # SGLang's ranks >= 1 serve this alone, on their own --port


def launch_slurm_server(plan: LaunchPlan, *, on_status: StatusCallback = ignore,
                        on_record: RecordCallback = ignore) -> ServerHandle:
    """Launch the planned server on its profile's SLURM nodes and return once every node is ready; on any
    failure the step (and the job srun made) is cancelled and gone from the queue."""
    profile = plan.profile
    plan.register_secrets()

    def say(text: str) -> None:
        on_status(f"[sglang {profile.name}] {text}")

    token = uuid.uuid4().hex
    splan = plan_slurm(plan, token)
    for path in [splan.srun_log, *(splan.node_log(rank) for rank in range(splan.spec.nodes))]:
        open_log(path).close()  # private, and empty: a reused --sglang-log-dir holds an earlier ready line
    where = f"in job {splan.inside_job}" if splan.inside_job else "in a job of its own"
    say(f"asking SLURM for {splan.spec.nodes} node(s) {where}: logs {splan.node_log(0).name} ... in "
        f"{plan.log_path.parent}")
    step = SlurmStep(splan)
    step.start(token=token)
    try:
        handle = _wait_ready(plan, splan, step, on_status=on_status, on_record=on_record, say=say)
    except BaseException:  # a failed startup, Ctrl-C, pytest-timeout cutting it
        step.stop(grace=min(FAILURE_GRACE_SECONDS, profile.shutdown_grace))
        raise
    return handle


def _wait_ready(plan: LaunchPlan, splan: SlurmPlan, step: SlurmStep, *, on_status: StatusCallback,
                on_record: RecordCallback, say: StatusCallback) -> ServerHandle:
    profile = plan.profile
    say(f"job {step.job_id} runs on {', '.join(n.hostname for n in step.nodes)}")
    head = step.nodes[0]
    reach = _reach_host(plan, head)
    watcher = LogWatcher(plan.kind, ready_pattern=plan.ready_pattern, started_at=step.started_at,
                         tail=LogTail(splan.node_log(0)))
    peers = [_peer(plan, splan, step, node) for node in step.nodes[1:]]
    template = StartupRecord(profile=profile.name, kind=plan.kind.name, origin="slurm", outcome="ready",
                             host=reach, port=plan.port, model=profile.model, log_path=splan.node_log(0),
                             pid=step.pid)
    wait = startup_wait(plan, template=template, process=step, watcher=watcher, base_url=base_url(reach, plan.port),
                        command=[shlex.join(splan.argv)],
                        look_at=f"each node's log ({profile.name}.nodeN.log) and srun's ({splan.srun_log.name})",
                        peers=peers, node=head.label, ends=lambda: _node_ends(step),
                        more_hints=lambda code, d: _srun_hints(splan))
    record = wait_for(wait, on_status=on_status, on_record=on_record)
    health = health_probe(plan, base_url(reach, plan.port))
    liveness = SlurmLiveness(profile=profile.name, process=step, watcher=watcher, health=health,
                             log_path=splan.node_log(0), host=reach, port=plan.port,
                             shutdown_grace=profile.shutdown_grace, on_status=say, peers=peers, nodes=step.nodes)
    return ServerHandle(record, liveness, api_key=profile.api_key)


def _reach_host(plan: LaunchPlan, node: Node) -> str:
    """Where tests reach a node's server: the profile's loopback host where SLURM's nodes are this machine,
    else the node's address (the server must then listen beyond loopback)."""
    if plan.host in LOOPBACK:
        if node.address not in LOOPBACK:
            raise ProfileError(
                f"profile {plan.profile.name!r}: its server listens on {plan.host}, but SLURM runs it on "
                f"{node.hostname} ({node.address}), which tests here cannot reach there: set host = \"0.0.0.0\" "
                "(or the nodes' interface) in the profile.")
        return plan.host
    return node.address


def _peer(plan: LaunchPlan, splan: SlurmPlan, step: SlurmStep, node: Node) -> Peer:
    path = _peer_health_path(plan)
    probe = (Probe(base_url(_reach_host(plan, node), splan.node_port(node.rank)), path, plan.headers)
             if path is not None else None)
    log = splan.node_log(node.rank)
    watcher = LogWatcher(plan.kind, ready_pattern=plan.ready_pattern, started_at=step.started_at, tail=LogTail(log))
    return Peer(name=node.label, watcher=watcher, probe=probe, log_path=log)


def _node_ends(step: SlurmStep) -> list[NodeEnd]:
    """How each node ended, as srun reports it, named as the readiness loop names the nodes."""
    return [NodeEnd(name=step.nodes[end.rank].label, code=end.code, said=end.line, stopped=end.after_stop)
            for end in task_ends(srun_said(step.splan.srun_log)) if end.rank < len(step.nodes)]


def _peer_health_path(plan: LaunchPlan) -> str | None:
    """What each node other than rank 0 answers on its own port once it is up: SGLang's ranks >= 1 serve
    /health; a generic command serves the profile's health_path on each node's own {port} where the profile
    sets one. vLLM's --headless nodes and a generic command without one (torchrun's other nodes) serve no
    HTTP: such a node is awaited until rank 0 is ready, and named if it goes silent (server/readiness/peers.py)."""
    if plan.sim or plan.kind.name == "sglang":
        return PEER_HEALTH_PATH
    if plan.kind.name == "generic" and plan.profile.health_path:
        return plan.profile.health_path
    return None


def _srun_hints(splan: SlurmPlan) -> list[str]:
    """What srun said that matters: every task's end (``srun: error: node2: task 1: Exited with exit code 1``),
    the decisive lines, first, then its other errors; never its lines about stopping the step, which the
    plugin's own cancel (or srun's --kill-on-bad-exit) makes."""
    said = srun_said(splan.srun_log)
    ends = [end.line for end in task_ends(said)]
    errors = [line for line in said if line.startswith(("srun: error", "srun: fatal")) and line not in ends
              and not is_stop_noise(line)]
    return [f"srun said: {line} (all of srun's messages: {splan.srun_log})"
            for line in dict.fromkeys([*ends, *errors[-3:]])]


@dataclass(eq=False)
class SlurmLiveness(LaunchedLiveness):
    """A server this run started through SLURM: rank 0's liveness, plus every other node's log and /health;
    the death of any node names it (rank and hostname)."""

    process: SlurmStep
    peers: list[Peer] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)

    def death(self) -> ServerDiedError | None:
        now = time.monotonic()
        for peer in self.peers:
            peer.watcher.poll(now)
        error = self._node_death()
        if error is not None:
            self.process.stop(grace=FAILURE_GRACE_SECONDS)
            return error
        return super().death()

    def _node_death(self) -> ServerDiedError | None:
        # A node that logged a crash is dead once its health server is gone too (or srun saw it end, below).
        crashed = [p for p in self.peers if p.watcher.failing_since is not None
                   and (p.probe is None or not p.probe.ok(timeout=2.0))]
        if crashed:
            return self._peer_died(crashed[0], "logged a crash")
        code = self.process.poll()
        ends: list[TaskEnd] = task_ends(srun_said(self.process.splan.srun_log)) if code is not None else []
        failed = next((end for end in ends if not end.after_stop and end.rank < len(self.nodes)), None)
        if failed is not None:  # its own exit status, not srun's (the status of whichever node srun stopped last)
            node = self.nodes[failed.rank]
            if node.rank > 0:
                return self._peer_died(self.peers[node.rank - 1], f"ended: {failed.what}", failed.code)
            return self._with_srun(self._died(f"{node.label} died during the session: {failed.what}", failed.code))
        for peer in self.peers:
            if code is None and peer.probe is not None and not peer.probe.ok(timeout=2.0):
                return self._peer_died(peer, f"stopped answering {peer.probe.url} ({peer.probe.last})")
        return None

    def _peer_died(self, peer: Peer, what: str, code: int | None = None) -> ServerDiedError:
        peer.watcher.poll(time.monotonic(), final=True)
        diagnosis = peer.watcher.diagnosis(exit_code=code)
        return ServerDiedError(
            f"{peer.name} died during the session: it {what}", profile=self.profile, log_path=peer.log_path,
            diagnosis=diagnosis, elapsed=time.monotonic() - self.process.started_at,
            hints=[*_srun_hints(self.process.splan),
                   "every later test that uses this server fails with this same error; the step has been cancelled"])

    def _with_srun(self, error: ServerDiedError) -> ServerDiedError:
        return ServerDiedError(error.headline, profile=error.profile, log_path=error.log_path,
                               diagnosis=error.diagnosis, elapsed=error.elapsed,
                               hints=[*error.hints, *_srun_hints(self.process.splan)])

    def close(self) -> None:
        stop_and_release(self.process, grace=self.shutdown_grace, profile=self.profile, host=self.host,
                         port=self.port, on_status=self.on_status)
        if self.process.left:
            warnings.warn(ResourcesHeldWarning(
                f"[sglang {self.profile}] SLURM still lists {', '.join(self.process.left)} after scancel and "
                f"{self.process.splan.spec.nodes} node(s)' teardown: `squeue` shows it; `scancel` it by hand"),
                stacklevel=2)

