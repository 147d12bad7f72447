"""pytest-sglang: launch an LLM inference server once per session, know at once when it is ready or broken.

    harness/    the pytest-free core: ``Harness`` (a session's work), its Settings, measurements, results, pool
    plugin/     the pytest layer, thin: options -> a Harness, fixtures -> its calls, its errors -> fail/skip
    config/     the profile schema, profiles and kinds;  launch/  plans, process tree, ports, ssh, SLURM
    watch/      the log watcher and root causes;  server/  where a server comes from, readiness, the handle
    bench/      the load generator and its frozen BenchResult;  baseline/  the one engine, the one gate
    history/    the run history;  report/  JSON, tables, junitxml, HTML;  sim/  the SGLang simulator
    machine/, stats/  leaves;  session.py  the ledger;  exchange.py  xdist's results;  errors.py

Nothing outside plugin/ imports pytest. Two walks through the code, the files each passes in order:

A profile, from the command line to the launched process (``pytest --sglang-profile=eagle3``):
    plugin/settings.py (settings_of: options and ini into a Settings) -> harness/settings.py (Settings) ->
    plugin/__init__.py (SGLangPlugin makes the Harness; pytest_sessionstart) -> harness/core.py (Harness.start)
    -> config/profiles.py (load_profiles, extends, ${VAR}) -> config/schema.py and config/rules.py (each key's
    type, merge and check) -> plugin/fixtures.py (sglang_server) -> harness/core.py (Harness.open_server) ->
    server/source.py (server_source: which origin; open_server) -> launch/planner.py (Planner.plan) ->
    launch/plan.py (plan_launch: the command, env, fingerprint; config/kinds.py: the server's rules) ->
    server/origins.py (launch_server, spawn) -> launch/process.py (ServerProcess: its own session, the reaper)
    -> server/origins.py (startup_wait) -> server/readiness/compose.py (server_startup: this origin's checks)
    -> server/ready.py (wait_for: the one loop; watch/watcher.py reads the log) -> server/record.py
    (StartupRecord) -> server/handle.py (the ServerHandle the test gets).

A figure, from the client to the gate (``sglang_bench(...)`` then ``sglang_baseline.check(r, ...)``):
    plugin/fixtures.py (sglang_bench) -> harness/core.py (Harness.bench) -> harness/measure.py (run_bench) ->
    bench/runner.py (run_bench) -> bench/plan.py (the checked workload) -> bench/drive.py (the event loop) ->
    bench/stream.py (each chunk's time) -> bench/metrics.py (compute_metrics, combine_rounds) ->
    bench/result.py (the frozen BenchResult; server_metrics.py and telemetry.py make copies with their parts)
    -> harness/measure.py (the ledger, junit properties) -> plugin/fixtures.py (sglang_baseline.check) ->
    harness/core.py (Harness.check) -> harness/measure.py (check) -> baseline/checks.py (BaselineChecker.check)
    -> bench/metric_table.py (read: the metric by name, its direction) -> baseline/engine/ (rounds.py: judge)
    -> baseline/outcome.py (Check, Comparison) -> baseline/gate.py (the gate and how gates sum) ->
    report/build.py (the run's gate), report/junit.py, report/tables.py -> plugin/nodes.py (as_outcome: a
    CheckFailedError fails the test with its message alone).
"""

from pytest_sglang.errors import (
    BaselineError,
    BenchmarkError,
    BenchmarkFailedError,
    CheckFailedError,
    NotRunError,
    PluginError,
    PortInUseError,
    ProfileComparisonError,
    ProfileError,
    RemoteError,
    ResultNotFoundError,
    ServerDiedError,
    ServerError,
    ServerRequestError,
    ServerStartupError,
    UsageProblem,
)
from pytest_sglang.harness import Harness, Settings

__all__ = [
    "BaselineError",
    "BenchmarkError",
    "BenchmarkFailedError",
    "CheckFailedError",
    "Harness",
    "NotRunError",
    "PluginError",
    "PortInUseError",
    "ProfileComparisonError",
    "ProfileError",
    "RemoteError",
    "ResultNotFoundError",
    "ServerDiedError",
    "ServerError",
    "ServerRequestError",
    "ServerStartupError",
    "Settings",
    "UsageProblem",
]
__version__ = "0.1.0"
