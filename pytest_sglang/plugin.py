"""pytest hooks only: options, fixtures, the per-test liveness check, the terminal summary.

The work happens in the pytest-independent core (profiles -> server -> launch/watch); this file wires it in.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import requests

from pytest_sglang.errors import PluginError, ServerDiedError, ServerStartupError
from pytest_sglang.profiles import Profile, ProfileSet, load_profiles

if TYPE_CHECKING:
    from pytest_sglang.server import SGLangServer

URL_PARAM = "url"  # the parametrization id when --sglang-url is given without a profile


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sglang", "LLM inference servers (pytest-sglang)")
    group.addoption(
        "--sglang-profile", action="append", default=[], metavar="NAME",
        help="Server profile to run the server tests against; repeat or comma-separate for several "
             "(one server alive at a time). Profiles: [tool.pytest_sglang.profiles.NAME] in pyproject.toml.",
    )
    group.addoption(
        "--sglang-sim", action="store_true", default=False,
        help="Launch the bundled SGLang simulator instead of the real server, with the same profile, flags "
             "and the profile's `sim` knobs: the whole flow without a GPU.",
    )
    group.addoption(
        "--sglang-url", default=None, metavar="URL",
        help="Test a server that is already running at URL: its health is checked, nothing is launched or "
             "killed. With --sglang-profile the profile names it (and gives its --api-key).",
    )
    group.addoption(
        "--sglang-startup-timeout", type=float, default=None, metavar="S",
        help="Seconds to wait for readiness; overrides every profile's startup_timeout (default 1800).",
    )
    group.addoption(
        "--sglang-log-dir", default=None, metavar="DIR",
        help="Where server logs are written, one PROFILE.log each; kept after the run and shown on failure "
             "(default: a new folder under the system temp dir).",
    )
    group.addoption(
        "--sglang-config", default=None, metavar="PATH",
        help="TOML file of profiles as [profiles.NAME] tables, instead of pyproject.toml's "
             "[tool.pytest_sglang.profiles.NAME].",
    )
    group.addoption(
        "--sglang-reuse", action="store_true", default=False,
        help="Keep the server running after the session and attach to it next run if its profile is "
             "unchanged (saves the startup while iterating on tests).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sglang: test uses an LLM inference server (set by pytest-sglang)")
    config.pluginmanager.register(SGLangSession(config), "sglang-session")


@dataclass
class ServerRecord:
    """What the terminal summary and the report need to know about one profile's server."""

    profile: str
    startup_seconds: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    log_path: Path | None = None
    error: str | None = None
    reused: bool = False


