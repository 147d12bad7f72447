"""The fixtures: ``sglang_server``, ``sglang_bench``, ``sglang_outputs``, ``sglang_baseline``, ``sglang_results``,
``sglang_ab``.

Registered through the package (its ``pytest_plugins``); each is a call of the session's Harness, its errors made
the test's outcome (nodes.as_outcome).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sglang.errors import PluginError
from pytest_sglang.harness import Harness, TestRef
from pytest_sglang.plugin import plugin_of
from pytest_sglang.plugin.nodes import as_outcome, fail_with

if TYPE_CHECKING:
    from pytest_sglang.baseline import Comparison
    from pytest_sglang.baseline.ab import ABResult
    from pytest_sglang.baseline.engine import ABComparison
    from pytest_sglang.bench import BenchResult
    from pytest_sglang.bench.outputs import Output, OutputComparison
    from pytest_sglang.bench.sweep import BenchFixture
    from pytest_sglang.harness.results import Results
    from pytest_sglang.server import ServerHandle

TEARDOWN_LOOK_SECONDS = 0.5  # a process SIGKILLed a moment ago can still poll as running for a few ms


def _harness(request: pytest.FixtureRequest) -> Harness:
    return plugin_of(request.config).harness


def _test_of(request: pytest.FixtureRequest) -> TestRef:
    """The requesting test as the harness records it: its node id, and its junit properties list."""
    return TestRef(request.node.nodeid, request.node.user_properties)


class ResultsView:
    """The ``sglang_results`` fixture: the session's benchmark results, with a test's semantics. A profile
    that did not run skips with the reason; a failed comparison fails with its message alone."""

    def __init__(self, results: Results) -> None:
        self._results = results

    @property
    def profiles(self) -> list[str]:
        return self._results.profiles

    def find(self, profile: str, test: str) -> BenchResult | None:
        return self._results.find(profile, test)

    def get(self, profile: str, test: str) -> BenchResult:
        with as_outcome():
            return self._results.get(profile, test)

    def compare(self, better: str, other: str, test: str, **margins: str | float) -> dict[str, float]:
        """Fail unless profile ``better`` beats ``other`` on ``test`` by each margin (e.g.
        ``output_throughput="10%"``); returns the signed changes in percent (positive: ``better`` is better)."""
        with as_outcome():
            return self._results.compare(better, other, test, **margins)

    def compare_outputs(self, profile_a: str, profile_b: str, *, allow_differing: int = 0,
                        tie_margin: float = 0.0) -> OutputComparison:
        """Fail unless the greedy outputs that ``sglang_outputs`` recorded under both profiles are equal (see
        pytest_sglang.harness.results.Results.compare_outputs for the margins)."""
        with as_outcome():
            return self._results.compare_outputs(profile_a, profile_b, allow_differing=allow_differing,
                                                 tie_margin=tie_margin)


@pytest.fixture(scope="session")
def sglang_server(request: pytest.FixtureRequest) -> Generator[ServerHandle, None, None]:
    """A ready server for the current profile (session scope, one per --sglang-profile, one alive at a time).

    Attributes: base_url, host, port, profile, startup_seconds, phases, log_path, pid, url(path), check_alive().
    """
    harness = _harness(request)
    param = getattr(request, "param", None)
    if param is None:
        try:
            known = ", ".join(sorted(harness.profiles().profiles)) or "none defined"
        except PluginError:
            known = "see --sglang-config or pyproject.toml"
        pytest.skip(f"no server selected: pass --sglang-profile=NAME (known: {known}) or --sglang-url=URL")
    try:
        server = harness.open_server(param)
    except PluginError as exc:
        fail_with(exc)  # any other exception is not one of ours: its traceback is the diagnosis
    harness.adopt(server)  # an A/B test of this profile uses it rather than launching another
    try:
        yield server
    finally:
        # a death no test was failed for (in the last test, or just before a test's check): the run fails here
        unseen = harness.let_go(server, look=TEARDOWN_LOOK_SECONDS)
    if unseen is not None:
        fail_with(unseen)


@pytest.fixture(scope="session")
def sglang_results(request: pytest.FixtureRequest) -> ResultsView:
    """Every benchmark result of this session by profile: ``.get(profile, test)``, and
    ``.compare("eagle3", "baseline", "test_x", output_throughput="10%")`` in a test marked
    ``@pytest.mark.sglang_compare`` (such tests run after all others)."""
    return ResultsView(_harness(request).results)


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

    harness, test = _harness(request), _test_of(request)

    def bench(**kwargs: Any) -> BenchResult:
        with as_outcome(deaths=False):
            return harness.bench(sglang_server, test=test, **kwargs)

    return BenchFixture(bench)


@pytest.fixture
def sglang_outputs(request: pytest.FixtureRequest, sglang_server: ServerHandle) -> Callable[..., list[Output]]:
    """``sglang_outputs(prompts=None, max_tokens=32)``: the greedy outputs (temperature 0) of ``prompts`` (text
    or token ids; default: a fixed set of 8, pytest_sglang.bench.outputs.DEFAULT_PROMPTS) from the profile's
    server, recorded for the session: ``sglang_results.compare_outputs("baseline", "eagle3")`` in a test marked
    ``sglang_compare`` compares two profiles'. Returns one Output (``text``, ``token_ids``) per prompt."""
    harness = _harness(request)

    def outputs(prompts: Sequence[str | Sequence[int]] | None = None, max_tokens: int = 32) -> list[Output]:
        return harness.outputs(sglang_server, prompts, max_tokens)

    return outputs


