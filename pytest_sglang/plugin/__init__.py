"""pytest wiring only: options into a Harness (pytest_sglang.harness), fixtures into its calls, its typed errors
into fail, skip and junit properties. The session's work is the Harness's.

    fixtures.py     sglang_server, sglang_bench, sglang_outputs, sglang_baseline, sglang_results, sglang_ab
    settings.py     every option and its help text, once; the Settings read from them
    distributed.py  pytest-xdist: the run folder to the workers, their ledgers back to the controller
    nodes.py        a failure showing the plugin's message alone; the harness's errors as a test's outcome
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sglang.errors import ServerDiedError, UsageProblem
from pytest_sglang.harness import Harness
from pytest_sglang.plugin import distributed
from pytest_sglang.plugin.nodes import fail_with
from pytest_sglang.plugin.settings import add_options, settings_of

if TYPE_CHECKING:
    from pytest_sglang.server import ServerHandle, StartupRecord

pytest_plugins = ("pytest_sglang.plugin.fixtures",)

PLUGIN_NAME = "sglang-session"  # "sglang" is this module, registered by the entry point
DEFERRED_TIMEOUT = pytest.StashKey[Any]()  # pytest-timeout settings held back until the server is ready


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sglang: test uses an LLM inference server (set by pytest-sglang)")
    config.addinivalue_line("markers", "sglang_compare: compares profiles' results; runs after all others")
    config.addinivalue_line("markers", "sglang_ab(first, second, together=True): the sglang_ab fixture compares "
                                       "profile `second` with `first`, both servers alive (together=False: one at "
                                       "a time, bracketed); runs after the other server tests")
    config.pluginmanager.register(SGLangPlugin(config), PLUGIN_NAME)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    conflict = settings_of(config).conflict()  # --sglang-show and --sglang-stop answer before the session
    if conflict:
        raise pytest.UsageError(conflict)
    if config.getoption("sglang_show"):
        from pytest_sglang.harness.show import show_profiles

        return show_profiles(settings_of(config), print)
    if not config.getoption("sglang_stop"):
        return None
    from pytest_sglang.server import KeptServers

    stopped = KeptServers(config.rootpath).stop_all()
    for line in stopped or ["no kept servers for this rootdir"]:
        print(f"pytest-sglang --sglang-stop: {'stopped ' if stopped else ''}{line}")
    return 0


class SGLangPlugin:
    """The session's Harness in pytest's hooks: what it asks before the run, of each test, and at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.harness = Harness(settings_of(config), on_status=self.status, shared=distributed.worker_servers(config),
                               sim_run=distributed.worker_sim_run(config))
        self.settings = self.harness.settings
        self.ledger = self.harness.ledger
        self._failure_shown: set[str] = set()
        self.written: list[str] = []  # where the reports went ("JSON report: PATH"), for the summary's end
        self.unserved = 0  # collected tests that need a server while none was selected

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        try:
            self.harness.start()
        except UsageProblem as exc:
            raise pytest.UsageError(str(exc)) from None

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        params = self.harness.selected()
        if "sglang_server" in metafunc.fixturenames and params:
            metafunc.parametrize("sglang_server", params, indirect=True, scope="session", ids=params)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if {"sglang_server", "sglang_ab"} & set(getattr(item, "fixturenames", ())):
                item.add_marker("sglang")
        self.unserved = 0 if self.harness.selected() else sum(
            1 for i in items if "sglang_server" in getattr(i, "fixturenames", ()))
        if self.unserved and self.settings.require_profile:
            raise pytest.UsageError(f"{self.unserved} test(s) need a server, but no --sglang-profile (or --sglang-url) "
                                    "was given, and sglang_require_profile = true makes a run that would test "
                                    "nothing an error: pass --sglang-profile=NAME.")
        # A/B tests after the others, grouped by pair (a pair's servers launch once), comparisons last.
        ab = [i for i in items if i.get_closest_marker("sglang_ab") and not i.get_closest_marker("sglang_compare")]
        pairs = list(dict.fromkeys(_ab_pair(i) for i in ab))
        ab.sort(key=lambda i: pairs.index(_ab_pair(i)))
        last = [i for i in items if i.get_closest_marker("sglang_compare")]
        if ab or last:
            items[:] = [i for i in items if i not in ab and i not in last] + ab + last

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

    def record_of(self, item: pytest.Item) -> StartupRecord | None:
        param = _server_param(item)
        return self.ledger.startups.get(param) if param is not None else None

    # pytest-timeout: a server's startup is bounded by startup_timeout and stall_timeout alone. The test's own
    # --timeout starts once its server is ready (pytest-timeout would otherwise time setup, startup included).

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool | None:
        param = _server_param(item)
        pair = _ab_pair(item) if "sglang_ab" in getattr(item, "fixturenames", ()) else ()
        if pair and not set(pair) <= set(self.harness.pool.alive()):
            item.stash[DEFERRED_TIMEOUT] = settings  # sglang_ab's setup starts the pair's servers
            return True
        if param is None or param in self.ledger.startups:
            return None
        item.stash[DEFERRED_TIMEOUT] = settings
        return True  # no timer yet: pytest_runtest_setup starts it once the server is up

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        try:
            return (yield)
        finally:
            settings = item.stash.get(DEFERRED_TIMEOUT, None)
            if settings is not None:
                import pytest_timeout

                del item.stash[DEFERRED_TIMEOUT]
                pytest_timeout.pytest_timeout_set_timer(item=item, settings=settings)

    # Each test that uses the server: liveness first, its crash reported as such, junit properties.

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        server = getattr(item, "funcargs", {}).get("sglang_server")
        if server is None or not hasattr(server, "check_alive"):
            return (yield)
        item.user_properties.extend(_junit_startup(server.record))
        died = self.harness.death_of(server)
        if died is not None:
            pytest.fail(str(died), pytrace=False)
        try:
            return (yield)
        except ServerDiedError as exc:
            self.harness.note_death(server, exc)
            fail_with(exc)
        except Exception as exc:
            crash = self._crash_behind(server, exc)
            if crash is None:
                raise
        pytest.fail(crash, pytrace=False)

    def _crash_behind(self, server: ServerHandle, exc: Exception) -> str | None:
        """A request that broke mid-test (a reset socket, vLLM's 500 as its engine dies) is usually the crash
        itself: the crash's message, the symptom beside it. None: a failure of its own, passed through."""
        import requests

        broken_request = isinstance(exc, (requests.ConnectionError, requests.exceptions.ChunkedEncodingError,
                                          ConnectionError))
        if not (broken_request or server.has_logged_crash()):
            return None
        died = self.harness.death_of(server, wait=5.0)
        return None if died is None else f"{died}\n\n(The test itself saw: {type(exc).__name__}: {exc})"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
            None, pytest.TestReport, pytest.TestReport]:
        report = yield
        record = self.record_of(item)
        if report.when == "setup" and report.failed and record is not None and record.outcome == "failed":
            # The whole diagnosis once; every later test of this profile says in one line why.
            if record.profile in self._failure_shown:
                report.longrepr = (f"[sglang {record.profile}] the server for this profile failed to start (the "
                                   f"first test that used it shows the whole diagnosis): {record.reason}")
            self._failure_shown.add(record.profile)
            from pytest_sglang.report import startup_failure_properties

            item.user_properties.extend(startup_failure_properties(record.reason))  # junitxml reads them at teardown
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.ledger.set_outcome(report.nodeid, report.outcome)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for title, lines in self.harness.summary(self.unserved):
            if title is None:
                for line in lines:
                    terminalreporter.write_line(line, yellow=True)
                continue
            terminalreporter.section(title)
            for line in lines:
                terminalreporter.write_line(line)
        for line in self.written + _junit_line(self.config):
            terminalreporter.write_line(line)

    # pytest-xdist: the controller hands out the run folder, gathers the workers' ledgers, stops the servers.

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[distributed.WORKER_INPUT] = self.harness.workers.folder_for_workers()
        node.workerinput[distributed.WORKER_SIM_RUN] = self.harness.sim_run

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        self.harness.workers.gather(getattr(node, "workeroutput", {}), self.ledger)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.harness.close()
        if self.harness.shared is not None:
            distributed.send_to_controller(self.config, self.ledger, self.harness.report())
        finished = self.harness.finish(int(session.exitstatus), ran=not self.config.option.collectonly)
        self.written += finished.written
        if finished.history_error is not None and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a CI job must not pass having lost its figures


