"""--sglang-reuse: keep a server across runs and attach to it while its profile is unchanged.

The record lives in pytest's cache (.pytest_cache). A record whose profile changed, whose process died, or
whose server stopped answering is not trusted: its leftover tree is killed and a fresh server is launched.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import psutil
import pytest

from pytest_sglang.errors import PluginError
from pytest_sglang.launch import kill_tree
from pytest_sglang.server import LaunchPlan, SGLangServer, StatusCallback, health_ok, start_server

CACHE_PREFIX = "sglang/reuse/"


class ReuseStore:
    def __init__(self, config: pytest.Config) -> None:
        if config.cache is None:
            raise PluginError("--sglang-reuse needs pytest's cache provider: do not pass -p no:cacheprovider.")
        self.cache = config.cache

    def open(self, plan: LaunchPlan, *, sim: bool, on_status: StatusCallback) -> SGLangServer:
        key = CACHE_PREFIX + plan.profile.name
        want = json.dumps({**plan.profile.fingerprint(), "sim": sim}, sort_keys=True)
        record: dict[str, Any] | None = self.cache.get(key, None)
        if record is not None:
            server = self._attach(record, want, plan)
            if server is not None:
                on_status(f"[sglang {plan.profile.name}] reusing the server on port {server.port} "
                          f"(pid {record['pid']})")
                return server
            self._discard(record)
            self.cache.set(key, None)
        on_status(f"[sglang {plan.profile.name}] launching (kept for reuse): log {plan.log_path}")
        server = start_server(plan, on_status=on_status, reap=False)
        assert server._process is not None
        self.cache.set(key, {
            "fingerprint": want, "pid": server.pid, "token": server._process.token, "host": server.host,
            "port": server.port, "log_path": str(server.log_path), "startup_seconds": server.startup_seconds,
            "phases": server.phases,
        })
        return server

    def _attach(self, record: dict[str, Any], want: str, plan: LaunchPlan) -> SGLangServer | None:
        if record.get("fingerprint") != want or not psutil.pid_exists(record.get("pid", -1)):
            return None
        server = SGLangServer(
            profile=plan.profile.name, kind=plan.kind.name, host=record["host"], port=record["port"],
            startup_seconds=record["startup_seconds"], phases=dict(record["phases"]), log_path=Path(record["log_path"]),
            model=plan.profile.model, api_key=plan.profile.api_key, config=plan.profile,
            health_path=plan.health_path, reused=True, reused_pid=record["pid"],
        )
        if plan.health_path and not health_ok(server.url(plan.health_path), server.headers, timeout=5.0):
            return None
        return server

    @staticmethod
    def _discard(record: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):
            kill_tree(int(record["pid"]), str(record["token"]), grace=10.0)
