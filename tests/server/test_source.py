"""Where a server comes from: every combination of --sglang-url, --sglang-reuse, pytest-xdist and a profile's
ssh or slurm key, decided in one place; and the record's origin telling each source apart."""

from __future__ import annotations

from typing import cast

import pytest

from pytest_sglang.config import Profile
from pytest_sglang.errors import PluginError
from pytest_sglang.harness.settings import Settings
from pytest_sglang.harness.workers import WORKER_OUTPUT, ControllerRun
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.server.source import Asked, server_source
from pytest_sglang.session import SessionLedger

PROFILES = """
[tool.pytest_sglang.profiles.here]
[tool.pytest_sglang.profiles.far]
ssh = "gpu-box"
[tool.pytest_sglang.profiles.nodes]
slurm = { nodes = 2 }
"""


@pytest.mark.parametrize(("profile", "asked", "source"), [
    ("here", Asked(), "launch"),
    ("here", Asked(reuse=True), "reuse"),
    ("here", Asked(xdist=True), "xdist"),
    ("here", Asked(url="http://127.0.0.1:1"), "url"),
    ("far", Asked(), "ssh"),
    ("far", Asked(url="http://127.0.0.1:1"), "url"),
    ("nodes", Asked(), "slurm"),
])
def test_each_source(profiles: dict[str, Profile], profile: str, asked: Asked, source: str) -> None:
    assert server_source(profiles[profile], asked) == source


@pytest.mark.parametrize(("profile", "asked", "says"), [
    ("here", Asked(url="http://127.0.0.1:1", reuse=True), "--sglang-url with --sglang-reuse: .* drop one of the two"),
    (None, Asked(url="http://127.0.0.1:1", reuse=True), "not this run's to keep"),
    ("here", Asked(xdist=True, reuse=True), "--sglang-reuse under pytest-xdist: .* Drop -n, or drop --sglang-reuse"),
    ("far", Asked(xdist=True), "'far' runs on gpu-box over ssh, .* each worker would launch its own copy. Run its "
                               "tests with -n 0"),
    ("far", Asked(reuse=True), "--sglang-reuse: profile 'far' runs on gpu-box over ssh, and such servers are not "
                               "kept across runs yet: drop --sglang-reuse"),
    ("nodes", Asked(xdist=True), "'nodes' runs through SLURM, .* Run its tests with -n 0"),
    ("nodes", Asked(reuse=True, xdist=True), "'nodes' runs through SLURM, .* Run its tests with -n 0"),
    ("nodes", Asked(reuse=True), "'nodes' runs through SLURM, and such servers are not kept across runs yet"),
])
def test_combinations_that_cannot_work_say_what_to_drop(profiles: dict[str, Profile], profile: str | None,
                                                        asked: Asked, says: str) -> None:
    with pytest.raises(PluginError, match=says):
        server_source(profiles[profile] if profile else None, asked)


def record(origin: str, **facts: object) -> StartupRecord:
    return StartupRecord(profile="p", kind="sglang", origin=origin, outcome="ready", host="gpu-box",  # type: ignore[arg-type]
                         port=30000, pid=7, startup_seconds=12.5, phases={"load_weights": 2.0, "ready": 12.5},
                         **facts)  # type: ignore[arg-type]


@pytest.mark.parametrize(("origin", "summary"), [
    ("launched", "p: ready in 12.5 s  [launch 2.0s | load_weights 10.5s]"),
    ("ssh", "p: ready over ssh in 12.5 s  [launch 2.0s | load_weights 10.5s]"),
    ("slurm", "p: ready across SLURM nodes in 12.5 s  [launch 2.0s | load_weights 10.5s]"),
    ("joined", "p: joined another xdist worker's server, pid 7 on port 30000 (it started in 12.5 s)"),
    ("reused", "p: reused the kept server, pid 7 on port 30000 (it started in 12.5 s)"),
])
def test_the_summary_tells_each_origin_apart(origin: str, summary: str) -> None:
    assert record(origin).summary() == summary
    assert StartupRecord.from_json(record(origin).to_json()).origin == origin


def test_the_controller_reports_the_launching_workers_startup_not_a_joiners() -> None:
    run = ControllerRun(cast(Settings, None), print)  # gathering reads no setting, shows nothing
    ledger = SessionLedger()
    launched = record("launched")
    for sent in (launched.joined(), launched, launched.joined()):
        run.gather({WORKER_OUTPUT: {"startups": [sent.to_json()], "report": {}, "notes": []}}, ledger)
    assert ledger.startups["p"].origin == "launched"
