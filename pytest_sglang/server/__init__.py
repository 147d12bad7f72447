"""Servers: the startup record, the one readiness loop, the handle with a liveness strategy per origin.

    source.py   server_source, open_server: where a session's server comes from, and which origins combine
    record.py   StartupRecord: what one startup was (made once, where readiness is decided)
    ready.py    the only readiness loop, for every origin: it polls the checks the origin composed
    readiness/  the checks (log line, HTTP probe, process tree, peers and nodes, members) and each origin's list
    handle.py   ServerHandle = record + Liveness (launched, attached, watched by pid: joined or kept)
    origins.py  launch_server, start_server, attach_server
    reuse.py    KeptServers: --sglang-reuse and --sglang-stop
    shared.py   SharedServers: one launch for every pytest-xdist worker of a run
    remote.py   a server on an ssh host;  slurm.py  a server across SLURM nodes
    pool.py     ServerPool: the servers an A/B test needs alive at once
    url.py      what --sglang-url may name

The names load on first use: the plugin is imported by every pytest run where it is installed, and these
modules (with the watcher, the launcher, requests and psutil) only a run that uses a server needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_sglang.server.handle import ServerHandle
    from pytest_sglang.server.origins import attach_server, launch_server
    from pytest_sglang.server.record import StartupRecord
    from pytest_sglang.server.reuse import KeptServers

_HOMES = {"ServerHandle": "handle", "attach_server": "origins", "launch_server": "origins",
          "StartupRecord": "record", "KeptServers": "reuse"}

__all__ = ["KeptServers", "ServerHandle", "StartupRecord", "attach_server", "launch_server"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
