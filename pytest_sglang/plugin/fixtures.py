"""The fixtures: ``sglang_server``, ``sglang_bench``, ``sglang_outputs``, ``sglang_baseline``, ``sglang_results``,
``sglang_ab``.

Registered through the package (its ``pytest_plugins``); each hands its work to the session's SGLangPlugin.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sglang.errors import PluginError, ResultNotFoundError, ServerError
from pytest_sglang.plugin import SGLangPlugin, plugin_of
from pytest_sglang.plugin.nodes import fail_with
from pytest_sglang.session import BenchEntry

RESULT_WAIT_SECONDS = 600.0  # how long a comparison waits for a result another xdist worker is measuring
# Once both profiles have greedy outputs but not for the same prompts, how long another worker may still be adding
# some before the comparison counts the prompts recorded under one profile only.
OUTPUTS_SETTLE_SECONDS = 60.0

if TYPE_CHECKING:
    from pytest_sglang.baseline import Comparison
    from pytest_sglang.baseline.ab import ABResult
    from pytest_sglang.bench import BenchResult
    from pytest_sglang.bench.outputs import Output, OutputComparison
    from pytest_sglang.bench.sweep import BenchFixture
    from pytest_sglang.exchange import Published
    from pytest_sglang.server import ServerHandle


class ResultsView:
    """The ``sglang_results`` fixture: the session's benchmark results, with a test's semantics. A profile
    that did not run skips with the reason; a failed comparison fails with its message alone."""

    def __init__(self, plugin: SGLangPlugin) -> None:
        self._plugin = plugin
        self._ledger = plugin.ledger

    @property
    def profiles(self) -> list[str]:
        return self._ledger.profiles

    def find(self, profile: str, test: str) -> BenchResult | None:
        return self._ledger.find(profile, test)

    def get(self, profile: str, test: str) -> BenchResult:
        self._skip_unless_ran(profile)
        self._await_results([profile], test)
        try:
            return self._ledger.get(profile, test)
        except ResultNotFoundError as exc:
            fail_with(exc)

    def compare(self, better: str, other: str, test: str, **margins: str | float) -> dict[str, float]:
        """Fail unless profile ``better`` beats ``other`` on ``test`` by each margin (e.g.
        ``output_throughput="10%"``); returns the signed changes in percent (positive: ``better`` is better)."""
        for profile in (better, other):
            self._skip_unless_ran(profile)
        self._await_results([better, other], test)
        try:
            return self._ledger.compare(better, other, test, **margins)
        except (ResultNotFoundError, PluginError, AssertionError) as exc:
            fail_with(exc)

    def compare_outputs(self, profile_a: str, profile_b: str, *, allow_differing: int = 0,
                        tie_margin: float = 0.0) -> OutputComparison:
        """Fail unless the greedy outputs that ``sglang_outputs`` recorded under both profiles are equal; the
        message names the first prompt and token position that differ, both texts shown around it, and (from
        SGLang and vLLM) by how many nats each side's token led the other's there. ``tie_margin``: a divergence
        where both leads are within it is a near tie (two kernels rounding differently) and does not count;
        ``allow_differing``: how many prompts may differ whatever their margins."""
        from pytest_sglang.bench.outputs import compare_outputs

        for profile in (profile_a, profile_b):
            self._skip_unless_ran(profile)
        self._await_outputs([profile_a, profile_b])
        missing = [p for p in (profile_a, profile_b) if not self._ledger.outputs.get(p)]
        if missing:
            pytest.fail(f"no greedy outputs recorded under profile {missing[0]!r}: call sglang_outputs(prompts) in "
                        "a test that runs under it", pytrace=False)
        try:
            outcome = compare_outputs(self._ledger.outputs[profile_a], self._ledger.outputs[profile_b],
                                      allow_differing=allow_differing, tie_margin=tie_margin)
        except ValueError as exc:
            fail_with(exc)
        note = outcome.message.splitlines()[0]
        if note not in self._ledger.notes:  # the same comparison asked twice is one note
            self._ledger.notes.append(note)
        if outcome.failed:
            pytest.fail(outcome.message, pytrace=False)
        return outcome

    def _await_other_workers(self, done: Callable[[float], bool]) -> None:
        """Under pytest-xdist another worker may still be measuring what a comparison needs: take in what every
        worker published until ``done(now)``, or for RESULT_WAIT_SECONDS."""
        shared = self._plugin.shared
        deadline = time.monotonic() + RESULT_WAIT_SECONDS
        while shared is not None:
            self._take_in(shared.results.entries())
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

    def _skip_unless_ran(self, profile: str) -> None:
        selected = self._plugin.params()
        if profile not in selected:
            pytest.skip(f"profile {profile!r} did not run in this session (selected: {', '.join(selected) or 'none'}"
                        f"); pass --sglang-profile={','.join(dict.fromkeys([*selected, profile]))} to compare it")
        record = self._ledger.startups.get(profile)
        if record is not None and not record.ready:
            pytest.skip(f"profile {profile!r}: its server did not start ({record.reason})")


TEARDOWN_LOOK_SECONDS = 0.5  # a process SIGKILLed a moment ago can still poll as running for a few ms


@pytest.fixture(scope="session")
def sglang_server(request: pytest.FixtureRequest) -> Generator[ServerHandle, None, None]:
    """A ready server for the current profile (session scope, one per --sglang-profile, one alive at a time).

    Attributes: base_url, host, port, profile, startup_seconds, phases, log_path, pid, url(path), check_alive().
    """
    plugin = plugin_of(request.config)
    param = getattr(request, "param", None)
    if param is None:
        try:
            known = ", ".join(sorted(plugin.profiles().profiles)) or "none defined"
        except PluginError:
            known = "see --sglang-config or pyproject.toml"
        pytest.skip(f"no server selected: pass --sglang-profile=NAME (known: {known}) or --sglang-url=URL")
    try:
        server = plugin.open_server(param)
    except PluginError as exc:
        _record_failure(plugin, param, exc)
        fail_with(exc)
    except Exception as exc:  # not one of ours: its traceback is the diagnosis, and the report still says so
        _record_failure(plugin, param, exc)
        raise
    plugin.pool.adopt(server)  # an A/B test of this profile uses it rather than launching another
    try:
        yield server
    finally:
        plugin.pool.forget(server)
        # a death no test was failed for (in the last test, or just before a test's check): the run fails here
        unseen = None if server.death_told else plugin.death_of(server, wait=TEARDOWN_LOOK_SECONDS)
        server.close()
    if unseen is not None:
        fail_with(unseen)


def _record_failure(plugin: SGLangPlugin, profile: str, exc: Exception) -> None:
    """A startup that failed before the readiness loop made its record: the summary, the report and the gate
    say the server could not start, whatever raised."""
    from pytest_sglang.server import StartupRecord

    if profile in plugin.ledger.startups:
        return
    text = str(exc) if isinstance(exc, PluginError) else f"{type(exc).__name__}: {exc}"
    cause = exc.cause if isinstance(exc, ServerError) else next(iter(text.splitlines()), None)
    plugin.ledger.add_startup(StartupRecord(profile=profile, kind="unknown", origin="launched", outcome="failed",
                                            host="", port=0, error=text, cause=cause))


@pytest.fixture(scope="session")
def sglang_results(request: pytest.FixtureRequest) -> ResultsView:
    """Every benchmark result of this session by profile: ``.get(profile, test)``, and
    ``.compare("eagle3", "baseline", "test_x", output_throughput="10%")`` in a test marked
    ``@pytest.mark.sglang_compare`` (such tests run after all others)."""
    return ResultsView(plugin_of(request.config))


@pytest.fixture
def sglang_bench(request: pytest.FixtureRequest, sglang_server: ServerHandle) -> BenchFixture:
    """``sglang_bench(num_requests=64, concurrency=None, request_rate=inf, input_len=128, output_len=128,
    api="completions"|"chat"|"generate" (through a fleet's router "generate"), warmup=1, seed=0, rounds=1, slo=None,
    cache="fresh"|"flush"|"warm", ...)``
    streams requests at the profile's server (``cache``: how its rounds meet the server's prefix cache,
    pytest_sglang.bench.cache) and returns a BenchResult named as sglang.bench_serving names its figures (see
    pytest_sglang.bench); ``sglang_bench.sweep(concurrency=[1, 4, 16], ...)`` returns the curve, and
    ``sglang_bench.search_slo(slo={"ttft_ms": 200}, concurrency=[...])`` the highest load meeting the SLO."""
    from pytest_sglang.bench.sweep import BenchFixture

    plugin = plugin_of(request.config)

    def bench(**kwargs: Any) -> BenchResult:
        return plugin.measure.run_bench(request, sglang_server, **kwargs)

    return BenchFixture(bench)


@pytest.fixture
def sglang_outputs(request: pytest.FixtureRequest, sglang_server: ServerHandle) -> Callable[..., list[Output]]:
    """``sglang_outputs(prompts=None, max_tokens=32)``: the greedy outputs (temperature 0) of ``prompts`` (text
    or token ids; default: a fixed set of 8, pytest_sglang.bench.outputs.DEFAULT_PROMPTS) from the profile's
    server, recorded for the session: ``sglang_results.compare_outputs("baseline", "eagle3")`` in a test marked
    ``sglang_compare`` compares two profiles'. Returns one Output (``text``, ``token_ids``) per prompt."""
    from pytest_sglang.bench.client import Client
    from pytest_sglang.bench.outputs import DEFAULT_PROMPTS, OutputSet, greedy_outputs

    plugin = plugin_of(request.config)

    def outputs(prompts: Sequence[str | Sequence[int]] | None = None, max_tokens: int = 32) -> list[Output]:
        with Client(sglang_server.base_url, api_key=sglang_server.api_key, timeout=600,
                    model=sglang_server.model) as client:
            got = greedy_outputs(client, sglang_server.kind, list(prompts or DEFAULT_PROMPTS),
                                 max_tokens=max_tokens, model=client.model())
        plugin.ledger.outputs.setdefault(sglang_server.profile, OutputSet(sglang_server.profile)).add(got)
        if plugin.shared is not None:
            from pytest_sglang.exchange import PublishedOutputs

            plugin.shared.results.publish(PublishedOutputs(sglang_server.profile, [o.to_dict() for o in got]))
        return got

    return outputs


