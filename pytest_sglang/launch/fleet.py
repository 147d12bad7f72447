"""From a fleet profile to one launch plan per member: the servers (workers, or prefill and decode) and the router.

Pure planning, as plan.py is for one server: each member is planned from the profile with its role's table
merged over it, its own port and log (PROFILE.MEMBER.log); the router is given every member's URL (and each
prefill's bootstrap port). Every port is chosen free here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_sglang.config import Profile
from pytest_sglang.config.fleet import RoleSpec
from pytest_sglang.config.kinds import ROUTER
from pytest_sglang.errors import ProfileError
from pytest_sglang.launch.plan import (
    SIM_ENV,
    SIM_RUN_ENV,
    LaunchPlan,
    launch_problems,
    plan_launch,
)
from pytest_sglang.launch.ports import free_port
from pytest_sglang.sim.config import MEMBER_ENV as SIM_MEMBER_ENV

ROUTER_MODULE = "sglang_router.launch_router"
SIM_ROUTER_MODULE = "pytest_sglang.sim.router"
READINESS_PATH = "/readiness"
ROUTER_CHECK_SECONDS = 20.0


@dataclass(frozen=True)
class MemberPlan:
    """One member of a fleet: its name (worker0, prefill0, decode0, router), its role and its launch plan."""

    name: str
    role: str  # "worker", "prefill", "decode", "router"
    plan: LaunchPlan
    bootstrap_port: int | None = None  # a prefill's KV bootstrap server, which the router hands to decodes

    @property
    def base_url(self) -> str:
        return self.plan.base_url


@dataclass(frozen=True)
class FleetPlan:
    """Every member of a fleet, planned: the servers in start order, then the router in front of them."""

    profile: Profile
    servers: tuple[MemberPlan, ...]
    router: MemberPlan
    fingerprint: str

    @property
    def members(self) -> tuple[MemberPlan, ...]:
        return (*self.servers, self.router)

    @property
    def expected_workers(self) -> int:
        """What the router's /readiness must count healthy: every server behind it."""
        return len(self.servers)

    def register_secrets(self) -> None:
        for member in self.members:
            member.plan.register_secrets()


