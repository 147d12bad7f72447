"""pytest-xdist: what crosses between the controller and its workers through xdist's hooks' data. The two
sides' work is the harness's (harness/workers.py): the controller's run folder goes to every worker in its
workerinput, each worker's ledger and report come back in its workeroutput."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sglang.harness.workers import WORKER_OUTPUT

if TYPE_CHECKING:
    from pytest_sglang.server.shared import SharedServers
    from pytest_sglang.session import SessionLedger

WORKER_INPUT = "sglang_shared"
WORKER_SIM_RUN = "sglang_sim_run"  # the controller's SimRun (sim/drift.py): one drift for every worker's servers


def worker_servers(config: pytest.Config) -> SharedServers | None:
    """On an xdist worker, the run's shared servers; None elsewhere."""
    given = getattr(config, "workerinput", {}).get(WORKER_INPUT)
    if not given:
        return None
    from pytest_sglang.server.shared import SharedServers

    return SharedServers(Path(given["folder"]), controller_pid=int(given["controller_pid"]),
                         concurrent_profiles=bool(given["concurrent_profiles"]))


def worker_sim_run(config: pytest.Config) -> str | None:
    """On an xdist worker, the run's simulator identity the controller drew; None elsewhere."""
    given = getattr(config, "workerinput", {}).get(WORKER_SIM_RUN)
    return str(given) if given else None


def send_to_controller(config: pytest.Config, ledger: SessionLedger, report: dict[str, Any]) -> None:
    output = getattr(config, "workeroutput", None)
    if output is not None:
        output[WORKER_OUTPUT] = {"startups": [r.to_json() for r in ledger.startups.values()], "report": report,
                                 "notes": list(ledger.notes)}
