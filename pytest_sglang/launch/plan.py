"""From a profile to a launch plan: the command line, the environment, the log file and what "ready" means.

Pure planning: nothing is started here. The plan is what the process, the readiness loop and the reuse store
read; its fingerprint says whether a kept server still matches the profile.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from pytest_sglang.config import KINDS, SGLANG, Kind, Profile
from pytest_sglang.errors import (
    ProfileError,
    auth_headers,
    register_arg_secrets,
    register_env_secrets,
    register_secret,
)
from pytest_sglang.launch.ports import free_port, url_host
from pytest_sglang.sim.drift import INSTANCE_ENV, RUN_ENV

SIM_ENV = "PYTEST_SGLANG_SIM"
SIM_RUN_ENV = RUN_ENV
SIM_ENVS = (SIM_ENV, SIM_RUN_ENV, INSTANCE_ENV)  # what a simulated launch adds to the environment
PORT_PLACEHOLDER = "{port}"
# What a simulated run does not need: the simulator loads no model, runs in pytest's own Python and takes
# no launch command, so an unset ${VAR} in these keys does not stop a --sglang-sim run.
NOT_NEEDED_BY_SIM = frozenset({"model", "python", "command", "env"})
REMOTE_PYTHON = "python3"  # an ssh profile's interpreter on its host, unless `python` names one


@dataclass(frozen=True)
class Readiness:
    """What "ready" means for one server, decided here alone: the readiness loop waits on it, --sglang-show
    describes it, and an --sglang-url server's is built from its kind."""

    line: str | None  # a regex the log must match first; None: the probe alone decides
    probe_paths: tuple[str, ...]  # then asked in turn (a 404 or 401 moves on) until one answers 200; () none

    @classmethod
    def attached(cls, kind: Kind, health_path: str | None) -> Readiness:
        """An --sglang-url server's: its log is not read here, so its probe alone decides (the profile's
        health_path, else its kind's)."""
        return cls(None, (health_path or kind.health_path or "/",))

    def describe(self) -> str:
        probe = f"GET {self.probe_paths[0]} answers 200" if self.probe_paths else None
        if self.line is None:
            return probe or "its process has started"
        return f"a log line matches /{self.line}/" + (f", then {probe}" if probe else "")


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one server, resolved from a profile and the command line."""

    profile: Profile
    kind: Kind
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    log_path: Path
    startup_timeout: float
    stall_timeout: float
    ready_pattern: str | None
    health_path: str | None  # answers 200 while the server is healthy (liveness, and readiness without a line)
    ready_probe_paths: tuple[str, ...]  # asked in turn once the ready line is seen; see Kind.ready_probe_paths
    sim: bool
    fingerprint: str  # of everything that shapes the server; the port only where the profile fixes it
    # The same without the port even where fixed, nor the placement (gpus, cpus): two instances of one server share
    # it, wherever each runs.
    server_fingerprint: str = ""

    @property
    def base_url(self) -> str:
        return base_url(self.host, self.port)

    @property
    def readiness(self) -> Readiness:
        if self.ready_pattern is None:
            return Readiness(None, (self.health_path,) if self.health_path else ())
        return Readiness(self.ready_pattern, self.ready_probe_paths)

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.profile.api_key)

    def register_secrets(self) -> None:
        """Every secret this launch may print (its --api-key, secret-named variables), for redaction."""
        register_profile_secrets(self.profile)
        register_env_secrets(os.environ)
        register_arg_secrets(self.argv)


def plan_launch(profile: Profile, *, sim: bool, log_dir: Path, startup_timeout: float | None = None,
                sim_run: str | None = None, check: bool = True) -> LaunchPlan:
    """Turn a profile into a command line, an environment and the rules that say when it is ready.

    ``sim_run`` is the pytest run's identity for the simulator's drift (sim/drift.py, SimRun.to_env): every
    simulator of one run gets the same one. Left out of the fingerprint: a kept server is the same server.
    ``check``: raise the first of :func:`launch_problems` (a missing interpreter, binary or model path) as a
    ProfileError; --sglang-show plans without it to show the command beside every problem.
    """
    profile.require(None if not sim else set(profile.unset) - NOT_NEEDED_BY_SIM)
    kind = SGLANG if sim else KINDS[profile.kind]
    host = profile.host
    # An ssh profile runs on its host (launch/remote.py): its python is there, its port is checked there.
    port = profile.port or free_port("127.0.0.1" if profile.ssh else host)
    python = profile.python or (REMOTE_PYTHON if profile.ssh else sys.executable)
    if sim:
        sim_python = python if profile.ssh else sys.executable
        template: tuple[str, ...] = (sim_python, "-m", "pytest_sglang.sim", *SGLANG.command[3:], *profile.args)
    elif profile.command:
        template = profile.command
    else:
        template = (*kind.command, *profile.args)
        if profile.model is None:
            template = _drop_flag(template, kind.model_flag)
    values = {"python": python, "model": profile.model or "", "host": host}
    unported = [_substitute(part, values) for part in template]
    argv = [part.replace(PORT_PLACEHOLDER, str(port)) for part in unported]
    env = {**os.environ, **profile.launch_env}
    if sim:
        env[SIM_ENV] = json.dumps(dict(profile.sim))
        env[INSTANCE_ENV] = profile.name  # the simulator's instance_drift draws one factor per instance
        if sim_run is not None:
            env[SIM_RUN_ENV] = sim_run
    ready_pattern = profile.ready_pattern if profile.ready_pattern is not None else kind.ready_pattern
    health_path = profile.health_path if profile.health_path is not None else kind.health_path
    plan = LaunchPlan(
        profile=profile,
        kind=kind,
        argv=argv,
        env=env,
        host=host,
        port=port,
        log_path=log_dir / f"{profile.name}.log",
        startup_timeout=startup_timeout or profile.startup_timeout,
        stall_timeout=profile.stall_timeout,
        ready_pattern=ready_pattern,
        health_path=health_path,
        ready_probe_paths=_probe_paths(profile, kind, health_path),
        sim=sim,
        fingerprint=_fingerprint(profile, kind, unported if profile.port is None else argv, sim),
        server_fingerprint=_fingerprint(profile, kind, unported, sim, placement=False),
    )
    problems = launch_problems(plan) if check else []
    if problems:
        raise ProfileError(problems[0])
    return plan


def launch_problems(plan: LaunchPlan) -> list[str]:
    """What would make the launch fail before the server could say anything: an interpreter, a command binary
    or a local model path that is not there. An ssh profile's paths are its host's to check; a simulated run
    uses none of them."""
    profile = plan.profile
    if plan.sim or profile.ssh:
        return []
    where = f"{profile.source}: profile {profile.name!r}"
    path_env = plan.env.get("PATH")
    problems = []
    if profile.python and (not profile.command or any("{python}" in part for part in profile.command)):
        missing = _missing_binary(profile.python, path_env)
        if missing:
            problems.append(f"{where}: python {profile.python} {missing}. Point `python` at the interpreter that "
                            f"has {plan.kind.name} installed (e.g. /opt/venv/bin/python3), or drop the key to use "
                            "pytest's own.")
    if profile.command and plan.argv and plan.argv[0] != profile.python:
        missing = _missing_binary(plan.argv[0], path_env)
        if missing:
            problems.append(f"{where}: command {plan.argv[0]} {missing}. The first item of `command` is the "
                            "program to run: give its full path, or {python} for the profile's interpreter.")
    if profile.model is not None and not profile.command:
        problems += _model_path_problems(profile, where)
    return problems


def real_launch_problems(profile: Profile, log_dir: Path) -> list[str]:
    """Under --sglang-sim: what the real server's launch would run into (a missing python, binary or model
    path), which the simulator does not use. A user developing on the simulator learns of it there, not on
    the GPU box."""
    from dataclasses import replace

    try:
        plan = plan_launch(replace(profile, unset={}), sim=False, log_dir=log_dir, check=False)
    except ProfileError:
        return []  # a profile the real launch cannot even plan says so when it is run for real
    return launch_problems(plan)


def _missing_binary(program: str, path_env: str | None) -> str | None:
    """Why ``program`` cannot be run, or None if it can."""
    if os.sep not in program:
        return None if shutil.which(program, path=path_env) else "is not on PATH"
    path = Path(program).expanduser()
    if not path.exists():
        return "does not exist"
    if path.is_dir() or not os.access(path, os.X_OK):
        return "is not an executable file"
    return None


def _probe_paths(profile: Profile, kind: Kind, health_path: str | None) -> tuple[str, ...]:
    if profile.health_path:  # a profile that names its own health path asked for that one to decide readiness
        return (profile.health_path,)
    if kind.skip_warmup_flag and kind.skip_warmup_flag in profile.args:
        return (health_path,) if health_path else ()
    return tuple(dict.fromkeys(p for p in (*kind.ready_probe_paths, health_path) if p))


def _fingerprint(profile: Profile, kind: Kind, argv: list[str], sim: bool, *, placement: bool = True) -> str:
    from pytest_sglang import __version__

    shape: dict[str, object] = {
        "kind": kind.name, "argv": argv, "env": profile.launch_env if placement else dict(profile.env),
        "sim": dict(profile.sim) if sim else None,
        "ready_pattern": profile.ready_pattern, "health_path": profile.health_path, "plugin": __version__,
    }
    if placement and profile.cpus is not None:
        shape["cpus"] = list(profile.cpus)
    # A digest, not the values: the fingerprint is stored on disk and the args may hold an --api-key.
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def base_url(host: str, port: int) -> str:
    return f"http://{url_host(host)}:{port}"


def register_profile_secrets(profile: Profile) -> None:
    """A profile's secrets (its --api-key, secret-named variables and arguments), for redaction, before any
    line that shows it is written."""
    register_secret(profile.api_key)
    register_env_secrets(profile.env)
    register_arg_secrets([*profile.args, *(profile.command or ())])


def _substitute(part: str, values: dict[str, str]) -> str:
    """Fill {python} {model} {host}; any other brace (a JSON flag value) is left as written."""
    for name, value in values.items():
        part = part.replace("{" + name + "}", value)
    return part


def _drop_flag(template: tuple[str, ...], flag: str | None) -> tuple[str, ...]:
    out, skip = [], False
    for part in template:
        if skip:
            skip = False
            continue
        if part == flag:
            skip = True
            continue
        out.append(part)
    return tuple(out)


def _model_path_problems(profile: Profile, where: str) -> list[str]:
    model = profile.model or ""
    looks_local = model.startswith(("/", "./", "../", "~"))
    if looks_local and not Path(model).expanduser().exists():
        return [f"{where}, key 'model': model path {model} does not exist. Check the path (and any ${{VAR}} in "
                "it); a hub name such as org/model is passed through as is."]
    return []