@pytest.fixture
def sglang_ab(request: pytest.FixtureRequest) -> Callable[..., ABResult]:
    """``sglang_ab(num_requests=64, concurrency=16, input_len=128, output_len=128, rounds=10, warmup=1, ...)``
    in a test marked ``@pytest.mark.sglang_ab("main", "candidate")``: both profiles' servers alive, rounds
    interleaved A B B A ... after a warmup of each; returns an ABResult (``ratio``, ``ci``, ``p_value``,
    ``pairs``, ``rounds``) whose ``check(output_throughput="5%")`` judges the second against the first.
    ``together=False`` in the marker: one server at a time, first, second, first again (bracketing)."""
    harness = _harness(request)
    first, second, together = _ab_marker(request)
    if harness.settings.url:
        pytest.fail("sglang_ab launches both profiles' servers; --sglang-url attaches to one running server. Run "
                    "the A/B tests without --sglang-url.", pytrace=False)
    selected = harness.selected()
    missing = [p for p in (first, second) if p not in selected]
    if missing:
        pytest.skip(f"A/B {first} vs {second}: profile {missing[0]!r} is not selected (selected: "
                    f"{', '.join(selected) or 'none'}); pass --sglang-profile="
                    f"{','.join(dict.fromkeys([*selected, first, second]))} to run it")
    if harness.shared is not None:  # a skip, not a failure: the rest of an -n run is still worth its green
        pytest.skip("sglang_ab does not run under pytest-xdist yet (both servers of a pair must be alive in one "
                    "process and its rounds must not share the machine with other workers' load): run the A/B "
                    "tests in a pytest call without -n (e.g. `pytest -m sglang_ab`).")
    if together:  # started here, in setup, so that neither startup counts against the test's --timeout
        with as_outcome():
            harness.pool.acquire([first, second])

    def ab(**kwargs: Any) -> ABResult:
        with as_outcome():
            result = harness.ab(first, second, together=together, test=_test_of(request), **kwargs)
        judge = result.on_check

        def check_in_test(outcome: ABComparison) -> None:
            with as_outcome():
                if judge is not None:
                    judge(outcome)

        result.on_check = check_in_test
        return result

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

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._harness = _harness(request)

    @property
    def updating(self) -> bool:
        return self._harness.measure.checker.update

    def check(self, result: object, **tolerances: str | float) -> Comparison:
        """Compare ``result`` (of sglang_bench, or sglang_server for startup_seconds) with the baseline of
        this profile, test and machine; fails the test on a regression. Tolerances: "5%" or an absolute
        amount. Under --sglang-update-baseline it records instead."""
        server = None
        if not (hasattr(result, "base_url") and hasattr(result, "startup_seconds")) \
                and "sglang_server" in self._request.fixturenames:
            server = self._request.getfixturevalue("sglang_server")
        with as_outcome(deaths=False):
            return self._harness.check(result, test=_test_of(self._request), server=server, **tolerances)


@pytest.fixture
def sglang_baseline(request: pytest.FixtureRequest) -> BaselineFixture:
    """``sglang_baseline.check(result, output_throughput="5%")``: direction-aware regression check against
    the committed baseline file; records instead under --sglang-update-baseline."""
    return BaselineFixture(request)
