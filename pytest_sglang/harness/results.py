"""Every benchmark result and greedy output of a session by profile, as comparisons ask for them: under
pytest-xdist a result another worker is still measuring is waited for, a profile that did not run is a
NotRunError (pytest: a skip), and a comparison that fails is a typed error whose message is the whole verdict."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_sglang.errors import CheckFailedError, NotRunError
from pytest_sglang.session import BenchEntry

RESULT_WAIT_SECONDS = 600.0  # how long a comparison waits for a result another xdist worker is measuring
# Once both profiles have greedy outputs but not for the same prompts, how long another worker may still be adding
# some before the comparison counts the prompts recorded under one profile only.
OUTPUTS_SETTLE_SECONDS = 60.0

if TYPE_CHECKING:
    from pytest_sglang.bench import BenchResult
    from pytest_sglang.bench.outputs import OutputComparison
    from pytest_sglang.exchange import Published
    from pytest_sglang.server.shared import SharedServers
    from pytest_sglang.session import SessionLedger


class Results:
    """``get(profile, test)``, ``compare(better, other, test, **margins)``, ``compare_outputs(a, b)``."""

    def __init__(self, ledger: SessionLedger, shared: SharedServers | None, selected: Callable[[], list[str]]
                 ) -> None:
        self._ledger = ledger
        self._shared = shared
        self._selected = selected

    @property
    def profiles(self) -> list[str]:
        return self._ledger.profiles

    def find(self, profile: str, test: str) -> BenchResult | None:
        return self._ledger.find(profile, test)

    def get(self, profile: str, test: str) -> BenchResult:
        self._require_ran(profile)
        self._await_results([profile], test)
        return self._ledger.get(profile, test)

    def compare(self, better: str, other: str, test: str, **margins: str | float) -> dict[str, float]:
        """Raise unless profile ``better`` beats ``other`` on ``test`` by each margin (e.g.
        ``output_throughput="10%"``); returns the signed changes in percent (positive: ``better`` is better)."""
        for profile in (better, other):
            self._require_ran(profile)
        self._await_results([better, other], test)
        return self._ledger.compare(better, other, test, **margins)

    def compare_outputs(self, profile_a: str, profile_b: str, *, allow_differing: int = 0,
                        tie_margin: float = 0.0) -> OutputComparison:
        """Raise unless the greedy outputs recorded under both profiles are equal; the message names the first
        prompt and token position that differ, both texts shown around it, and (from SGLang and vLLM) by how many
        nats each side's token led the other's there. ``tie_margin``: a divergence where both leads are within it
        is a near tie (two kernels rounding differently) and does not count; ``allow_differing``: how many
        prompts may differ whatever their margins."""
        from pytest_sglang.bench.outputs import compare_outputs

        for profile in (profile_a, profile_b):
            self._require_ran(profile)
        self._await_outputs([profile_a, profile_b])
        missing = [p for p in (profile_a, profile_b) if not self._ledger.outputs.get(p)]
        if missing:
            raise CheckFailedError(f"no greedy outputs recorded under profile {missing[0]!r}: call "
                                   "sglang_outputs(prompts) in a test that runs under it")
        try:
            outcome = compare_outputs(self._ledger.outputs[profile_a], self._ledger.outputs[profile_b],
                                      allow_differing=allow_differing, tie_margin=tie_margin)
        except ValueError as exc:
            raise CheckFailedError(str(exc)) from None
        note = outcome.message.splitlines()[0]
        if note not in self._ledger.notes:  # the same comparison asked twice is one note
            self._ledger.notes.append(note)
        if outcome.failed:
            raise CheckFailedError(outcome.message)
        return outcome

    def _await_other_workers(self, done: Callable[[float], bool]) -> None:
        """Under pytest-xdist another worker may still be measuring what a comparison needs: take in what every
        worker published until ``done(now)``, or for RESULT_WAIT_SECONDS."""
        deadline = time.monotonic() + RESULT_WAIT_SECONDS
        while self._shared is not None:
            self._take_in(self._shared.results.entries())
            now = time.monotonic()
            if done(now) or now > deadline:
                return
            time.sleep(0.5)

    def _take_in(self, entries: list[Published]) -> None:
        """Other workers' benchmark results and greedy outputs, into this ledger."""
        from pytest_sglang.bench.outputs import Output, OutputSet
        from pytest_sglang.exchange import PublishedOutputs

        seen = {(b.profile, b.nodeid) for b in self._ledger.from_other_workers}
        for entry in entries:
            if isinstance(entry, PublishedOutputs):
                self._ledger.outputs.setdefault(entry.profile, OutputSet(entry.profile)).add(
                    [Output.from_dict(o) for o in entry.outputs])
            elif (entry.profile, entry.nodeid) not in seen:
                self._ledger.from_other_workers.append(
                    BenchEntry(entry.profile, entry.test_id, entry.nodeid, entry.result))  # type: ignore[arg-type]

    def _await_results(self, profiles: list[str], test: str) -> None:
        self._await_other_workers(lambda _now: all(self._ledger.find(p, test) is not None for p in profiles))

    def _await_outputs(self, profiles: list[str]) -> None:
        """Until both profiles have greedy outputs for the same prompts, or OUTPUTS_SETTLE_SECONDS after both
        have some."""
        settle_by: float | None = None

        def done(now: float) -> bool:
            nonlocal settle_by
            sets = [self._ledger.outputs.get(p) for p in profiles]
            if not all(sets):
                return False
            if len({frozenset(s.outputs) for s in sets if s is not None}) == 1:
                return True
            settle_by = settle_by or now + OUTPUTS_SETTLE_SECONDS
            return now > settle_by

        self._await_other_workers(done)

    def _require_ran(self, profile: str) -> None:
        selected = self._selected()
        if profile not in selected:
            raise NotRunError(f"profile {profile!r} did not run in this session (selected: "
                              f"{', '.join(selected) or 'none'}); pass "
                              f"--sglang-profile={','.join(dict.fromkeys([*selected, profile]))} to compare it")
        record = self._ledger.startups.get(profile)
        if record is not None and not record.ready:
            raise NotRunError(f"profile {profile!r}: its server did not start ({record.reason})")
