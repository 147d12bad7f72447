"""A fleet as one server: its members launched, awaited, watched and torn down together behind one handle.

The servers (workers, or prefill and decode) start together, each with its own log and readiness, and the
fleet waits for them all in the one readiness loop, each a peer with a process of its own; then the router
starts, and the fleet is ready when the router's /readiness counts every server healthy (its "Router ready"
line comes before any worker joined). A member that crashes fails the startup at once, named, and every member
is stopped; once ready, each member is watched directly, so a member's death fails the next test whatever the
router does about it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial

import requests

from pytest_sglang.errors import ServerDiedError
from pytest_sglang.launch.fleet import READINESS_PATH, FleetPlan, MemberPlan
from pytest_sglang.launch.process import ServerProcess
from pytest_sglang.launch.release import stop_and_release
from pytest_sglang.server.handle import FAILURE_GRACE_SECONDS, LaunchedLiveness, ServerHandle
from pytest_sglang.server.origins import spawn
from pytest_sglang.server.ready import (
    Peer,
    Probe,
    RecordCallback,
    Server,
    StatusCallback,
    Subject,
    health_probe,
    ignore,
    members_startup,
    server_startup,
    wait_for,
)
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.watch import LogWatcher


class RouterReadiness(Probe):
    """The router's GET /readiness: 200 and every server counted healthy (``healthy_workers``, where it says).
    A router without /readiness (SGLang's mini_lb) is asked its /health instead."""

    def __init__(self, base_url: str, headers: dict[str, str], expected: int) -> None:
        super().__init__(base_url, (READINESS_PATH, "/health"), headers)
        self.expected = expected

    def _judge(self, response: requests.Response) -> bool:
        if self.path != READINESS_PATH:
            return super()._judge(response)
        healthy = _healthy_count(response)
        if response.status_code == 200 and (healthy is None or healthy >= self.expected):
            self._got("HTTP 200", 200)
            return True
        if response.status_code == 200:
            self._got(f"HTTP 200 with {healthy} of {self.expected} servers healthy", None)
        else:
            self._got(f"HTTP {response.status_code}" + (f" ({healthy} of {self.expected} servers healthy)"
                                                        if healthy is not None else ""), response.status_code)
        return False


def _healthy_count(response: requests.Response) -> int | None:
    try:
        body = response.json()
    except ValueError:
        return None
    value = body.get("healthy_workers") if isinstance(body, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(eq=False)
class MemberHandle(ServerHandle):
    """One member of a fleet, in ``sglang_server.members``: a server handle with its name and role."""

    name: str = ""
    role: str = ""  # "worker", "prefill", "decode", "router"


@dataclass(eq=False)
class FleetLiveness:
    """A fleet's members, each watched on its own (router last): the first one found dead is the fleet's
    death, named."""

    profile: str
    members: Mapping[str, MemberHandle]

    def death(self) -> ServerDiedError | None:
        for name, member in self.members.items():
            error = member.liveness.death()
            if error is not None:
                death = ServerDiedError(f"fleet member {name} ({member.role}): {error.headline}", profile=self.profile,
                                        log_path=error.log_path, diagnosis=error.diagnosis, elapsed=error.elapsed,
                                        hints=error.hints)
                death.member = name
                return death
        return None

    def logged_crash(self) -> bool:
        return any(member.liveness.logged_crash() for member in self.members.values())

    def survived(self) -> None:
        for member in self.members.values():
            member.liveness.survived()

    def close(self) -> None:
        _together(member.liveness.close for member in self.members.values())


@dataclass
class _Started:
    member: MemberPlan
    process: ServerProcess
    watcher: LogWatcher


def launch_fleet(plan: FleetPlan, *, on_status: StatusCallback = ignore, on_record: RecordCallback = ignore,
                 reap: bool = True, keep: bool = False, guardian_pid: int | None = None) -> ServerHandle:
    """Launch every member of the fleet and return its handle once the router counts every server healthy; on
    any failure, Ctrl-C included, every member started is stopped before the error goes on. ``keep``: closing
    the handle leaves the members running (an xdist run's controller stops them); ``guardian_pid``: the process
    whose death takes the members with it (default: this one)."""
    profile = plan.profile
    plan.register_secrets()

    def say(text: str) -> None:
        on_status(f"[sglang {profile.name}] {text}")

    started_at = time.monotonic()
    started: list[_Started] = []
    try:
        for member in plan.servers:
            started.append(_Started(member, *spawn(member.plan, say=say, reap=reap, guardian_pid=guardian_pid)))
        say("launching " + ", ".join(f"{s.member.name} (log {s.member.plan.log_path})" for s in started))
        peers = [_peer(s) for s in started]
        # no log of its own until the router runs: a failure names its member's log, Ctrl-C none
        template = StartupRecord(profile=profile.name, kind=profile.kind, origin="launched", outcome="ready",
                                 host=plan.router.plan.host, port=plan.router.plan.port, model=profile.model)
        members_wait = members_startup(
            Subject(template=template, started_at=started_at), peers, timeout=plan.router.plan.startup_timeout,
            stall_timeout=profile.stall_timeout, headline=lambda now: _not_up(peers, plan.router.plan.startup_timeout),
            timeout_hints=lambda: _timeout_hints(plan))
        wait_for(members_wait, on_status=on_status, on_record=_failures_only(on_record))
        members_up = time.monotonic() - started_at
        router = _Started(plan.router, *spawn(plan.router.plan, say=say, reap=reap, guardian_pid=guardian_pid))
        started.append(router)
        say(f"{len(peers)} servers ready after {members_up:.1f} s; router started (log {plan.router.plan.log_path})")
        router_server = Server(template=replace(template, pid=router.process.pid, log_path=plan.router.plan.log_path),
                               started_at=router.process.started_at, command=plan.router.plan.argv, node="router",
                               process=router.process, watcher=router.watcher)
        router_wait = server_startup(
            router_server, timeout=max(plan.router.plan.startup_timeout - members_up, 1.0),
            stall_timeout=profile.stall_timeout, await_line=False, peers=peers,
            probe=RouterReadiness(plan.router.base_url, plan.router.plan.headers, plan.expected_workers),
            timeout_hints=lambda: ["the router did not count every server healthy: look at its log (its health "
                                   "checks of each server) and GET /workers on it"])
        record = wait_for(router_wait, on_status=ignore, on_record=_failures_only(on_record))
    except BaseException:  # a member's crash, the router's, Ctrl-C during the startup
        _together(partial(_stop, s, FAILURE_GRACE_SECONDS, say) for s in started)
        raise
    total = time.monotonic() - started_at
    record = replace(record, startup_seconds=total, elapsed=total,
                     phases={"router": members_up, "ready": total})
    on_record(record)
    members = {s.member.name: _member_handle(s, peer, say, keep)
               for s, peer in zip(started, [*peers, None], strict=True)}
    return ServerHandle(record, FleetLiveness(profile.name, members), api_key=profile.api_key, members=members)


def _peer(started: _Started) -> Peer:
    readiness = started.member.plan.readiness
    plan = started.member.plan
    return Peer(started.member.name, started.watcher,
                Probe(plan.base_url, readiness.probe_paths, plan.headers) if readiness.probe_paths else None,
                plan.log_path, process=started.process, wait_for_line=readiness.line is not None,
                command=plan.argv)


def _member_handle(started: _Started, peer: Peer | None, say: StatusCallback, keep: bool) -> MemberHandle:
    plan, process = started.member.plan, started.process
    up_at = peer.up_at if peer is not None and peer.up_at is not None else time.monotonic()
    record = StartupRecord(profile=plan.profile.name, kind=plan.kind.name, origin="launched", outcome="ready",
                           host=plan.host, port=plan.port, model=plan.profile.model, log_path=plan.log_path,
                           pid=process.pid, startup_seconds=up_at - process.started_at,
                           phases=dict(started.watcher.phases))
    liveness = LaunchedLiveness(profile=plan.profile.name, process=process, watcher=started.watcher,
                                health=health_probe(plan, plan.base_url), log_path=plan.log_path, host=plan.host,
                                port=plan.port, shutdown_grace=plan.profile.shutdown_grace, keep=keep, on_status=say)
    return MemberHandle(record, liveness, api_key=plan.profile.api_key, name=started.member.name,
                        role=started.member.role)


def _stop(started: _Started, grace: float, say: StatusCallback) -> None:
    plan = started.member.plan
    stop_and_release(started.process, grace=min(grace, plan.profile.shutdown_grace), profile=plan.profile.name,
                     host=plan.host, port=plan.port, on_status=say)


def _together(calls: Iterable[Callable[[], object]]) -> None:
    """Run each call at once, each in its own thread (members stop in parallel: each may take its grace), and
    raise the first error once all have ended."""
    calls = list(calls)
    if not calls:
        return
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
    for future in futures:
        future.result()


def _failures_only(on_record: RecordCallback) -> RecordCallback:
    """A stage's record goes on only if it failed: the fleet's one ready record is made at the end."""
    return lambda record: None if record.ready else on_record(record)


def _not_up(peers: list[Peer], timeout: float) -> str:
    down = [f"{p.name} (phase {p.watcher.phase_label or 'starting'})" for p in peers if not p.up]
    return f"fleet not ready within its startup timeout of {timeout:.0f} s: not up: {', '.join(down) or 'none'}"


def _timeout_hints(plan: FleetPlan) -> list[str]:
    return ["raise startup_timeout in the profile or pass --sglang-startup-timeout=SECONDS",
            f"look at each member's log ({plan.servers[0].plan.log_path.parent}/{plan.profile.name}.*.log)"]
