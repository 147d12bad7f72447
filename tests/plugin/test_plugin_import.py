"""Installing the plugin must cost a pytest run that uses no server almost nothing: the entry point loads options
and hooks, the rest loads on first use (benchmarks/import_cost.py measures the time; this checks the module set)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# What the entry point itself needs: options, hooks, the session ledger (its records load with the first server).
ENTRY_MODULES = {
    "pytest_sglang", "pytest_sglang.plugin.distributed", "pytest_sglang.errors", "pytest_sglang.plugin.nodes",
    "pytest_sglang.plugin", "pytest_sglang.session", "pytest_sglang.plugin.settings", "pytest_sglang.harness",
    "pytest_sglang.harness.core", "pytest_sglang.harness.history", "pytest_sglang.harness.measure",
    "pytest_sglang.harness.node", "pytest_sglang.harness.settings", "pytest_sglang.harness.workers",
}
HEAVY = {"requests", "urllib3", "psutil", "filelock", "tomllib", "asyncio", "http.client"}

SHOW_MODULES = """
import sys
def pytest_unconfigure(config):
    print("MODULES", " ".join(sorted(m for m in sys.modules if m.startswith("pytest_sglang"))))
    print("HEAVY", " ".join(sorted(m for m in {HEAVY!r} if m in sys.modules)))
"""


def _loaded_by(code: str, cwd: Path) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=dict(os.environ), check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return set(out.split())


def test_importing_the_plugin_loads_only_options_and_hooks(tmp_path: Path) -> None:
    added = _loaded_by("import sys, pytest\nbefore = set(sys.modules)\nimport pytest_sglang.plugin\n"
                       "print(*sorted(set(sys.modules) - before))", tmp_path)
    assert {m for m in added if m.startswith("pytest_sglang")} == ENTRY_MODULES
    assert not added & HEAVY, f"the entry point pulled in {sorted(added & HEAVY)}"


def test_a_run_that_uses_no_server_loads_nothing_more(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SHOW_MODULES.replace("{HEAVY!r}", repr(sorted(HEAVY))))
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=1)
    modules = next(line for line in result.outlines if line.startswith("MODULES")).split()[1:]
    heavy = next(line for line in result.outlines if line.startswith("HEAVY")).split()[1:]
    # The fixtures register at the start; the environment knobs are checked there (a bad one is a usage error).
    assert set(modules) == ENTRY_MODULES | {"pytest_sglang.plugin.fixtures", "pytest_sglang.envknobs"}
    assert not heavy, f"a run without a server loaded {heavy}"
