"""Servers: the startup record, the one readiness loop, the handle with a liveness strategy per origin.

    record.py   StartupRecord: what one startup was (made once, where readiness is decided)
    ready.py    the only readiness loop, for every origin
    handle.py   ServerHandle = record + Liveness (launched, attached, kept)
    origins.py  launch_server, attach_server
    reuse.py    KeptServers: --sglang-reuse and --sglang-stop
"""

from pytest_sglang.server.handle import ServerHandle
from pytest_sglang.server.origins import attach_server, launch_server
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.server.reuse import KeptServers

__all__ = ["KeptServers", "ServerHandle", "StartupRecord", "attach_server", "launch_server"]
