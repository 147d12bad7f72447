"""Servers shared by pytest-xdist workers: each profile's server launches once for the whole run.

Design: the controller owns every server's life, a worker launches it. The controller (the xdist main
process, which runs no tests) makes a private run folder and hands its path and its own pid to the workers;
the first worker that needs a profile launches the server there, under one file lock, and the others attach
to it. The controller stops every server in the folder in its own `pytest_sessionfinish`, which runs after
the last worker is done, so no worker meets a server torn down under it; the reaper of each server watches
the controller, so a killed controller leaves nothing behind, and a crashed worker leaves nothing to clean up.
A file lock plus a state file each, rather than the controller launching: the controller does not know which
profiles the workers' tests will need until they ask, and a lazy launch never starts a server no test uses.

Servers of different profiles never run at once unless allowed: a worker that needs another profile waits,
lock released, until no live worker uses the running one, then stops it and launches its own. Users are
recorded by pid, so the tests of a worker that crashed never hold a server up.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from pytest_sglang.errors import PluginError, ServerDiedError
from pytest_sglang.exchange import ResultsExchange
from pytest_sglang.launch.fleet import FleetPlan
from pytest_sglang.launch.members import pid_alive
from pytest_sglang.launch.plan import LaunchPlan, base_url
from pytest_sglang.launch.release import kill_and_release
from pytest_sglang.server.fleet import FleetLiveness, MemberHandle, launch_fleet
from pytest_sglang.server.handle import LaunchedLiveness, ServerHandle, WatchedPidLiveness
from pytest_sglang.server.origins import start_server
from pytest_sglang.server.ready import RecordCallback, StatusCallback, health_probe
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.watch import LogTail, LogWatcher

WAIT_NOTE_SECONDS = 30.0


@dataclass
class SharedState:
    """One profile's entry in the run folder."""

    profile: str
    status: str  # "ready" or "failed"
    record: StartupRecord
    pid: int = 0
    token: str = ""
    shutdown_grace: float = 30.0
    users: list[int] = field(default_factory=list)  # pids of the workers whose tests hold the server
    members: list[SharedMember] = field(default_factory=list)  # a fleet's (pid and token above: its router's)

    def live_users(self) -> list[int]:
        return [pid for pid in self.users if pid_alive(pid)]

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "status": self.status, "record": self.record.to_json(), "pid": self.pid,
                "token": self.token, "shutdown_grace": self.shutdown_grace, "users": self.users,
                "members": [m.to_json() for m in self.members]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SharedState:
        return cls(data["profile"], data["status"], StartupRecord.from_json(data["record"]), int(data["pid"]),
                   str(data["token"]), float(data["shutdown_grace"]), [int(u) for u in data["users"]],
                   [SharedMember.from_json(m) for m in data.get("members", [])])


@dataclass(frozen=True)
class SharedMember:
    """One member of a shared fleet: what a joining worker watches, and what the controller stops."""

    name: str
    role: str
    record: StartupRecord
    token: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "record": self.record.to_json(), "token": self.token}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SharedMember:
        return cls(str(data["name"]), str(data["role"]), StartupRecord.from_json(data["record"]), str(data["token"]))


