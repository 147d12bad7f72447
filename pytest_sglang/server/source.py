"""Where a session's server comes from, decided once: the one place that knows which origins combine.

A server is attached to (--sglang-url), launched on an ssh host or across SLURM nodes, shared by the
pytest-xdist workers of one run, kept across runs (--sglang-reuse), or launched here for this session. The
options and a profile's keys can ask for two at once; :func:`server_source` says which one applies, or which
combination cannot work and what to drop. :func:`open_server` then opens the handle from that source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pytest_sglang.config import Profile
from pytest_sglang.errors import PluginError, PortInUseError
from pytest_sglang.launch.planner import Planner
from pytest_sglang.server.handle import ServerHandle
from pytest_sglang.server.ready import RecordCallback, StatusCallback

if TYPE_CHECKING:
    from pytest_sglang.server.shared import SharedServers

Source = Literal["url", "ssh", "slurm", "xdist", "reuse", "launch", "fleet"]


@dataclass(frozen=True)
class Asked:
    """What the session asked for, beside the profile: the options and whether it is an xdist worker."""

    url: str | None = None
    reuse: bool = False
    xdist: bool = False


def server_source(profile: Profile | None, asked: Asked) -> Source:
    """Which source serves ``profile`` (None: the --sglang-url server's own), or a PluginError naming the
    combination that cannot work and what to drop."""
    name = profile.name if profile is not None else "url"
    if asked.url:
        if asked.reuse:
            raise PluginError(f"[sglang {name}] --sglang-url with --sglang-reuse: a server attached to with "
                              "--sglang-url is someone else's, not this run's to keep; drop one of the two.")
        return "url"
    assert profile is not None
    if profile.topology is not None:
        if asked.reuse:
            raise PluginError(f"[sglang {name}] --sglang-reuse: profile {name!r} is a fleet, and fleets are not kept "
                              "across runs yet: drop --sglang-reuse for it (each run launches it anew).")
        return "xdist" if asked.xdist else "fleet"
    remote = ("runs through SLURM" if profile.slurm else f"runs on {profile.ssh} over ssh" if profile.ssh else None)
    if remote is not None:
        if asked.xdist:
            raise PluginError(f"[sglang {name}] profile {name!r} {remote}, and such servers are not shared by "
                              "pytest-xdist workers yet: each worker would launch its own copy. Run its tests "
                              "with -n 0.")
        if asked.reuse:
            raise PluginError(f"[sglang {name}] --sglang-reuse: profile {name!r} {remote}, and such servers are not "
                              "kept across runs yet: drop --sglang-reuse for it (each run launches it anew).")
        return "slurm" if profile.slurm else "ssh"
    if asked.xdist:
        if asked.reuse:
            raise PluginError(f"[sglang {name}] --sglang-reuse under pytest-xdist: the workers share one server "
                              "per profile, which the controller stops at the end, so none is kept for the next "
                              "run. Drop -n, or drop --sglang-reuse.")
        return "xdist"
    return "reuse" if asked.reuse else "launch"


@dataclass(frozen=True)
class Origins:
    """What the sources need from the session: its shared servers (under xdist), its rootdir (whose kept servers
    --sglang-reuse reads), how it plans a launch (asked only where one is launched), and where status lines,
    records and kept servers go."""

    shared: SharedServers | None
    rootdir: Path
    planner: Planner
    on_status: StatusCallback
    on_record: RecordCallback
    on_kept: Callable[[str], None]  # "profile: pid N on port P", for the summary's list of kept servers


def open_server(profile: Profile | None, asked: Asked, origins: Origins, *, name: str) -> ServerHandle:
    """The handle of ``profile``'s server (None: the --sglang-url server's, called ``name``), from the source
    :func:`server_source` picks."""
    from pytest_sglang.server.origins import attach_readiness, attach_server, launch_server
    from pytest_sglang.server.reuse import KeptServers

    source = server_source(profile, asked)
    callbacks: dict[str, Any] = {"on_status": origins.on_status, "on_record": origins.on_record}
    if asked.url:
        return attach_server(asked.url, profile=name, kind=profile.kind if profile else "sglang",
                             readiness=attach_readiness(profile), api_key=profile.api_key if profile else None,
                             **callbacks)
    assert profile is not None
    if source == "fleet":
        from pytest_sglang.server.fleet import launch_fleet

        return launch_fleet(origins.planner.plan_fleet(profile), **callbacks)
    if source == "xdist":
        assert origins.shared is not None
        planner = origins.planner
        return origins.shared.open(planner.plan_fleet(profile) if profile.topology else planner.plan(profile),
                                   **callbacks)
    plan = origins.planner.plan(profile)
    if source == "slurm":
        from pytest_sglang.server.slurm import launch_slurm_server

        return launch_slurm_server(plan, **callbacks)
    if source == "ssh":
        from pytest_sglang.server.remote import launch_remote_server

        origins.on_status(f"[sglang {name}] launching on {plan.profile.ssh} over ssh: log copied to {plan.log_path}")
        return launch_remote_server(plan, **callbacks)

    if source == "reuse":
        handle = KeptServers(origins.rootdir).open(plan, **callbacks)
        origins.on_kept(f"{name}: pid {handle.pid} on port {handle.port}")
        return handle
    origins.on_status(f"[sglang {name}] launching: log {plan.log_path}")
    try:
        return launch_server(plan, **callbacks)
    except PortInUseError as exc:
        raise KeptServers(origins.rootdir).busy_error(plan.port) or exc from None
