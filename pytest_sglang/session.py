"""The session ledger: what this pytest session's servers and benchmarks did. Knows nothing about pytest.

The plugin feeds it (startup records, benchmark results, baseline comparisons, test outcomes); the report
and the terminal summary read it. ``get`` and ``compare`` answer the ``sglang_results`` fixture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_sglang.errors import ProfileComparisonError, ResultNotFoundError

if TYPE_CHECKING:
    from pytest_sglang.baseline import Comparison
    from pytest_sglang.baseline.ab import ABResult
    from pytest_sglang.bench import BenchResult
    from pytest_sglang.bench.outputs import OutputSet
    from pytest_sglang.server.record import StartupRecord


@dataclass
class BenchEntry:
    profile: str
    test_id: str  # the node id without the profile parameter: the baseline key
    nodeid: str
    result: BenchResult
    comparisons: list[Comparison] = field(default_factory=list)
    outcome: str | None = None  # "passed", "failed", ... once the test has finished
    machine_key: str | None = None  # where it ran, as the baseline check keys it (the history's machine)


@dataclass
class ABEntry:
    nodeid: str
    result: ABResult
    outcome: str | None = None
    machine_keys: dict[str, str] = field(default_factory=dict)  # profile -> where its rounds ran (the history's)
    workload: str | None = None  # the A/B's workload key (baseline/store.workload_key), the history's too


class SessionLedger:
    """Every startup record, benchmark result and comparison of this session, keyed by profile."""

    def __init__(self) -> None:
        self.startups: dict[str, StartupRecord] = {}
        self.server_versions: dict[str, str | None] = {}  # profile -> "sglang 0.5.23", asked once
        self.benches: list[BenchEntry] = []
        self.ab: list[ABEntry] = []  # the sglang_ab fixture's runs
        self.startup_checks: list[Comparison] = []  # checks of startup_seconds, which belong to no benchmark
        self.notes: list[str] = []
        self.kept: list[str] = []  # servers left running for --sglang-reuse, as "name: pid N on port P"
        self.outputs: dict[str, OutputSet] = {}  # profile -> its greedy outputs (the sglang_outputs fixture)
        # Results other pytest-xdist workers measured (their result a mapping): found, never reported twice.
        self.from_other_workers: list[BenchEntry] = []

    def add_startup(self, record: StartupRecord) -> None:
        self.startups[record.profile] = record

    def add_bench(self, profile: str, test_id: str, nodeid: str, result: BenchResult,
                  machine_key: str | None = None) -> BenchEntry:
        entry = BenchEntry(profile, test_id, nodeid, result, machine_key=machine_key)
        self.benches.append(entry)
        return entry

    def add_ab(self, nodeid: str, result: ABResult, *, machine_keys: dict[str, str] | None = None,
               workload: str | None = None) -> ABEntry:
        entry = ABEntry(nodeid, result, machine_keys=dict(machine_keys or {}), workload=workload)
        self.ab.append(entry)
        return entry

    def entries_for(self, nodeid: str) -> list[BenchEntry]:
        return [b for b in self.benches if b.nodeid == nodeid]

    def set_outcome(self, nodeid: str, outcome: str) -> None:
        for entry in self.entries_for(nodeid):
            entry.outcome = outcome
        for ab in self.ab:
            if ab.nodeid == nodeid:
                ab.outcome = outcome

    @property
    def profiles(self) -> list[str]:
        return list(dict.fromkeys([*self.startups, *(b.profile for b in self.benches)]))

    def find(self, profile: str, test: str) -> BenchResult | None:
        """The last result of ``test`` (a test id, a node id, or a test function name) under ``profile``."""
        for b in reversed([*self.from_other_workers, *self.benches]):
            name = b.test_id.rsplit("::", 1)[-1]
            if b.profile == profile and (test in (b.test_id, b.nodeid, name) or b.test_id.endswith("::" + test)):
                return b.result
        return None

    def get(self, profile: str, test: str) -> BenchResult:
        found = self.find(profile, test)
        if found is None:
            ran = sorted({f"{b.profile}: {b.test_id}" for b in self.benches}) or ["nothing"]
            raise ResultNotFoundError(f"no benchmark result for test {test!r} under profile {profile!r} in this "
                                      f"session (recorded: {'; '.join(ran)})")
        return found

    def compare(self, better: str, other: str, test: str, **margins: str | float) -> dict[str, float]:
        """Raise ProfileComparisonError unless profile ``better`` beats profile ``other`` on ``test`` by each
        metric's margin ("10%" relative or an absolute amount; "0%" means at least as good). Returns the
        signed relative changes in percent (positive: ``better`` is better)."""
        from pytest_sglang.baseline import compare_profiles

        outcome = compare_profiles(better, self.get(better, test), other, self.get(other, test), test, margins)
        if outcome.message not in self.notes:  # the ratio, its interval and p-value, in the summary
            self.notes.append(outcome.message)
        if outcome.failed:
            raise ProfileComparisonError(outcome.message)
        return dict(outcome.gains)