class SharedServers:
    """The run folder of one xdist run: the workers' way to get a server, the controller's way to stop them."""

    def __init__(self, folder: Path, *, controller_pid: int, concurrent_profiles: bool = False) -> None:
        self.folder = folder
        self.controller_pid = controller_pid
        self.concurrent_profiles = concurrent_profiles
        self.results = ResultsExchange(folder / "results")  # what each worker measured, for the others

    @classmethod
    def create(cls, base: Path, *, concurrent_profiles: bool = False) -> SharedServers:
        folder = base / f"xdist-{os.getpid()}-{time.time_ns()}"
        folder.mkdir(parents=True, mode=0o700)
        return cls(folder, controller_pid=os.getpid(), concurrent_profiles=concurrent_profiles)

    def open(self, plan: LaunchPlan | FleetPlan, *, on_status: StatusCallback,
             on_record: RecordCallback) -> ServerHandle:
        """The profile's server for this worker: attach to it if another worker launched it, else launch it."""
        name = plan.profile.name
        last_note = time.monotonic()
        with self._wanting(name):
            while True:
                with self._locked():
                    state = self._load(name)
                    if state is not None:
                        return self._join(state, plan, on_record)
                    blocking = self._blocking(name)
                    for other in blocking:
                        if not other.live_users() and not self._wanted(other.profile):
                            self._stop(other)
                    if not self._blocking(name):
                        return self._launch(plan, on_status, on_record)
                last_note = self._note_wait(name, blocking, last_note, on_status)
                time.sleep(0.5)

    @staticmethod
    def _note_wait(name: str, blocking: list[SharedState], last_note: float, on_status: StatusCallback) -> float:
        if time.monotonic() - last_note < WAIT_NOTE_SECONDS:
            return last_note
        on_status(f"[sglang {name}] waiting for the tests of profile(s) {', '.join(o.profile for o in blocking)} "
                  "on other workers to finish (one server at a time; --sglang-concurrent-profiles allows several)")
        return time.monotonic()

    def stop_all(self) -> list[str]:
        """Stop every server of the run (the controller, after the last worker): say what was stopped."""
        stopped = []
        with self._locked():
            for state in self._states():
                if state.status == "ready":
                    self._stop(state)
                    stopped.append(f"{state.profile}: pid {state.pid}")
        shutil.rmtree(self.folder, ignore_errors=True)
        return stopped

    def release(self, profile: str) -> None:
        """This worker's tests of ``profile`` are done; the server stays up for the others."""
        with self._locked():
            state = self._load(profile)
            if state is not None and os.getpid() in state.users:
                state.users.remove(os.getpid())
                self._save(state)

    def _launch(self, plan: LaunchPlan | FleetPlan, on_status: StatusCallback,
                on_record: RecordCallback) -> ServerHandle:
        records: list[StartupRecord] = []

        def remember(record: StartupRecord) -> None:
            records.append(record)
            on_record(record)

        try:
            if isinstance(plan, FleetPlan):
                on_status(f"[sglang {plan.profile.name}] launching a fleet for every xdist worker")
                fleet = launch_fleet(plan, on_status=on_status, on_record=remember, keep=True,
                                     guardian_pid=self.controller_pid)
            else:
                on_status(f"[sglang {plan.profile.name}] launching for every xdist worker: log {plan.log_path}")
                server = start_server(plan, on_status=on_status, on_record=remember, keep=True,
                                      guardian_pid=self.controller_pid)
        except PluginError as exc:
            if records:
                self._save(SharedState(plan.profile.name, "failed", records[-1]))
            raise exc from None
        if isinstance(plan, FleetPlan):
            return self._share_fleet(plan, fleet)
        process = server.liveness.process
        self._save(SharedState(plan.profile.name, "ready", server.record, process.pid, process.token,
                               plan.profile.shutdown_grace, [os.getpid()]))
        return server.handle(WorkerLiveness(self, server.liveness))

    def _share_fleet(self, plan: FleetPlan, fleet: ServerHandle) -> ServerHandle:
        """The fleet this worker launched, written down for the others (each member's pid, log and token) and
        for the controller, which stops every member."""
        members = [SharedMember(name, getattr(m, "role", ""), m.record, _token(m)) for name, m in fleet.members.items()]
        router = fleet.members["router"]
        self._save(SharedState(plan.profile.name, "ready", fleet.record, router.pid or 0, _token(router),
                               plan.profile.shutdown_grace, [os.getpid()], members))
        liveness = fleet.liveness
        assert isinstance(liveness, FleetLiveness)
        return ServerHandle(fleet.record, WorkerLiveness(self, liveness), api_key=fleet.api_key,
                            members=fleet.members)

    def _join(self, state: SharedState, plan: LaunchPlan | FleetPlan, on_record: RecordCallback) -> ServerHandle:
        if state.status != "ready":
            on_record(state.record)
            raise PluginError(state.record.error or f"[sglang {state.profile}] the server failed to start on "
                                                    "another xdist worker")
        state.users.append(os.getpid())
        self._save(state)
        record = state.record.joined()
        on_record(record)
        if isinstance(plan, FleetPlan):
            return self._join_fleet(state, plan, record)
        watcher = LogWatcher(plan.kind, ready_pattern=plan.ready_pattern, started_at=time.monotonic(),
                             tail=LogTail(record.log_path)) if record.log_path else None
        health = health_probe(plan, base_url(record.host, record.port))
        joined = WatchedPidLiveness(record.profile, state.pid, record.log_path, watcher, health,
                                    hint="every later test that uses this server fails with this same error")
        return ServerHandle(record, WorkerLiveness(self, joined), api_key=plan.profile.api_key)

    @contextlib.contextmanager
    def _wanting(self, profile: str) -> Iterator[None]:
        """Say, without the lock, that this worker waits for ``profile``: nobody stops a server still wanted."""
        mark = self.folder / f"want-{profile}-{os.getpid()}"
        mark.touch()
        try:
            yield
        finally:
            mark.unlink(missing_ok=True)

    def _wanted(self, profile: str) -> bool:
        return any(pid_alive(int(m.name.rsplit("-", 1)[1])) for m in self.folder.glob(f"want-{profile}-*"))

    def _blocking(self, profile: str) -> list[SharedState]:
        if self.concurrent_profiles:
            return []
        return [s for s in self._states() if s.profile != profile and s.status == "ready"]

    def _join_fleet(self, state: SharedState, plan: FleetPlan, record: StartupRecord) -> ServerHandle:
        """Another worker's fleet: each member watched by its pid and log, as a joined server is."""
        planned = {m.name: m for m in plan.members}
        members: dict[str, MemberHandle] = {}
        for shared in state.members:
            mplan = planned[shared.name].plan
            watcher = LogWatcher(mplan.kind, ready_pattern=mplan.ready_pattern, started_at=time.monotonic(),
                                 tail=LogTail(shared.record.log_path)) if shared.record.log_path else None
            liveness = WatchedPidLiveness(shared.record.profile, shared.record.pid or 0, shared.record.log_path,
                                          watcher, health_probe(mplan, base_url(shared.record.host,
                                                                                shared.record.port)),
                                          hint="every later test that uses this fleet fails with this same error")
            members[shared.name] = MemberHandle(shared.record, liveness, api_key=mplan.profile.api_key,
                                                name=shared.name, role=shared.role)
        fleet = FleetLiveness(state.profile, members)
        return ServerHandle(record, WorkerLiveness(self, fleet), api_key=plan.profile.api_key, members=members)

    def _stop(self, state: SharedState) -> None:
        for member in state.members or [SharedMember("", "", state.record, state.token)]:
            pid = member.record.pid if state.members else state.pid
            kill_and_release(pid or 0, member.token, grace=state.shutdown_grace, profile=member.record.profile,
                             host=member.record.host, port=member.record.port)
        self._path(state.profile).unlink(missing_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with FileLock(str(self.folder / "servers.lock")):
            yield

    def _path(self, profile: str) -> Path:
        return self.folder / f"{profile}.json"

    def _states(self) -> list[SharedState]:
        found = (self._load(p.stem) for p in sorted(self.folder.glob("*.json")))
        return [s for s in found if s is not None]

    def _load(self, profile: str) -> SharedState | None:
        try:
            return SharedState.from_json(json.loads(self._path(profile).read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _save(self, state: SharedState) -> None:
        path = self._path(state.profile)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(state.to_json(), fh)
        os.replace(tmp, path)


@dataclass(eq=False)
class WorkerLiveness:
    """Any liveness, as one worker of an xdist run sees it: closing releases it; the controller stops it."""

    servers: SharedServers
    inner: LaunchedLiveness | WatchedPidLiveness | FleetLiveness

    def death(self) -> ServerDiedError | None:
        return self.inner.death()

    def logged_crash(self) -> bool:
        return self.inner.logged_crash()

    def survived(self) -> None:
        self.inner.survived()

    def close(self) -> None:
        profile = self.inner.profile
        self.servers.release(profile)


def _token(member: ServerHandle) -> str:
    """The owner token of a member this worker launched (what the controller's stop finds its tree by)."""
    process = getattr(member.liveness, "process", None)
    return str(getattr(process, "token", ""))
