"""--sglang-reuse: keep a server across runs and attach to it while its profile is unchanged.

The state lives in a private folder under the temp dir, one per rootdir, not in pytest's cache: reuse works
with `-p no:cacheprovider` and on read-only checkouts. A kept server lives until the machine reboots, which
is as long as a temp dir. Each state file holds the plan's fingerprint (a digest: the args may hold an
--api-key), the pid and owner token to stop the tree with, and the startup record of the launch.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_sglang.errors import PortInUseError, ServerStartupError
from pytest_sglang.launch.logdir import state_dir
from pytest_sglang.launch.members import pid_alive
from pytest_sglang.launch.plan import LaunchPlan, base_url
from pytest_sglang.launch.release import kill_and_release
from pytest_sglang.server.handle import ServerHandle, WatchedPidLiveness
from pytest_sglang.server.origins import start_server
from pytest_sglang.server.ready import (
    Probe,
    RecordCallback,
    StatusCallback,
    Subject,
    health_probe,
    ignore,
    probe_startup,
    wait_for,
)
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.watch import LogTail, LogWatcher

REUSE_CHECK_SECONDS = 5.0


@dataclass(frozen=True)
class KeptServer:
    fingerprint: str
    pid: int
    token: str
    record: StartupRecord

    def describe(self) -> str:
        return f"{self.record.profile}: pid {self.pid} on port {self.record.port}"


class KeptServers:
    """The servers kept for one rootdir: attach to one, keep a new one, stop them all."""

    def __init__(self, rootdir: Path) -> None:
        base = state_dir()
        digest = hashlib.sha256(str(rootdir.resolve()).encode()).hexdigest()[:16]
        self.folder = base / "kept" / digest
        self.rootdir = rootdir

    def open(self, plan: LaunchPlan, *, on_status: StatusCallback, on_record: RecordCallback) -> ServerHandle:
        name = plan.profile.name
        kept = self._load(name)
        if kept is not None:
            handle = self._attach(kept, plan, on_record)
            if handle is not None:
                on_status(f"[sglang {name}] reusing the server on port {kept.record.port} (pid {kept.pid})")
                return handle
            why = ("its profile changed" if kept.fingerprint != plan.fingerprint
                   else "it no longer answers")
            on_status(f"[sglang {name}] not reusing the kept server: {why}; stopping pid {kept.pid} and "
                      "launching anew")
            self._stop(kept)
        on_status(f"[sglang {name}] launching (kept for reuse): log {plan.log_path}")
        server = start_server(plan, on_status=on_status, on_record=on_record, keep=True)
        process = server.liveness.process
        self._save(KeptServer(plan.fingerprint, process.pid, process.token, server.record))
        return server.handle()

    def kept(self) -> list[KeptServer]:
        if not self.folder.is_dir():
            return []
        found = (self._load(path.stem) for path in sorted(self.folder.glob("*.json")))
        return [k for k in found if k is not None]

    def busy_error(self, port: int) -> PortInUseError | None:
        """Why a launch found ``port`` busy, where the server --sglang-reuse kept for this rootdir holds it."""
        kept = next((k for k in self.kept() if k.record.port == port and pid_alive(k.pid)), None)
        if kept is None:
            return None
        return PortInUseError(
            f"Port {kept.record.host}:{port} is busy: it is the server that --sglang-reuse kept for profile "
            f"{kept.record.profile!r} (pid {kept.pid}). Stop it with `pytest --sglang-stop`, or run with "
            "--sglang-reuse to use it.")

    def stop_all(self) -> list[str]:
        """Stop every kept server of this rootdir (the teardown's group kill); say what was stopped."""
        stopped = []
        for kept in self.kept():
            alive = pid_alive(kept.pid)
            self._stop(kept)
            stopped.append(kept.describe() + ("" if alive else " (already gone)"))
        return stopped

    def _attach(self, kept: KeptServer, plan: LaunchPlan, on_record: RecordCallback) -> ServerHandle | None:
        if kept.fingerprint != plan.fingerprint or not pid_alive(kept.pid):
            return None
        record = kept.record.reused()
        paths = plan.readiness.probe_paths
        probe = Probe(base_url(record.host, record.port), paths, plan.headers) if paths else None
        wait = probe_startup(Subject(template=record, started_at=time.monotonic()), probe=probe,
                             timeout=REUSE_CHECK_SECONDS)
        try:
            record = wait_for(wait, on_status=ignore, on_record=ignore)
        except ServerStartupError:
            return None
        on_record(record)
        watcher = LogWatcher(plan.kind, ready_pattern=plan.ready_pattern, started_at=time.monotonic(),
                             tail=LogTail(record.log_path)) if record.log_path else None
        liveness = WatchedPidLiveness(
            record.profile, kept.pid, record.log_path, watcher, health_probe(plan, base_url(record.host, record.port)),
            hint="run again: --sglang-reuse launches a fresh server when the kept one is gone")
        return ServerHandle(record, liveness, api_key=plan.profile.api_key)

    def _path(self, profile: str) -> Path:
        return self.folder / f"{profile}.json"

    def _load(self, profile: str) -> KeptServer | None:
        try:
            data = json.loads(self._path(profile).read_text(encoding="utf-8"))
            return KeptServer(data["fingerprint"], int(data["pid"]), str(data["token"]),
                              StartupRecord.from_json(data["record"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _save(self, kept: KeptServer) -> None:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self._path(kept.record.profile)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"fingerprint": kept.fingerprint, "pid": kept.pid, "token": kept.token,
                       "record": kept.record.to_json()}, fh)
        os.replace(tmp, path)

    def _stop(self, kept: KeptServer) -> None:
        kill_and_release(kept.pid, kept.token, grace=10.0, profile=kept.record.profile, host=kept.record.host,
                         port=kept.record.port)
        self._path(kept.record.profile).unlink(missing_ok=True)

