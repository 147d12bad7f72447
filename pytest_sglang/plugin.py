"""pytest hooks only: options, fixtures, the per-test liveness check, the terminal summary.

The work happens in the pytest-independent core (profiles -> server -> launch/watch); this file wires it in.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest
import requests

from pytest_sglang.errors import PluginError, ServerDiedError, ServerStartupError
from pytest_sglang.profiles import Profile, ProfileSet, load_profiles

if TYPE_CHECKING:
    from pytest_sglang.baseline import BaselineChecker, Comparison
    from pytest_sglang.bench import BenchResult
    from pytest_sglang.report import SessionResults
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
    group.addoption(
        "--sglang-baseline", default=None, metavar="PATH",
        help="Baseline file that sglang_baseline.check() compares with (default: .sglang-baselines.json in "
             "the rootdir; commit it). Keyed by profile, test id and machine (GPUs, driver, server version).",
    )
    group.addoption(
        "--sglang-update-baseline", action="store_true", default=False,
        help="Record this run's checked figures in the baseline file instead of comparing (safe under "
             "pytest-xdist: a file lock and an atomic rename).",
    )
    group.addoption(
        "--sglang-baseline-strict", action="store_true", default=False,
        help="Fail a check that has no baseline for this profile, test and machine (default: pass with a "
             "note).",
    )
    group.addoption(
        "--sglang-report", default=None, metavar="PATH",
        help="Write a JSON report of every profile's startup and benchmark figures to PATH (schema: "
             "docs/report-schema.md), and an HTML page with a tok/s chart next to it (PATH with .html).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sglang: test uses an LLM inference server (set by pytest-sglang)")
    config.pluginmanager.register(SGLangSession(config), "sglang-session")
    config.addinivalue_line("markers", "sglang_compare: compares profiles' results; runs after all others")
    config.pluginmanager.register(SGLangBench(config), "sglang-bench")


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
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        if workers > 1 and not self.sim:
            raise PluginError(
                f"pytest-xdist runs {workers} workers and each would launch its own {profile.kind} server for "
                f"profile {profile.name!r} (on a GPU box: {workers} copies of the model). Run the server tests "
                f"with -n 0, or start the server once and pass --sglang-url=URL to every worker."
            )
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
        died = _death_of(server)
        if died is not None:
            pytest.fail(str(died), pytrace=False)
        try:
            return (yield)
        except Exception as exc:
            # A request that broke mid-test (a reset socket, vLLM's 500 as its engine dies) is usually the crash
            # itself: report the crash, not the symptom. Other failures pass through untouched.
            broken_request = isinstance(exc, (requests.ConnectionError, requests.exceptions.ChunkedEncodingError,
                                              ConnectionError))
            if not (broken_request or server.has_logged_crash()):
                raise
            died = _death_of(server, wait=5.0)
            if died is None:
                raise
            seen = f"{type(exc).__name__}: {exc}"
        pytest.fail(f"{died}\n\n(The test itself saw: {seen})", pytrace=False)

    # -- summary --------------------------------------------------------------------------------------------

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.records:
            return
        terminalreporter.section("sglang servers")
        for record in self.records.values():
            terminalreporter.write_line(_summary_line(record))


def _fail_with(exc: BaseException) -> NoReturn:
    """Fail with our message alone: no traceback of the plugin, no "During handling of..." chain."""
    raise pytest.fail.Exception(str(exc), pytrace=False) from None


def _death_of(server: SGLangServer, wait: float = 0.0) -> ServerDiedError | None:
    try:
        server.check_alive(wait=wait)
    except ServerDiedError as exc:
        return exc
    return None


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
        _fail_with(exc)
    try:
        yield server
    finally:
        session.close_server(server, server.config)


# -- benchmarks, baselines, reports: the work is in bench.py, baseline.py and report.py -----------------------


class SGLangBench:
    """Session state behind sglang_bench, sglang_baseline and sglang_results, and the report at the end."""

    def __init__(self, config: pytest.Config) -> None:
        from pytest_sglang.report import SessionResults

        self.config = config
        self.results = SessionResults()
        self.notes: list[str] = []  # from checks of startup_seconds, which belong to no benchmark
        self._checker: BaselineChecker | None = None
        self._labels: dict[str, str | None] = {}

    @property
    def checker(self) -> BaselineChecker:
        if self._checker is None:
            from pytest_sglang.baseline import DEFAULT_FILENAME, BaselineChecker, BaselineStore, git_commit

            opt = self.config.getoption("sglang_baseline")
            path = Path(opt).resolve() if opt else self.config.rootpath / DEFAULT_FILENAME
            self._checker = BaselineChecker(
                BaselineStore(path), update=self.config.getoption("sglang_update_baseline"),
                strict=self.config.getoption("sglang_baseline_strict"), commit=git_commit(self.config.rootpath))
        return self._checker

    def server_label(self, server: SGLangServer) -> str | None:
        """``"sglang 0.5.2"``: part of the machine fingerprint; asked of the server once per profile."""
        if server.profile not in self._labels:
            from pytest_sglang.client import Client

            with Client(server.base_url, api_key=server.api_key, timeout=30) as client:
                version = client.version()
            self._labels[server.profile] = f"{server.kind} {version}" if version else server.kind
        return self._labels[server.profile]

    def run(self, request: pytest.FixtureRequest, server: SGLangServer, **kwargs: object) -> BenchResult:
        from pytest_sglang.bench import BenchmarkFailedError, run_bench
        from pytest_sglang.report import ServerEntry, junit_properties, strip_param

        self.results.add_server(ServerEntry(server.profile, kind=server.kind, model=server.model,
                                            server_version=self.server_label(server)))
        try:
            result = run_bench(server, **kwargs)  # type: ignore[arg-type]
        except BenchmarkFailedError as exc:
            if exc.result is not None:
                self.results.add_bench(server.profile, strip_param(request.node.nodeid, server.profile),
                                       request.node.nodeid, exc.result)
            _fail_with(exc)
        self.results.add_bench(server.profile, strip_param(request.node.nodeid, server.profile),
                               request.node.nodeid, result)
        request.node.user_properties.extend(junit_properties(result))
        return result

    def check(self, request: pytest.FixtureRequest, result: object, tolerances: dict[str, str | float]
              ) -> Comparison:
        from pytest_sglang.errors import BaselineError
        from pytest_sglang.report import strip_param

        server: Any = result if hasattr(result, "base_url") and hasattr(result, "startup_seconds") else None
        if server is None and "sglang_server" in request.fixturenames:
            server = request.getfixturevalue("sglang_server")
        profile = getattr(result, "profile", None) or getattr(server, "profile", None)
        if not profile:
            pytest.fail("sglang_baseline.check() needs a result of sglang_bench or the sglang_server handle",
                        pytrace=False)
        label = self.server_label(server) if server is not None else self._labels.get(profile)
        try:
            comp = self.checker.check(result, tolerances, profile=profile,
                                      test_id=strip_param(request.node.nodeid, profile), server=label)
        except BaselineError as exc:
            _fail_with(exc)
        entries = [b for b in self.results.entry_for(request.node.nodeid) if b.result is result]
        if entries:
            entries[-1].comparisons.append(comp)  # its notes reach the summary through the report
        else:
            self.results.server_checks.append(comp)
            self.notes.extend(f"{request.node.nodeid}: {n}" for n in comp.notes)
        for check in comp.checks:
            if check.baseline is not None:
                request.node.user_properties.append((f"sglang_baseline_{check.metric}", check.baseline))
        if comp.failed:
            pytest.fail(comp.failure_message(), pytrace=False)
        return comp

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        last = [i for i in items if i.get_closest_marker("sglang_compare")]
        if last:
            items[:] = [i for i in items if not i.get_closest_marker("sglang_compare")] + last

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            for entry in self.results.entry_for(report.nodeid):
                entry.outcome = report.outcome

    def report(self) -> dict[str, object]:
        from pytest_sglang.report import ServerEntry, build_report

        for name, rec in _session(self.config).records.items():
            old = self.results.servers.get(name) or ServerEntry(name)
            old.startup_seconds, old.phases, old.error = rec.startup_seconds, dict(rec.phases), rec.error
            old.log_path = str(rec.log_path) if rec.log_path else None
            self.results.servers[name] = old
        checker = self._checker
        return build_report(self.results, machine=checker.machine(None) if checker else None,
                            commit=checker.commit if checker else None,
                            baseline_path=str(checker.store.path) if checker else None)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        from pytest_sglang.report import terminal_lines

        if not self.results.benches and not self.results.server_checks:
            return
        terminalreporter.section("sglang benchmarks")
        for line in terminal_lines(self.report()):
            terminalreporter.write_line(line)
        for note in self.notes:
            terminalreporter.write_line(f"note: {note}")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from pytest_sglang.report import append_step_summary, write_html, write_json

        path = self.config.getoption("sglang_report")
        if not path and not (self.results.benches and os.environ.get("GITHUB_STEP_SUMMARY")):
            return
        report = self.report()
        if path:
            json_path = write_json(path, report)
            write_html(json_path.with_suffix(".html"), report)
        if self.results.benches:
            append_step_summary(report)


def _bench(config: pytest.Config) -> SGLangBench:
    plugin = config.pluginmanager.get_plugin("sglang-bench")
    assert isinstance(plugin, SGLangBench)
    return plugin


class BaselineFixture:
    """The ``sglang_baseline`` fixture: ``check(result, output_throughput="5%", median_ttft_ms="10%")``."""

    def __init__(self, request: pytest.FixtureRequest, state: SGLangBench) -> None:
        self._request = request
        self._state = state

    @property
    def updating(self) -> bool:
        return self._state.checker.update

    def check(self, result: object, **tolerances: str | float) -> Comparison:
        """Compare ``result`` (of sglang_bench, or sglang_server for startup_seconds) with the baseline of
        this profile, test and machine; fails the test on a regression. Tolerances: "5%" or an absolute
        amount. Under --sglang-update-baseline it records instead."""
        return self._state.check(self._request, result, tolerances)


@pytest.fixture(scope="session")
def sglang_results(request: pytest.FixtureRequest) -> SessionResults:
    """Every benchmark result of this session by profile: ``.get(profile, test)``, and
    ``.compare("eagle3", "baseline", "test_x", output_throughput="10%")`` in a test marked
    ``@pytest.mark.sglang_compare`` (such tests run after all others)."""
    return _bench(request.config).results


@pytest.fixture
def sglang_bench(request: pytest.FixtureRequest, sglang_server: SGLangServer) -> Callable[..., BenchResult]:
    """``sglang_bench(num_requests=64, concurrency=None, request_rate=inf, input_len=128, output_len=128,
    api="completions"|"chat"|"generate", warmup=1, seed=0, ...)`` streams requests at the profile's server
    and returns a BenchResult named as sglang.bench_serving names its figures (see pytest_sglang.bench)."""
    state = _bench(request.config)

    def bench(**kwargs: object) -> BenchResult:
        return state.run(request, sglang_server, **kwargs)

    return bench


@pytest.fixture
def sglang_baseline(request: pytest.FixtureRequest) -> BaselineFixture:
    """``sglang_baseline.check(result, output_throughput="5%")``: direction-aware regression check against
    the committed baseline file; records instead under --sglang-update-baseline."""
    return BaselineFixture(request, _bench(request.config))
