"""pytest wiring only: options, fixtures, hooks. The work is in the pytest-free core.

One plugin object, :class:`SGLangPlugin`, holds the session: the selected profiles, the live server, and the
session ledger that the summary and the report read.

    fixtures.py     sglang_server, sglang_bench, sglang_outputs, sglang_baseline, sglang_results, sglang_ab
    measure.py      what sglang_bench and sglang_baseline do: run, record and publish a benchmark, check a baseline
    settings.py     every option and its help text, once; the Settings read from them
    show.py         --sglang-show
    distributed.py  pytest-xdist: run folder to the workers, their ledgers back to the controller
    nodes.py        node id -> test id, a failure showing the plugin's message alone
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sglang.errors import HistoryError, PluginError, ServerDiedError
from pytest_sglang.plugin import distributed
from pytest_sglang.plugin.history import SessionHistory
from pytest_sglang.plugin.measure import Measurements
from pytest_sglang.plugin.nodes import fail_with
from pytest_sglang.plugin.settings import Settings, add_options, sim_without_profile
from pytest_sglang.session import SessionLedger

if TYPE_CHECKING:
    from pytest_sglang.config.profiles import Profile, ProfileSet
    from pytest_sglang.launch.fleet import FleetPlan
    from pytest_sglang.launch.plan import LaunchPlan
    from pytest_sglang.server import ServerHandle, StartupRecord

pytest_plugins = ("pytest_sglang.plugin.fixtures",)

PLUGIN_NAME = "sglang-session"  # "sglang" is this module, registered by the entry point
DEFERRED_TIMEOUT = pytest.StashKey[Any]()  # pytest-timeout settings held back until the server is ready
URL_PARAM = "url"  # the parametrization id when --sglang-url is given without a profile


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
    conflict = Settings.from_config(config).conflict()  # --sglang-show and --sglang-stop answer before the session
    if conflict:
        raise pytest.UsageError(conflict)
    if config.getoption("sglang_show"):
        from pytest_sglang.plugin.show import show_profiles

        return show_profiles(Settings.from_config(config), print)
    if not config.getoption("sglang_stop"):
        return None
    from pytest_sglang.server import KeptServers

    stopped = KeptServers(config.rootpath).stop_all()
    for line in stopped or ["no kept servers for this rootdir"]:
        print(f"pytest-sglang --sglang-stop: {'stopped ' if stopped else ''}{line}")
    return 0


class SGLangPlugin:
    """Session state: the selected profiles, the one live server, and what each server and benchmark did."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings = Settings.from_config(config)
        self.ledger = SessionLedger()
        self._profiles: ProfileSet | None = None
        self._log_dir: Path | None = None
        self._failure_shown: set[str] = set()
        self.shared = distributed.worker_servers(config)  # under pytest-xdist: the run's shared servers
        # every process reads the history for its checks; the one holding every result appends to it
        self.history = SessionHistory(self.settings.history_path, appends=not hasattr(config, "workerinput"))
        self.measure = Measurements(self.settings, self.ledger, self.shared, self.history)
        self.run = distributed.ControllerRun(self.settings, self.status)  # the xdist controller's side
        from pytest_sglang.server.pool import ServerPool

        self.pool = ServerPool(self.open_server)  # the servers A/B tests need alive at once
        self.written: list[str] = []  # where the reports went ("JSON report: PATH"), for the summary's end
        self.started = time.time()
        self.unserved = 0  # collected tests that need a server while none was selected

    @functools.cached_property
    def sim_run(self) -> str:
        """One drift for every simulator of this pytest run (drawn on first use; the xdist controller's)."""
        from pytest_sglang.sim.drift import SimRun

        return distributed.worker_sim_run(self.config) or SimRun.draw().to_env()

    # Profiles and parametrization.

    def profiles(self) -> ProfileSet:
        if self._profiles is None:
            from pytest_sglang.config.profiles import load_profiles

            self._profiles = load_profiles(self.settings.rootdir, self.settings.config_path,
                                           keep_going=True)
        return self._profiles

    def params(self) -> list[str]:
        if self.settings.profiles:
            return list(self.settings.profiles)
        return [URL_PARAM] if self.settings.url else []

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        problem = self.settings.usage_problem()
        if problem:
            raise pytest.UsageError(problem)
        try:
            if self.settings.profiles:
                self.profiles().select(list(self.settings.profiles), self.settings.origins.get("sglang_profile",
                                                                                               "--sglang-profile"))
            elif self.settings.sim and not self.settings.url:
                raise pytest.UsageError(sim_without_profile(sorted(self.profiles().profiles)))
        except PluginError as exc:
            raise pytest.UsageError(str(exc)) from None
        if self.settings.profiles:  # a run that selects none loads no profiles at all
            profiles = self.profiles()
            if self.settings.sim:
                self._warn_real_launch_problems(profiles)
            for name in profiles.unselected_broken(self.settings.profiles):
                self.status(f"[sglang] warning: profile {name!r} is broken and was not selected, so this run goes "
                            f"on without it: {profiles.broken[name]}")
        try:
            self.history.check()  # before any server launches: a store this run could not append to stops it
        except HistoryError as exc:
            raise pytest.UsageError(f"--sglang-history: {exc}") from None
        if self.params() and not hasattr(self.config, "workerinput"):
            try:  # a baseline file that could not be read, or written under --sglang-update-baseline, stops it too
                self.measure.checker.store.preflight(write=self.settings.update_baseline)
            except PluginError as exc:
                raise pytest.UsageError(str(exc)) from None

    def _warn_real_launch_problems(self, profiles: ProfileSet) -> None:
        """The simulator uses no model path or interpreter; the real server will: say now what it would miss."""
        from pytest_sglang.launch.logdir import state_dir
        from pytest_sglang.launch.plan import real_launch_problems

        for name in self.settings.profiles:
            if name in profiles.profiles:
                for problem in real_launch_problems(profiles.profiles[name], state_dir() / "logs"):
                    self.status(f"[sglang] warning: without --sglang-sim this launch would fail: {problem}")

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        params = self.params()
        if "sglang_server" in metafunc.fixturenames and params:
            metafunc.parametrize("sglang_server", params, indirect=True, scope="session", ids=params)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if {"sglang_server", "sglang_ab"} & set(getattr(item, "fixturenames", ())):
                item.add_marker("sglang")
        self.unserved = 0 if self.params() else sum(
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

    # Servers.

    def open_server(self, param: str) -> ServerHandle:
        from pytest_sglang.server.source import Asked, Origins, open_server

        profile = self.profiles().select([param])[0] if param != URL_PARAM else None
        asked = Asked(url=self.settings.url, reuse=self.settings.reuse, xdist=self.shared is not None)
        origins = Origins(shared=self.shared, rootdir=self.settings.rootdir, plan=self.plan,
                          plan_fleet=self.plan_fleet, on_status=self.status,
                          on_record=self.ledger.add_startup, on_kept=self.ledger.kept.append)
        return open_server(profile, asked, origins, name=profile.name if profile else param)

    def plan(self, profile: Profile) -> LaunchPlan:
        from pytest_sglang.launch.plan import plan_launch

        if self._log_dir is None:
            self._log_dir = self.settings.make_log_dir()
        plan = plan_launch(profile, sim=self.settings.sim, log_dir=self._log_dir,
                           startup_timeout=self.settings.startup_timeout, sim_run=self.sim_run)
        self.measure.server_fingerprints[profile.name] = plan.server_fingerprint  # A/A runs: sglang_ab's pair alike
        return plan

    def plan_fleet(self, profile: Profile) -> FleetPlan:
        from pytest_sglang.launch.fleet import plan_fleet

        if self._log_dir is None:
            self._log_dir = self.settings.make_log_dir()
        plan = plan_fleet(profile, sim=self.settings.sim, log_dir=self._log_dir,
                          startup_timeout=self.settings.startup_timeout, sim_run=self.sim_run)
        self.measure.server_fingerprints[profile.name] = plan.fingerprint
        return plan

    def status(self, text: str) -> None:
        """A live line during a long startup, shown even while output is captured (an xdist worker's, by the
        controller: distributed.StatusRelay)."""
        if self.shared is not None:
            distributed.tell_controller(self.shared, text)
            return
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
        if pair and not set(pair) <= set(self.pool.alive()):
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
        died = self.death_of(server)
        if died is not None:
            pytest.fail(str(died), pytrace=False)
        try:
            return (yield)
        except ServerDiedError as exc:
            self._note_death(server, exc)
            fail_with(exc)
        except Exception as exc:
            import requests

            # A request that broke mid-test (a reset socket, vLLM's 500 as its engine dies) is usually the crash
            # itself: report the crash, not the symptom. Other failures pass through untouched.
            broken_request = isinstance(exc, (requests.ConnectionError, requests.exceptions.ChunkedEncodingError,
                                              ConnectionError))
            if not (broken_request or server.has_logged_crash()):
                raise
            died = self.death_of(server, wait=5.0)
            if died is None:
                raise
            seen = f"{type(exc).__name__}: {exc}"
        pytest.fail(f"{died}\n\n(The test itself saw: {seen})", pytrace=False)

    def death_of(self, server: ServerHandle, wait: float = 0.0) -> ServerDiedError | None:
        """The server's death, if it has died; the summary and the report then say so."""
        try:
            server.check_alive(wait=wait)
        except ServerDiedError as exc:
            self._note_death(server, exc)
            return exc
        return None

    def _note_death(self, server: ServerHandle, death: ServerDiedError) -> None:
        record = self.ledger.startups.get(server.record.profile)
        if record is not None and record.died is None:
            why = death.cause or death.headline
            self.ledger.add_startup(record.dying(f"{death.member}: {why}" if death.member else why,
                                                 log_path=death.log_path))

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

    # Summary and reports.

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.unserved:
            terminalreporter.write_line(f"[sglang] {self.unserved} server test(s) skipped: no --sglang-profile or "
                                        "--sglang-url was given (ini sglang_require_profile = true makes that an "
                                        "error)", yellow=True)
        if self.ledger.startups:
            terminalreporter.section("sglang servers")
            for record in self.ledger.startups.values():
                terminalreporter.write_line(record.summary())
            for kept in self.ledger.kept:
                terminalreporter.write_line(f"kept: {kept}; stop it with `pytest --sglang-stop`")
        if self._has_benches() or self.ledger.startup_checks:
            from pytest_sglang.report import terminal_lines

            terminalreporter.section("sglang benchmarks")
            for line in terminal_lines(self.report()):
                terminalreporter.write_line(line)
            for note in self.ledger.notes:
                terminalreporter.write_line(f"note: {note}")
        for line in self.written + _junit_line(self.config):
            terminalreporter.write_line(line)

    def report(self) -> dict[str, object]:
        from pytest_sglang.report import build_report, summarize

        checker = self.measure.checker  # the report names the machine it ran on, checked or not
        report = build_report(self.ledger, machine=checker.machine(None), commit=checker.commit,
                              baseline_path=str(checker.store.path) if self.measure.checked else None)
        report = summarize(self.run.merged(report))  # sweeps and gates over every worker's benchmarks
        if self.history.appends:
            report["history"] = self.history.section or {"path": str(self.history.path),
                                                         "error": self.history.error}
        return report

    # pytest-xdist: the controller hands out the run folder, gathers the workers' ledgers, stops the servers.

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[distributed.WORKER_INPUT] = self.run.folder_for_workers()
        node.workerinput[distributed.WORKER_SIM_RUN] = self.sim_run

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        self.run.gather(getattr(node, "workeroutput", {}), self.ledger)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.pool.release()
        if self.shared is not None:
            distributed.send_to_controller(self.config, self.ledger, self.report())
        for line in self.run.stop_servers():
            self.status(f"[sglang] stopped the shared server of {line}")
        if self.history.appends and not self.config.option.collectonly:  # a run that ran nothing is no run
            self._append_history(session)
        path = self.settings.report_path
        if self.shared is not None or not (path or (self._has_benches() and os.environ.get("GITHUB_STEP_SUMMARY"))):
            return  # an xdist worker's figures are written by the controller, with every other worker's
        from pytest_sglang.report import append_step_summary, write_html, write_json

        report = self.report()
        if path:
            json_path = write_json(path, report)
            self.written += [f"sglang JSON report: {json_path.resolve()}",
                             f"sglang HTML report: {write_html(json_path.with_suffix('.html'), report).resolve()}"]
        if self._has_benches() and (summary := append_step_summary(report)) is not None:
            self.written.append(f"sglang step summary appended to {summary}")

    def _append_history(self, session: pytest.Session) -> None:
        """This run into the history (once, by the process that holds every worker's results)."""
        checker = self.measure.checker
        self.history.append(self.report(), commit=checker.commit, time=self.started,
                            exit_status=int(session.exitstatus), machine_of=lambda v: checker.machine(v).key,
                            ab=self.ledger.ab, versions=self.ledger.server_versions)
        if self.history.error is not None:
            self.status(f"[sglang] ERROR: --sglang-history: this run was not appended: {self.history.error}")
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a CI job must not pass having lost its figures

    def _has_benches(self) -> bool:
        return bool(self.ledger.benches or self.ledger.ab or self.run.bench_count)


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