@pytest.fixture
def sglang_ab(request: pytest.FixtureRequest) -> Callable[..., ABResult]:
    """``sglang_ab(num_requests=64, concurrency=16, input_len=128, output_len=128, rounds=10, warmup=1, ...)``
    in a test marked ``@pytest.mark.sglang_ab("main", "candidate")``: both profiles' servers alive, rounds
    interleaved A B B A ... after a warmup of each; returns an ABResult (``ratio``, ``ci``, ``p_value``,
    ``pairs``, ``rounds``) whose ``check(output_throughput="5%")`` judges the second against the first.
    ``together=False`` in the marker: one server at a time, first, second, first again (bracketing)."""
    plugin = plugin_of(request.config)
    first, second, together = _ab_marker(request)
    if plugin.settings.url:
        pytest.fail("sglang_ab launches both profiles' servers; --sglang-url attaches to one running server. Run "
                    "the A/B tests without --sglang-url.", pytrace=False)
    selected = plugin.params()
    missing = [p for p in (first, second) if p not in selected]
    if missing:
        pytest.skip(f"A/B {first} vs {second}: profile {missing[0]!r} is not selected (selected: "
                    f"{', '.join(selected) or 'none'}); pass --sglang-profile="
                    f"{','.join(dict.fromkeys([*selected, first, second]))} to run it")
    if plugin.shared is not None:  # a skip, not a failure: the rest of an -n run is still worth its green
        pytest.skip("sglang_ab does not run under pytest-xdist yet (both servers of a pair must be alive in one "
                    "process and its rounds must not share the machine with other workers' load): run the A/B "
                    "tests in a pytest call without -n (e.g. `pytest -m sglang_ab`).")

    if together:  # started here, in setup, so that neither startup counts against the test's --timeout
        try:
            plugin.pool.acquire([first, second])
        except PluginError as exc:
            fail_with(exc)

    def ab(**kwargs: Any) -> ABResult:
        return plugin.measure.run_ab(request, plugin.pool, (first, second), together, kwargs)

    return ab


