"""The pytest-xdist run's two sides, in the harness's terms: a worker's status lines relayed to the controller's
terminal as they are written, and the controller's run folder of shared servers (server/shared.py), what each
worker sent back when it went down, and the shared servers stopped after the last worker. Without xdist all of
this is inert. The plugin (plugin/distributed.py) carries these through pytest-xdist's hooks."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_sglang.harness.settings import Settings
    from pytest_sglang.server.shared import SharedServers
    from pytest_sglang.session import SessionLedger

WORKER_OUTPUT = "sglang_ledger"
STATUS_FILE = "status.log"  # in the run folder: the workers' startup lines, which the controller shows live
RELAY_SECONDS = 0.2


def tell_controller(servers: SharedServers, line: str) -> None:
    """A worker's status line (a startup phase, a launch), for the controller to show: xdist shows nothing a
    worker writes until its tests report, and a startup takes minutes."""
    with open(servers.folder / STATUS_FILE, "a", encoding="utf-8") as fh:
        fh.write(line.replace("\n", " ") + "\n")


class StatusRelay:
    """The controller's thread that shows the workers' status lines as they are written."""

    def __init__(self, path: Path, show: Callable[[str], None]) -> None:
        self.path, self.show = path, show
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sglang-status-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(RELAY_SECONDS):
            self._relay()

    def _relay(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                fh.seek(self._offset)
                text = fh.read()
        except OSError:
            return
        complete = text[:text.rfind("\n") + 1]
        self._offset += len(complete.encode("utf-8"))
        for line in complete.splitlines():
            self.show(line)

    def close(self) -> None:
        """Stop, after showing what is left."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._relay()


class ControllerRun:
    """The controller's side of an xdist run: the run folder, and what the workers sent back."""

    def __init__(self, settings: Settings, show: Callable[[str], None]) -> None:
        self.settings = settings
        self.show = show  # where the workers' status lines go: the controller's terminal
        self.servers: SharedServers | None = None
        self.relay: StatusRelay | None = None
        self.reports: list[dict[str, Any]] = []

    def folder_for_workers(self) -> dict[str, Any]:
        if self.servers is None:
            base = Path(tempfile.gettempdir()) / f"pytest-sglang-{os.getuid()}"
            base.mkdir(parents=True, exist_ok=True, mode=0o700)
            from pytest_sglang.server.shared import SharedServers

            self.servers = SharedServers.create(base, concurrent_profiles=self.settings.concurrent_profiles)
            self.relay = StatusRelay(self.servers.folder / STATUS_FILE, self.show)
        return {"folder": str(self.servers.folder), "controller_pid": self.servers.controller_pid,
                "concurrent_profiles": self.servers.concurrent_profiles}

    def gather(self, output: dict[str, Any], ledger: SessionLedger) -> None:
        sent = output.get(WORKER_OUTPUT)
        if not sent:
            return
        from pytest_sglang.server.record import StartupRecord

        for data in sent["startups"]:
            record = StartupRecord.from_json(data)
            known = ledger.startups.get(record.profile)
            # The worker that launched a shared server tells its startup; the others only joined it.
            if known is None or (record.ready and (not known.ready or known.origin == "joined")):
                ledger.add_startup(record)
        ledger.notes.extend(n for n in sent["notes"] if n not in ledger.notes)
        self.reports.append(sent["report"])

    @property
    def bench_count(self) -> int:
        return sum(len(p["benchmarks"]) for r in self.reports for p in r["profiles"].values())

    def merged(self, report: dict[str, Any]) -> dict[str, Any]:
        """``report`` (the controller's own) with every worker's profiles and benchmarks folded in."""
        for sent in self.reports:
            for name, prof in sent["profiles"].items():
                mine = report["profiles"].setdefault(name, {**prof, "benchmarks": []})
                for key, value in prof.items():
                    if key != "benchmarks" and mine.get(key) is None:
                        mine[key] = value
                mine["benchmarks"].extend(prof["benchmarks"])
            for key in ("machine", "machine_key", "commit", "baseline_file"):
                report[key] = report.get(key) or sent.get(key)
        return report

    def stop_servers(self) -> list[str]:
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.servers is None:
            return []
        stopped = self.servers.stop_all()
        self.servers = None
        return stopped