def plan_fleet(profile: Profile, *, sim: bool, log_dir: Path, startup_timeout: float | None = None,
               sim_run: str | None = None, check: bool = True) -> FleetPlan:
    """Plan every member of ``profile``'s fleet. ``check``: raise the first of :func:`fleet_problems` as a
    ProfileError (--sglang-show plans without it, to show each command beside every problem)."""
    assert profile.router is not None, "plan_fleet takes a fleet profile (replicas, router or prefill/decode)"

    def member(name: str, role: str, spec: RoleSpec | None, flags: tuple[str, ...] = ()) -> LaunchPlan:
        env = {**profile.env, **(spec.env if spec else {})}
        if sim:
            env[SIM_MEMBER_ENV] = name
        server = replace(profile, name=f"{profile.name}.{name}", port=None, replicas=None, router=None, prefill=None,
                         decode=None, args=(*profile.args, *(spec.args if spec else ()), *flags), env=env,
                         gpus=spec.gpus if spec and spec.gpus is not None else profile.gpus)
        return plan_launch(server, sim=sim, log_dir=log_dir, startup_timeout=startup_timeout, sim_run=sim_run,
                           check=False)

    servers: list[MemberPlan] = []
    if profile.topology == "pd":
        assert profile.prefill is not None and profile.decode is not None
        for i in range(profile.prefill.replicas):
            bootstrap = free_port(profile.host)
            flags = ("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bootstrap))
            servers.append(MemberPlan(f"prefill{i}", "prefill", member(f"prefill{i}", "prefill", profile.prefill,
                                                                        flags), bootstrap))
        for i in range(profile.decode.replicas):
            servers.append(MemberPlan(f"decode{i}", "decode", member(f"decode{i}", "decode", profile.decode,
                                                                      ("--disaggregation-mode", "decode"))))
    else:
        for i in range(profile.replicas or 1):
            servers.append(MemberPlan(f"worker{i}", "worker", member(f"worker{i}", "worker", None)))
    router = _router_plan(profile, servers, sim=sim, log_dir=log_dir, startup_timeout=startup_timeout,
                          sim_run=sim_run)
    shape = {"router": router.argv_shape, "servers": [m.plan.server_fingerprint for m in servers]}
    fleet = FleetPlan(profile, tuple(servers), MemberPlan("router", "router", router.plan),
                      fingerprint=hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest())
    problems = fleet_problems(fleet) if check else []
    if problems:
        raise ProfileError(problems[0])
    return fleet


@dataclass(frozen=True)
class _RouterPlan:
    plan: LaunchPlan
    argv_shape: list[str]  # the command without the ports the plugin chose: the same router whatever they were


def _router_plan(profile: Profile, servers: list[MemberPlan], *, sim: bool, log_dir: Path,
                 startup_timeout: float | None, sim_run: str | None) -> _RouterPlan:
    spec = profile.router
    assert spec is not None
    python = spec.python or profile.python or sys.executable
    if sim:
        program: tuple[str, ...] = (sys.executable, "-m", SIM_ROUTER_MODULE)
    elif spec.command:
        program = tuple(part.replace("{python}", python) for part in spec.command)
    else:
        program = tuple(part.replace("{python}", python) for part in ROUTER.command)
    if profile.topology == "pd":
        members: list[str] = ["--pd-disaggregation"]
        for server in servers:
            members += ["--prefill", server.base_url, str(server.bootstrap_port)] if server.role == "prefill" \
                else ["--decode", server.base_url]
    else:
        members = ["--worker-urls", *(server.base_url for server in servers)]
    host = profile.host
    port = profile.port or free_port(host)
    metrics_port = free_port(host)
    shape = [*program, *spec.args, *members]
    argv = [*program, *spec.args, "--host", host, "--port", str(port), "--prometheus-host", host,
            "--prometheus-port", str(metrics_port), *members]
    env = {**os.environ, **profile.env, **spec.env}
    if sim:
        env[SIM_ENV] = json.dumps(dict(profile.sim))
        env[SIM_MEMBER_ENV] = "router"
        if sim_run is not None:
            env[SIM_RUN_ENV] = sim_run
    plan = LaunchPlan(
        profile=replace(profile, name=f"{profile.name}.router", command=None, python=python),
        kind=ROUTER, argv=argv, env=env, host=host, port=port, log_path=log_dir / f"{profile.name}.router.log",
        startup_timeout=startup_timeout or profile.startup_timeout, stall_timeout=profile.stall_timeout,
        ready_pattern=None, health_path=ROUTER.health_path, ready_probe_paths=(READINESS_PATH,), sim=sim,
        fingerprint="", server_fingerprint="")
    return _RouterPlan(plan, [part for part in shape if not part.startswith("http://")])


def fleet_problems(fleet: FleetPlan) -> list[str]:
    """What would make the fleet's launch fail before any member could say anything: each server's missing
    interpreter or model path, and a router that is not installed."""
    problems = list(dict.fromkeys(p for server in fleet.servers for p in launch_problems(server.plan)))
    router = fleet.router.plan
    if router.sim:
        return problems
    where = f"{fleet.profile.source}: profile {fleet.profile.name!r}, key 'router'"
    program = router.argv[0]
    if shutil.which(program, path=router.env.get("PATH")) is None and not Path(program).is_file():
        problems.append(f"{where}: {program} {'does not exist' if os.sep in program else 'is not on PATH'}. Set "
                        "router.python to the interpreter that has sglang-router installed, or router.command to "
                        "the router program (e.g. ['smg', 'launch']).")
    elif router.argv[1:3] == ["-m", ROUTER_MODULE] and not _has_module(program, ROUTER_MODULE, router.env):
        problems.append(f"{where}: {program} has no sglang_router installed (`{program} -m {ROUTER_MODULE}` "
                        "cannot run). Install it there (`pip install sglang-router`), set router.python to an "
                        "interpreter that has it, or set router.command (e.g. ['smg', 'launch']).")
    return problems


def _has_module(python: str, module: str, env: dict[str, str]) -> bool:
    """Whether ``python`` finds ``module`` (its spec only: nothing is imported)."""
    top = module.split(".")[0]
    try:
        done = subprocess.run([python, "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({top!r}) "
                                             "is None)"], env=env, capture_output=True, timeout=ROUTER_CHECK_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        return True  # cannot tell: the launch itself will say
    return done.returncode == 0
