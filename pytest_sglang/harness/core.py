"""The Harness: one session's work without pytest. It selects and plans profiles, opens and shares servers (every
origin), runs benchmarks, baseline checks and A/B comparisons, keeps the ledger, and makes the outcome that the
reports render. Everything it cannot do is a typed error (errors.py); the plugin turns those into a test's
outcome, a script sees them as they are."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sglang.errors import HistoryError, PluginError, ServerDiedError, ServerError, UsageProblem
from pytest_sglang.harness.history import SessionHistory
from pytest_sglang.harness.measure import Measurements
from pytest_sglang.harness.node import TestRef
from pytest_sglang.harness.settings import Settings, sim_without_profile
from pytest_sglang.harness.workers import ControllerRun, tell_controller
from pytest_sglang.session import SessionLedger

if TYPE_CHECKING:
    from pytest_sglang.baseline import Comparison
    from pytest_sglang.baseline.ab import ABResult
    from pytest_sglang.bench import BenchResult
    from pytest_sglang.bench.outputs import Output
    from pytest_sglang.config.profiles import ProfileSet
    from pytest_sglang.harness.pool import ServerPool
    from pytest_sglang.harness.results import Results
    from pytest_sglang.launch.planner import Planner
    from pytest_sglang.server import ServerHandle
    from pytest_sglang.server.shared import SharedServers

URL_PARAM = "url"  # the server's name when --sglang-url is given without a profile


@dataclass
class Finished:
    """What ending the session did: the lines that say where its reports went, and whether it lost figures."""

    written: list[str] = field(default_factory=list)
    history_error: str | None = None


class Harness:
    """A session: ``Harness(profiles=["base"], sim=True)`` (the Settings' keywords), or ``Harness(settings)``.

    ``with harness.server("base") as server: harness.bench(server, num_requests=32)``; ``harness.finish()``
    writes the reports the settings ask for; ``close()`` (or the ``with`` block's end) stops what it launched.
    """

    def __init__(self, settings: Settings | None = None, *, on_status: Callable[[str], None] | None = None,
                 shared: SharedServers | None = None, sim_run: str | None = None, **options: Any) -> None:
        if settings is not None and options:
            raise TypeError("Harness takes a Settings or its keywords, not both")
        self.settings = settings or _settings(**options)
        self.shared = shared  # under pytest-xdist, on a worker: the run's shared servers
        self.ledger = SessionLedger()
        self._on_status = on_status or _to_stderr
        self._sim_run = sim_run
        self._profiles: ProfileSet | None = None
        # every process reads the history for its checks; the one holding every result appends to it
        self.history = SessionHistory(self.settings.history_path, appends=shared is None)
        self.fingerprints: dict[str, str] = {}  # profile -> its plan's server fingerprint (the Planner's)
        self.measure = Measurements(self.settings, self.ledger, shared, self.history, self.fingerprints)
        self.workers = ControllerRun(self.settings, self.status)  # the xdist controller's side
        self.started = time.time()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @functools.cached_property
    def sim_run(self) -> str:
        """One drift for every simulator of this run (drawn on first use, unless the xdist controller's)."""
        from pytest_sglang.sim.drift import SimRun

        return self._sim_run or SimRun.draw().to_env()

    @functools.cached_property
    def planner(self) -> Planner:
        from pytest_sglang.launch.planner import Planner

        s = self.settings
        return Planner(sim=s.sim, sim_run=self.sim_run, startup_timeout=s.startup_timeout,
                       log_dir_option=s.log_dir_option, fingerprints=self.fingerprints)

    @functools.cached_property
    def pool(self) -> ServerPool:
        """The servers A/B comparisons need alive at once."""
        from pytest_sglang.harness.pool import ServerPool

        return ServerPool(self._open)  # an A/B pair's failed startup is told by the pair's error

    @functools.cached_property
    def results(self) -> Results:
        from pytest_sglang.harness.results import Results

        return Results(self.ledger, self.shared, self.selected)

    def status(self, text: str) -> None:
        """A live line during a long startup (an xdist worker's goes to the controller, which shows it)."""
        if self.shared is not None:
            tell_controller(self.shared, text)
        else:
            self._on_status(text)

    # Profiles.

    def profiles(self) -> ProfileSet:
        if self._profiles is None:
            from pytest_sglang.config.profiles import load_profiles

            self._profiles = load_profiles(self.settings.rootdir, self.settings.config_path, keep_going=True)
        return self._profiles

    def selected(self) -> list[str]:
        """The servers this session tests, by name: the selected profiles, or "url" for --sglang-url alone."""
        if self.settings.profiles:
            return list(self.settings.profiles)
        return [URL_PARAM] if self.settings.url else []

    def start(self) -> None:
        """Everything that would stop the run, said before any server launches (UsageProblem), and warnings for
        what it goes on without."""
        s = self.settings
        problem = s.usage_problem()
        if problem:
            raise UsageProblem(problem)
        try:
            if s.profiles:
                self.profiles().select(list(s.profiles), s.origins.get("sglang_profile", "--sglang-profile"))
            elif s.sim and not s.url:
                raise UsageProblem(sim_without_profile(sorted(self.profiles().profiles)))
        except UsageProblem:
            raise
        except PluginError as exc:
            raise UsageProblem(str(exc)) from None
        if s.profiles:  # a run that selects none loads no profiles at all
            self._warn_of_profiles(self.profiles())
        try:
            self.history.check()  # before any server launches: a store this run could not append to stops it
        except HistoryError as exc:
            raise UsageProblem(f"--sglang-history: {exc}") from None
        if self.selected() and self.shared is None:
            try:  # a baseline file that could not be read, or written under --sglang-update-baseline, stops it too
                self.measure.checker.store.preflight(write=s.update_baseline)
            except PluginError as exc:
                raise UsageProblem(str(exc)) from None

    def _warn_of_profiles(self, profiles: ProfileSet) -> None:
        """What the real server would miss that the simulator does not need, and broken profiles left out."""
        from pytest_sglang.launch.logdir import state_dir
        from pytest_sglang.launch.plan import real_launch_problems

        for name in self.settings.profiles if self.settings.sim else ():
            if name in profiles.profiles:
                for problem in real_launch_problems(profiles.profiles[name], state_dir() / "logs"):
                    self.status(f"[sglang] warning: without --sglang-sim this launch would fail: {problem}")
        for name in profiles.unselected_broken(self.settings.profiles):
            self.status(f"[sglang] warning: profile {name!r} is broken and was not selected, so this run goes "
                        f"on without it: {profiles.broken[name]}")

    # Servers.

    def open_server(self, name: str) -> ServerHandle:
        """The ready server of profile ``name`` (or of --sglang-url, as "url"), from wherever it comes; a
        startup that fails is in the ledger whatever raised."""
        try:
            return self._open(name)
        except Exception as exc:
            self._record_failure(name, exc)
            raise

    def _open(self, name: str) -> ServerHandle:
        from pytest_sglang.server.source import Asked, Origins, open_server

        profile = self.profiles().select([name])[0] if name != URL_PARAM else None
        s = self.settings
        asked = Asked(url=s.url, reuse=s.reuse, xdist=self.shared is not None)
        origins = Origins(shared=self.shared, rootdir=s.rootdir, planner=self.planner, on_status=self.status,
                          on_record=self.ledger.add_startup, on_kept=self.ledger.kept.append)
        return open_server(profile, asked, origins, name=profile.name if profile else name)

    def _record_failure(self, profile: str, exc: Exception) -> None:
        """A startup that failed before the readiness loop made its record: the summary, the report and the gate
        say the server could not start, whatever raised."""
        from pytest_sglang.server import StartupRecord

        if profile in self.ledger.startups:
            return
        text = str(exc) if isinstance(exc, PluginError) else f"{type(exc).__name__}: {exc}"
        cause = exc.cause if isinstance(exc, ServerError) else next(iter(text.splitlines()), None)
        self.ledger.add_startup(StartupRecord(profile=profile, kind="unknown", origin="launched", outcome="failed",
                                              host="", port=0, error=text, cause=cause))

    def adopt(self, server: ServerHandle) -> None:
        """``server`` is kept open by its caller: an A/B comparison of its profile uses it, launching no other."""
        self.pool.adopt(server)

    def let_go(self, server: ServerHandle, *, look: float = 0.5) -> ServerDiedError | None:
        """Stop ``server`` (its caller is done with it); its death, if it died unseen (no one was told)."""
        self.pool.forget(server)
        unseen = None if server.death_told else self.death_of(server, wait=look)
        server.close()
        return unseen

    @contextmanager
    def server(self, name: str) -> Iterator[ServerHandle]:
        """``with harness.server("base") as server:`` a ready server, stopped at the block's end; a death that
        went unseen is raised there."""
        server = self.open_server(name)
        self.adopt(server)
        try:
            yield server
        finally:
            unseen = self.let_go(server)
        if unseen is not None:
            raise unseen

    def death_of(self, server: ServerHandle, wait: float = 0.0) -> ServerDiedError | None:
        """The server's death, if it has died; the summary and the report then say so."""
        try:
            server.check_alive(wait=wait)
        except ServerDiedError as exc:
            self.note_death(server, exc)
            return exc
        return None

    def note_death(self, server: ServerHandle, death: ServerDiedError) -> None:
        record = self.ledger.startups.get(server.record.profile)
        if record is not None and record.died is None:
            why = death.cause or death.headline
            self.ledger.add_startup(record.dying(f"{death.member}: {why}" if death.member else why,
                                                 log_path=death.log_path))

    # Measurements.

    def bench(self, server: ServerHandle, *, test: TestRef | None = None, **workload: Any) -> BenchResult:
        """``sglang_bench``'s run (pytest_sglang.bench.run_bench's keywords), recorded for the report."""
        return self.measure.run_bench(test or TestRef(), server, **workload)

    def check(self, result: object, *, test: TestRef | None = None, server: ServerHandle | None = None,
              **tolerances: str | float) -> Comparison:
        """``result`` against its stored baseline (``output_throughput="5%"``); CheckFailedError on a
        regression, and under update_baseline it records instead."""
        if server is None and hasattr(result, "base_url") and hasattr(result, "startup_seconds"):
            server = result  # type: ignore[assignment]
        return self.measure.check(test or TestRef(), result, dict(tolerances), server)

    def outputs(self, server: ServerHandle, prompts: Sequence[str | Sequence[int]] | None = None,
                max_tokens: int = 32) -> list[Output]:
        """The greedy outputs (temperature 0) of ``prompts`` from ``server``, recorded for comparisons."""
        from pytest_sglang.bench.client import Client
        from pytest_sglang.bench.outputs import DEFAULT_PROMPTS, OutputSet, greedy_outputs

        with Client(server.base_url, api_key=server.api_key, timeout=600, model=server.model) as client:
            got = greedy_outputs(client, server.kind, list(prompts or DEFAULT_PROMPTS), max_tokens=max_tokens,
                                 model=client.model())
        self.ledger.outputs.setdefault(server.profile, OutputSet(server.profile)).add(got)
        if self.shared is not None:
            from pytest_sglang.exchange import PublishedOutputs

            self.shared.results.publish(PublishedOutputs(server.profile, [o.to_dict() for o in got]))
        return got

    def ab(self, first: str, second: str, *, together: bool = True, test: TestRef | None = None,
           **workload: Any) -> ABResult:
        """Profile ``second``'s rounds against ``first``'s, interleaved with both servers alive (or bracketed,
        one at a time); its ``check(output_throughput="5%")`` raises CheckFailedError on a regression."""
        return self.measure.run_ab(test or TestRef(), self.pool, (first, second), together, workload)

    # The outcome.

    def has_benches(self) -> bool:
        return bool(self.ledger.benches or self.ledger.ab or self.workers.bench_count)

    def report(self) -> dict[str, object]:
        """The JSON report's content (docs/report-schema.md): every worker's figures under pytest-xdist."""
        from pytest_sglang.report import build_report, summarize

        checker = self.measure.checker  # the report names the machine it ran on, checked or not
        report = build_report(self.ledger, machine=checker.machine(None), commit=checker.commit,
                              baseline_path=str(checker.store.path) if self.measure.checked else None)
        report = summarize(self.workers.merged(report))  # sweeps and gates over every worker's benchmarks
        if self.history.appends:
            report["history"] = self.history.section or {"path": str(self.history.path),
                                                         "error": self.history.error}
        return report

    def summary(self, unserved: int = 0) -> list[tuple[str | None, list[str]]]:
        """The terminal's sections, each (title or None, its lines): servers, benchmarks, notes."""
        sections: list[tuple[str | None, list[str]]] = []
        if unserved:
            sections.append((None, [f"[sglang] {unserved} server test(s) skipped: no --sglang-profile or "
                                    "--sglang-url was given (ini sglang_require_profile = true makes that an error)"]))
        if self.ledger.startups:
            sections.append(("sglang servers", [r.summary() for r in self.ledger.startups.values()]
                             + [f"kept: {k}; stop it with `pytest --sglang-stop`" for k in self.ledger.kept]))
        if self.has_benches() or self.ledger.startup_checks:
            from pytest_sglang.report import terminal_lines

            sections.append(("sglang benchmarks", terminal_lines(self.report())
                             + [f"note: {note}" for note in self.ledger.notes]))
        return sections

    def finish(self, exit_status: int = 0, *, ran: bool = True) -> Finished:
        """End the session: stop its servers, append it to the history (``ran``: it ran tests), write the reports
        the settings ask for."""
        self.close()
        for line in self.workers.stop_servers():
            self.status(f"[sglang] stopped the shared server of {line}")
        finished = Finished()
        if self.history.appends and ran:  # a run that ran nothing is no run
            finished.history_error = self._append_history(exit_status)
        path = self.settings.report_path
        if self.shared is not None or not (path or (self.has_benches() and os.environ.get("GITHUB_STEP_SUMMARY"))):
            return finished  # an xdist worker's figures are written by the controller, with every other worker's
        from pytest_sglang.report import append_step_summary, write_html, write_json

        report = self.report()
        if path:
            json_path = write_json(path, report)
            finished.written += [f"sglang JSON report: {json_path.resolve()}",
                                 f"sglang HTML report: {write_html(json_path.with_suffix('.html'), report).resolve()}"]
        if self.has_benches() and (summary := append_step_summary(report)) is not None:
            finished.written.append(f"sglang step summary appended to {summary}")
        return finished

    def _append_history(self, exit_status: int) -> str | None:
        """This run into the history (once, by the process that holds every worker's results); why not, if not."""
        checker = self.measure.checker
        self.history.append(self.report(), commit=checker.commit, time=self.started, exit_status=exit_status,
                            machine_of=lambda v: checker.machine(v).key, ab=self.ledger.ab,
                            versions=self.ledger.server_versions)
        if self.history.error is not None:
            self.status(f"[sglang] ERROR: --sglang-history: this run was not appended: {self.history.error}")
        return self.history.error

    def close(self) -> None:
        """Stop the servers this session launched for A/B comparisons (those handed out are their holders')."""
        if "pool" in self.__dict__:
            self.pool.release()


def _settings(**options: Any) -> Settings:
    """A script's Settings: paths as given or relative to the working folder, profile names as a list."""
    if "profiles" in options:
        options["profiles"] = tuple(options["profiles"])
    for key in ("rootdir", "config_path", "baseline_path", "history_path"):
        if options.get(key) is not None:
            options[key] = Path(options[key]).resolve()
    return Settings(**options)


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