def _ab_marker(request: pytest.FixtureRequest) -> tuple[str, str, bool]:
    marker = request.node.get_closest_marker("sglang_ab")
    usage = 'mark the test @pytest.mark.sglang_ab("main", "candidate") (the reference profile first)'
    if marker is None:
        pytest.fail(f"the sglang_ab fixture needs to know which two profiles to compare: {usage}", pytrace=False)
    args, together = marker.args, marker.kwargs.get("together", True)
    unknown = set(marker.kwargs) - {"together"}
    if len(args) != 2 or not all(isinstance(a, str) and a for a in args) or args[0] == args[1] or unknown:
        pytest.fail(f"@pytest.mark.sglang_ab takes two different profile names and together=True|False, got "
                    f"args {args!r}, kwargs {marker.kwargs!r}: {usage}", pytrace=False)
    if not isinstance(together, bool):
        pytest.fail(f"@pytest.mark.sglang_ab(..., together=...) must be True or False, got {together!r}",
                    pytrace=False)
    return args[0], args[1], together


class BaselineFixture:
    """The ``sglang_baseline`` fixture: ``check(result, output_throughput="5%", median_ttft_ms="10%")``."""

    def __init__(self, request: pytest.FixtureRequest, plugin: SGLangPlugin) -> None:
        self._request = request
        self._plugin = plugin

    @property
    def updating(self) -> bool:
        return self._plugin.measure.checker.update

    def check(self, result: object, **tolerances: str | float) -> Comparison:
        """Compare ``result`` (of sglang_bench, or sglang_server for startup_seconds) with the baseline of
        this profile, test and machine; fails the test on a regression. Tolerances: "5%" or an absolute
        amount. Under --sglang-update-baseline it records instead."""
        return self._plugin.measure.check(self._request, result, tolerances)


@pytest.fixture
def sglang_baseline(request: pytest.FixtureRequest) -> BaselineFixture:
    """``sglang_baseline.check(result, output_throughput="5%")``: direction-aware regression check against
    the committed baseline file; records instead under --sglang-update-baseline."""
    return BaselineFixture(request, plugin_of(request.config))
