"""A server on an ssh host: the remote origin of the handle. launch/remote.py does the ssh work.

The same readiness loop, the same log watcher (it reads the local copy of the log that the stream writes) and
the same liveness as a server launched here; what differs is the process tree, a RemoteServer: its exit and a
lost connection come over ssh, its teardown runs on the host, and its machine fingerprint is the host's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pytest_sglang.envknobs import env_knobs
from pytest_sglang.errors import (
    RemoteDiedError,
    RemoteStartupError,
    ServerDiedError,
    ServerError,
)
from pytest_sglang.launch.plan import LaunchPlan
from pytest_sglang.launch.remote import HEARTBEAT_TIMEOUT, RemoteServer, plan_remote, run_agent
from pytest_sglang.machine.facts import Machine, name_machine, parse_gpus
from pytest_sglang.server.handle import FAILURE_GRACE_SECONDS, LaunchedLiveness, ServerHandle
from pytest_sglang.server.origins import startup_wait
from pytest_sglang.server.ready import RecordCallback, StatusCallback, health_probe, ignore, wait_for
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.watch import LogTail, LogWatcher

LOST_HINT = ("the agent on the host tears the server down when its connection ends (at once when the connection "
             "closes, after {timeout:g} s without a heartbeat when it dies silently); check the network to {host}")


def launch_remote_server(plan: LaunchPlan, *, on_status: StatusCallback = ignore,
                         on_record: RecordCallback = ignore) -> ServerHandle:
    """Launch the planned server on its profile's ssh host and return once it is ready; on any failure nothing
    is left running there."""
    profile = plan.profile
    plan.register_secrets()
    rplan = plan_remote(plan)
    remote = RemoteServer(rplan, heartbeat_timeout=env_knobs().ssh_heartbeat_timeout or HEARTBEAT_TIMEOUT)
    remote.start()
    via = f"through ssh -L {rplan.forward}" if rplan.forward else "directly"
    on_status(f"[sglang {profile.name}] started on {remote.host} (pid {remote.pid} there), reached {via}: log "
              f"{remote.where}, copied to {plan.log_path}")
    watcher = LogWatcher(plan.kind, ready_pattern=plan.ready_pattern, started_at=remote.started_at,
                         tail=LogTail(plan.log_path))
    command = rplan.display(remote.remote_log)
    template = StartupRecord(profile=profile.name, kind=plan.kind.name, origin="ssh", outcome="ready",
                             host=rplan.reach_host, port=rplan.reach_port, model=profile.model, log_path=plan.log_path)

    def lost_during_startup(detail: str) -> Exception:
        watcher.poll(time.monotonic(), final=True)
        return RemoteStartupError(
            f"lost the ssh connection to {remote.host} during startup: {detail}", remote_log=remote.where,
            profile=profile.name, log_path=plan.log_path, diagnosis=watcher.diagnosis(exit_code=None),
            elapsed=time.monotonic() - remote.started_at, command=command,
            hints=[LOST_HINT.format(timeout=remote.heartbeat_timeout, host=remote.host)])

    remote.on_lost = lost_during_startup
    wait = startup_wait(plan, template=template, process=remote, watcher=watcher, base_url=rplan.base_url,
                        command=command,
                        look_at=f"the log (on the host: ssh {remote.host} tail -f {remote.remote_log})")
    try:
        record = wait_for(wait, on_status=on_status, on_record=on_record)
    except ServerError as exc:
        remote.stop(grace=min(FAILURE_GRACE_SECONDS, profile.shutdown_grace))
        raise RemoteStartupError.naming(exc, remote.where) from None
    except BaseException:  # Ctrl-C during a 10-minute startup, pytest-timeout cutting it
        remote.stop(grace=min(FAILURE_GRACE_SECONDS, profile.shutdown_grace))
        raise
    health = health_probe(plan, rplan.base_url)
    liveness = RemoteLiveness(profile=profile.name, process=remote, watcher=watcher, health=health,
                              log_path=plan.log_path, host=rplan.reach_host, port=rplan.reach_port,
                              shutdown_grace=profile.shutdown_grace)
    remote.on_lost = liveness.lost
    return ServerHandle(record, liveness, api_key=profile.api_key)


@dataclass(eq=False)
class RemoteLiveness(LaunchedLiveness):
    """A server this run started on an ssh host: a launched server's liveness, whose tree is a RemoteServer,
    whose lost connection is its death, and whose machine is the host."""

    process: RemoteServer
    _facts: dict[str, Any] | None = field(default=None, repr=False)

    def death(self) -> ServerDiedError | None:
        try:
            return super().death()
        except RemoteDiedError as lost:  # raised by the tree's poll(): the connection is gone
            return lost

    def _died(self, headline: str, code: int | None) -> ServerDiedError:
        return RemoteDiedError.naming(super()._died(headline, code), self.process.where)

    def lost(self, detail: str) -> Exception:
        """The error of a connection lost during the session (the tree's ``on_lost`` once ready)."""
        self.watcher.poll(time.monotonic(), final=True)
        host = self.process.host
        return RemoteDiedError(
            f"lost the ssh connection to {host} during the session: {detail}", remote_log=self.process.where,
            profile=self.profile, log_path=self.log_path, diagnosis=self.watcher.diagnosis(exit_code=None),
            elapsed=time.monotonic() - self.process.started_at,
            hints=[LOST_HINT.format(timeout=self.process.heartbeat_timeout, host=host),
                   "every later test that uses this server fails with this same error"])

    def machine(self, server: str | None) -> Machine:
        """The host's fingerprint (its nvidia-smi with the profile's environment, else its CPU), asked once."""
        if self._facts is None:
            rplan = self.process.rplan
            self._facts = run_agent(rplan, "machine", {"env": rplan.env}) or {}
        facts = self._facts
        if not facts:
            return Machine(name=f"ssh host {self.process.host} (its GPUs could not be read)", server=server)
        names, driver = parse_gpus(str(facts.get("gpus") or ""), facts.get("visible"))
        return name_machine(names, driver, cpu=str(facts.get("cpu")), cores=int(facts.get("cores") or 1),
                            server=server)