def _server_param(item: pytest.Item) -> str | None:
    """The profile (or "url") this test's sglang_server is parametrized with; None if it uses no server."""
    callspec = getattr(item, "callspec", None)
    param = callspec.params.get("sglang_server") if callspec is not None else None
    return param if isinstance(param, str) else None


def _ab_pair(item: pytest.Item) -> tuple[str, ...]:
    marker = item.get_closest_marker("sglang_ab")
    return tuple(str(a) for a in marker.args) if marker is not None else ()


def _junit_line(config: pytest.Config) -> list[str]:
    """Where junitxml (with the sglang_* properties of each test) goes, where --junitxml was given."""
    path = config.getoption("xmlpath", None)
    if not path or hasattr(config, "workerinput"):
        return []
    return [f"sglang junit properties: {Path(os.path.expandvars(path)).expanduser().resolve()}"]


def _junit_startup(record: StartupRecord) -> list[tuple[str, object]]:
    props: list[tuple[str, object]] = [("sglang_profile", record.profile), ("sglang_origin", record.origin)]
    if record.startup_seconds is not None:
        props.append(("sglang_startup_seconds", round(record.startup_seconds, 3)))
    props += [(f"sglang_phase_{name}", round(at, 3)) for name, at in record.phases.items()]
    return props


def plugin_of(config: pytest.Config) -> SGLangPlugin:
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    assert isinstance(plugin, SGLangPlugin)
    return plugin
