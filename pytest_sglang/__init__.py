"""pytest-sglang: launch an LLM inference server once per session, know at once when it is ready or broken.

    plugin/     the pytest layer: hooks, fixtures, options, --sglang-show, pytest-xdist (the entry point)
    config/     profiles and kinds;  launch/  plan, process tree, ports, ssh, SLURM
    watch/      the log watcher and root causes;  server/  where a server comes from, readiness, the handle
    bench/      the load generator;  baseline/  the one comparison engine and the baseline file
    report/     JSON, tables, junitxml, HTML;  sim/  the SGLang simulator
    session.py  the ledger;  exchange.py  the xdist results exchange;  envknobs.py;  errors.py

Everything outside plugin/ knows nothing about pytest.
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