class SGLangSession:
    """Session state: the selected profiles, the one live server, and what each server did."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        raw = [n.strip() for opt in config.getoption("sglang_profile") for n in opt.split(",") if n.strip()]
        self.profile_names: list[str] = list(dict.fromkeys(raw))
        self.url: str | None = config.getoption("sglang_url")
        self.sim: bool = config.getoption("sglang_sim")
        self.reuse: bool = config.getoption("sglang_reuse")
        self.startup_timeout: float | None = config.getoption("sglang_startup_timeout")
        self.records: dict[str, ServerRecord] = {}
        self._profiles: ProfileSet | None = None
        self._log_dir: Path | None = None

    # -- profiles and parametrization ---------------------------------------------------------------------

    def profiles(self) -> ProfileSet:
        if self._profiles is None:
            config_opt = self.config.getoption("sglang_config")
            config_path = Path(config_opt).resolve() if config_opt else None
            self._profiles = load_profiles(self.config.rootpath, config_path)
        return self._profiles

    def params(self) -> list[str]:
        if self.profile_names:
            return self.profile_names
        return [URL_PARAM] if self.url else []

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.profile_names:
            try:
                self.profiles().select(self.profile_names)
            except PluginError as exc:
                raise pytest.UsageError(str(exc)) from None

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "sglang_server" not in metafunc.fixturenames:
            return
        params = self.params()
        if params:
            metafunc.parametrize("sglang_server", params, indirect=True, scope="session", ids=params)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if "sglang_server" in getattr(item, "fixturenames", ()):
                item.add_marker("sglang")

    # -- servers --------------------------------------------------------------------------------------------

    def log_dir(self) -> Path:
        if self._log_dir is None:
            opt = self.config.getoption("sglang_log_dir")
            if opt:
                self._log_dir = Path(opt).resolve()
            else:
                stamp = time.strftime("%Y%m%d-%H%M%S")
                self._log_dir = Path(tempfile.gettempdir()) / "pytest-sglang" / f"{stamp}-{os.getpid()}"
            self._log_dir.mkdir(parents=True, exist_ok=True)
        return self._log_dir

    def open_server(self, param: str) -> SGLangServer:
        record = self.records.setdefault(param, ServerRecord(param))
        try:
            server = self._open(param)
        except PluginError as exc:
            record.error = str(exc)
            record.log_path = getattr(exc, "log_path", None)
            raise
        record.startup_seconds = server.startup_seconds
        record.phases = dict(server.phases)
        record.log_path = server.log_path
        record.reused = server.reused
        return server

    def _open(self, param: str) -> SGLangServer:
        # Imported here so that loading the plugin (every pytest run) stays cheap.
        from pytest_sglang.server import attach_server, plan_launch, start_server

        profile = self.profiles().select([param])[0] if param != URL_PARAM else None
        if self.url:
            return attach_server(
                self.url, profile=param, api_key=profile.api_key if profile else None,
                health_path=(profile.health_path if profile and profile.health_path else "/health"),
            )
        assert profile is not None
        plan = plan_launch(profile, sim=self.sim, log_dir=self.log_dir(), startup_timeout=self.startup_timeout)
        if self.reuse:
            from pytest_sglang.reuse import ReuseStore

            return ReuseStore(self.config).open(plan, sim=self.sim, on_status=self.status)
        self.status(f"[sglang {profile.name}] launching: log {plan.log_path}")
        return start_server(plan, on_status=self.status)

    def close_server(self, server: SGLangServer, profile: Profile | None) -> None:
        if self.reuse and server.config is not None:
            return  # kept for the next run; ReuseStore recorded it
        server.stop(grace=profile.shutdown_grace if profile else 30.0)

    def status(self, text: str) -> None:
        """A live line during a long startup, shown even while output is captured."""
        capman = self.config.pluginmanager.getplugin("capturemanager")
        reporter = self.config.pluginmanager.getplugin("terminalreporter")
        if reporter is None or capman is None:
            print(text, file=sys.stderr, flush=True)
            return
        with capman.global_and_fixture_disabled():
            reporter.ensure_newline()
            reporter.write_line(text)

    # -- liveness during the session ------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        server = getattr(item, "funcargs", {}).get("sglang_server")
        if server is None or not hasattr(server, "check_alive"):
            return (yield)
        try:
            server.check_alive()
        except ServerDiedError as exc:
            pytest.fail(str(exc), pytrace=False)
        try:
            return (yield)
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError, ConnectionError) as exc:
            try:
                server.check_alive(wait=5.0)
            except ServerDiedError as died:
                pytest.fail(f"{died}\n\n(The test itself saw: {type(exc).__name__}: {exc})", pytrace=False)
            raise

    # -- summary --------------------------------------------------------------------------------------------

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.records:
            return
        terminalreporter.section("sglang servers")
        for record in self.records.values():
            terminalreporter.write_line(_summary_line(record))


def _summary_line(record: ServerRecord) -> str:
    if record.error is not None:
        first = record.error.splitlines()[0]
        return f"{record.profile}: FAILED TO START: {first}" + (f" (log: {record.log_path})" if record.log_path else "")
    if record.reused:
        return f"{record.profile}: reused a running server (started in {record.startup_seconds:.1f} s)"
    if not record.phases:
        return f"{record.profile}: attached to a running server"
    order = sorted(record.phases.items(), key=lambda kv: kv[1])
    steps = []
    previous_name, previous_at = "launch", 0.0
    for name, at in order:
        steps.append(f"{previous_name} {at - previous_at:.1f}s")
        previous_name, previous_at = name, at
    return f"{record.profile}: ready in {record.startup_seconds:.1f} s  [" + " | ".join(steps) + "]"


def _session(config: pytest.Config) -> SGLangSession:
    plugin = config.pluginmanager.get_plugin("sglang-session")
    assert isinstance(plugin, SGLangSession)
    return plugin


@pytest.fixture(scope="session")
def sglang_server(request: pytest.FixtureRequest) -> Generator[SGLangServer, None, None]:
    """A ready server for the current profile (session scope, one per --sglang-profile, one alive at a time).

    Attributes: base_url, host, port, profile, startup_seconds, phases, log_path, url(path), check_alive().
    """
    session = _session(request.config)
    param = getattr(request, "param", None)
    if param is None:
        known = ", ".join(sorted(session.profiles().profiles)) or "none defined"
        pytest.skip(f"no server selected: pass --sglang-profile=NAME (known: {known}) or --sglang-url=URL")
    try:
        server = session.open_server(param)
    except (ServerStartupError, PluginError) as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        session.close_server(server, server.config)
