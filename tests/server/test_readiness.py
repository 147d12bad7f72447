"""What "ready" means, owned by one value: the plan's readiness is what the loop waits on and what --sglang-show
says; an --sglang-url server's is built from its kind."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_sglang.config import Profile
from pytest_sglang.config.kinds import GENERIC, SGLANG, VLLM
from pytest_sglang.launch.plan import Readiness, plan_launch
from pytest_sglang.server.origins import attach_readiness, startup_wait
from pytest_sglang.server.readiness.log import ReadyLine
from pytest_sglang.server.readiness.probe import HttpReady
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.watch import LogWatcher

PROFILES = """
[tool.pytest_sglang.profiles.sgl]
model = "m"
[tool.pytest_sglang.profiles.own]
model = "m"
health_path = "/ping"
[tool.pytest_sglang.profiles.gen]
kind = "generic"
command = ["serve"]
[tool.pytest_sglang.profiles.vll]
kind = "vllm"
model = "m"
"""


@pytest.mark.parametrize(("name", "readiness", "said"), [
    ("sgl", Readiness(SGLANG.ready_pattern, ("/ready", "/v1/models", "/health")),
     f"a log line matches /{SGLANG.ready_pattern}/, then GET /ready answers 200"),
    ("own", Readiness(SGLANG.ready_pattern, ("/ping",)), f"a log line matches /{SGLANG.ready_pattern}/, then GET "
                                                         "/ping answers 200"),
    ("gen", Readiness(None, ("/health",)), "GET /health answers 200"),
])
def test_the_plan_says_what_ready_is_and_the_loop_waits_on_that(profiles: dict[str, Profile], tmp_path: Path,
                                                                name: str, readiness: Readiness, said: str) -> None:
    plan = plan_launch(profiles[name], sim=False, log_dir=tmp_path, check=False)
    assert plan.readiness == readiness
    assert plan.readiness.describe() == said
    template = StartupRecord(profile=name, kind=plan.kind.name, origin="launched", outcome="ready", host=plan.host,
                             port=plan.port)
    wait = startup_wait(plan, template=template, process=SimpleNamespace(started_at=0.0),  # type: ignore[arg-type]
                        watcher=LogWatcher(plan.kind, started_at=0.0), base_url=plan.base_url, command=[],
                        look_at="the log")
    line = next(check for check in wait.checks if isinstance(check, ReadyLine))
    assert line.awaited == (readiness.line is not None)
    probes = [check.probe for check in wait.checks if isinstance(check, HttpReady)]
    assert [probe.paths for probe in probes] == [readiness.probe_paths]


def test_an_attached_servers_readiness_comes_from_its_kind_or_its_profile(profiles: dict[str, Profile]) -> None:
    assert attach_readiness(None) == Readiness(None, (SGLANG.health_path,))
    assert attach_readiness(profiles["vll"]) == Readiness(None, (VLLM.health_path,))
    assert attach_readiness(profiles["own"]) == Readiness(None, ("/ping",))
    assert Readiness.attached(GENERIC, None).describe() == f"GET {GENERIC.health_path} answers 200"


def test_a_server_with_neither_a_line_nor_a_probe_is_ready_once_started() -> None:
    assert Readiness(None, ()).describe() == "its process has started"
    assert Readiness("up", ()).describe() == "a log line matches /up/"
