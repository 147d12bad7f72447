"""--sglang-show: each selected profile as it would run, secrets redacted, and nothing launched.

What is shown is what the launch would use: the profile after `extends` and `${VAR}`, planned by
launch/plan.py (the exact command line), with the profile's own environment (not the whole os.environ), its
simulator knobs, its readiness rules and its timeouts. Values of secret-named variables and flags
(*_TOKEN, *API_KEY, --api-key, ...) and every value registered as a secret print as ``***``.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pytest_sglang.config.profiles import Profile, load_profiles
from pytest_sglang.config.schema import shown_rows
from pytest_sglang.errors import (
    PluginError,
    ProfileError,
    redact,
    register_env_secrets,
)
from pytest_sglang.harness.settings import Settings
from pytest_sglang.launch.logdir import state_dir
from pytest_sglang.launch.plan import (
    NOT_NEEDED_BY_SIM,
    LaunchPlan,
    launch_problems,
    plan_launch,
    real_launch_problems,
    register_profile_secrets,
)

USAGE_ERROR = 4  # pytest.ExitCode.USAGE_ERROR
PREFIX = "pytest-sglang --sglang-show:"


def show_profiles(settings: Settings, write: Callable[[str], None]) -> int:
    """Write each selected profile (every defined one if none is selected); 0 if each can be planned, 1 if
    one cannot (its problem is shown), 4 for an unknown profile or a broken profiles file."""
    try:
        profiles = load_profiles(settings.rootdir, settings.config_path, keep_going=True)
        if profiles.broken and not settings.profiles:
            raise ProfileError(profiles.mistakes())  # showing every profile: each one's mistakes, in one pass
        chosen = (profiles.select(list(settings.profiles)) if settings.profiles
                  else list(profiles.profiles.values()))
    except ProfileError as exc:
        write(f"{PREFIX} {exc}")
        return USAGE_ERROR
    problem = settings.usage_problem()
    if problem:
        write(f"{PREFIX} {problem}")
        return USAGE_ERROR
    register_env_secrets(os.environ)
    if settings.url:
        return _show_attached(settings.url, chosen[0] if settings.profiles else None, write)
    if not chosen:
        write(f"{PREFIX} no profiles are defined: add [tool.pytest_sglang.profiles.NAME] to pyproject.toml in the "
              "rootdir, or pass --sglang-config=FILE")
        return 0
    which = "selected" if settings.profiles else "defined"
    write(f"{PREFIX} {len(chosen)} {which} profile(s) from {profiles.source}"
          f"{' under --sglang-sim' if settings.sim else ''}; nothing is launched")
    failed = False
    for profile in chosen:
        lines, ok = profile_lines(profile, settings)
        failed |= not ok
        for line in lines:
            write(redact(line))
    return 1 if failed else 0


def _show_attached(url: str, profile: Profile | None, write: Callable[[str], None]) -> int:
    """Under --sglang-url no profile is launched: what the run attaches to, and what it asks that server."""
    from pytest_sglang.server.origins import ATTACH_TIMEOUT_SECONDS, attach_readiness

    readiness = attach_readiness(profile)
    write(f"{PREFIX} --sglang-url={redact(url)}: nothing is launched or stopped; the tests use the server there")
    rows = [("kind", profile.kind if profile else "sglang (no --sglang-profile: the default kind)"),
            ("ready when", f"{readiness.describe()} within {ATTACH_TIMEOUT_SECONDS:g} s"),
            ("alive while", readiness.describe())]
    width = max(len(label) for label, _ in rows)
    write(f"profile {profile.name if profile else 'url'}")
    for label, text in rows:
        write(redact(f"  {label.ljust(width)}  {text}"))
    return 0


def profile_lines(profile: Profile, settings: Settings) -> tuple[list[str], bool]:
    """The lines that show one profile, and whether it can be launched as it stands."""
    register_profile_secrets(profile)
    problems = [message for key, message in profile.unset.items() if not (settings.sim and key in NOT_NEEDED_BY_SIM)]
    log_dir = Path(settings.log_dir_option).resolve() if settings.log_dir_option else None
    if profile.topology is not None:
        return _fleet_lines(profile, settings, problems, log_dir)
    plan: LaunchPlan | None = None
    try:
        plan = plan_launch(replace(profile, unset={}), sim=settings.sim,
                           log_dir=log_dir or state_dir() / "logs" / "NEW-RUN-FOLDER",
                           startup_timeout=settings.startup_timeout, check=False)
        problems += launch_problems(plan)
    except ProfileError as exc:
        problems.append(str(exc))
    later = real_launch_problems(profile, state_dir() / "logs" / "NEW-RUN-FOLDER") if settings.sim else []
    rows = [("kind", profile.kind + (" (the bundled simulator runs it: --sglang-sim)" if settings.sim else ""))]
    if plan is not None and profile.slurm is not None:
        try:
            rows.append(("srun", _srun_line(plan)))
        except PluginError as exc:
            problems.append(str(exc))
    elif plan is not None:
        rows.append(("command", shlex.join(plan.argv)))
        rows.append(("listens on", f"{plan.host}:{plan.port}" + (
            "" if profile.port else " (the port is an example: a free one is chosen at each launch)")))
    rows += shown_rows(profile, settings.sim)
    if plan is not None:
        rows.append(("ready when", plan.readiness.describe()))
        rows.append(("alive while", f"GET {plan.health_path} answers 200" if plan.health_path
                     else "its process runs"))
        rows.append(("timeouts", f"startup {plan.startup_timeout:g} s (the hard cap), stall {plan.stall_timeout:g} s "
                                 f"without log progress, shutdown grace {profile.shutdown_grace:g} s"))
        where = "" if log_dir else " (NEW-RUN-FOLDER: a new folder for each run)"
        rows.append(("log", f"{plan.log_path}{where}"))
    rows += [("problem", problem) for problem in problems]
    rows += [("warning", f"without --sglang-sim: {problem}") for problem in later]
    width = max(len(label) for label, _ in rows)
    return [f"profile {profile.name}"] + [f"  {label.ljust(width)}  {text}" for label, text in rows], not problems


def _fleet_lines(profile: Profile, settings: Settings, problems: list[str],
                 log_dir: Path | None) -> tuple[list[str], bool]:
    """A fleet: every member's command, in start order, and what makes the whole ready."""
    from pytest_sglang.launch.fleet import fleet_problems, plan_fleet

    folder = log_dir or state_dir() / "logs" / "NEW-RUN-FOLDER"
    fleet = plan_fleet(replace(profile, unset={}), sim=settings.sim, log_dir=folder,
                       startup_timeout=settings.startup_timeout, check=False)
    problems += fleet_problems(fleet)
    later = fleet_problems(plan_fleet(replace(profile, unset={}), sim=False, log_dir=folder,
                                      check=False)) if settings.sim else []
    what = "prefill/decode servers" if profile.topology == "pd" else "data-parallel workers"
    rows = [("kind", f"{profile.kind}, a fleet of {len(fleet.servers)} {what} behind a router"
             + (" (the bundled simulator plays every member: --sglang-sim)" if settings.sim else ""))]
    rows += [(member.name, shlex.join(member.plan.argv)) for member in fleet.members]
    rows.append(("listens on", f"{fleet.router.plan.host}:{fleet.router.plan.port} (the router; "
                 + ("its port is fixed by the profile" if profile.port else "every port is an example: free ones "
                    "are chosen at each launch") + ")"))
    rows += shown_rows(profile, settings.sim, fleet=True)
    first = fleet.servers[0].plan
    rows.append(("ready when", f"every server is ready ({first.readiness.describe()}), then the router's GET "
                               f"/readiness answers 200 counting {len(fleet.servers)} healthy"))
    rows.append(("alive while", "every member's process runs (each watched on its own, not through the router)"))
    rows.append(("timeouts", f"startup {first.startup_timeout:g} s for the whole fleet, stall {first.stall_timeout:g} "
                             f"s without log progress, shutdown grace {profile.shutdown_grace:g} s"))
    rows.append(("logs", f"{folder}/{profile.name}.MEMBER.log"
                 + ("" if log_dir else " (NEW-RUN-FOLDER: a new folder for each run)")))
    rows += [("problem", problem) for problem in problems]
    rows += [("warning", f"without --sglang-sim: {problem}") for problem in later]
    width = max(len(label) for label, _ in rows)
    return [f"profile {profile.name}"] + [f"  {label.ljust(width)}  {text}" for label, text in rows], not problems


def _srun_line(plan: LaunchPlan) -> str:
    """The srun step as it will run; each node fills {node_rank}, {node_port} and {head_host} in its own task."""
    from pytest_sglang.launch.slurm import plan_slurm

    splan = plan_slurm(plan, token="TOKEN".ljust(32, "0"))
    where = f"a step in job {splan.inside_job}" if splan.inside_job else "a job of its own (SLURM_JOB_ID is unset)"
    ports = ",".join(map(str, splan.ports))
    return (f"{shlex.join(splan.argv)}  [{where}; node N listens on port N of {ports}, logs "
            f"{splan.node_log(0).name} ... {splan.node_log(splan.spec.nodes - 1).name}]")
