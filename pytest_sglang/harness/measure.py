"""A session's measurements: run a benchmark against a server and record it (in the ledger, and for the other
pytest-xdist workers), check a figure against its stored baseline, run an A/B pair's rounds, and the server label
that is part of a baseline's machine key. Failures are typed errors; the plugin makes them a test's outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_sglang.errors import BaselineError, CheckFailedError, NotRunError
from pytest_sglang.harness.node import TestRef

if TYPE_CHECKING:
    from pytest_sglang.baseline import BaselineChecker, Comparison
    from pytest_sglang.baseline.ab import ABResult
    from pytest_sglang.baseline.engine import ABComparison
    from pytest_sglang.bench import BenchResult
    from pytest_sglang.harness.history import SessionHistory
    from pytest_sglang.harness.pool import ServerPool
    from pytest_sglang.harness.settings import Settings
    from pytest_sglang.server import ServerHandle
    from pytest_sglang.server.shared import SharedServers
    from pytest_sglang.session import SessionLedger


class Measurements:
    """The session's benchmarks and baseline checks, recorded in its ledger."""

    def __init__(self, settings: Settings, ledger: SessionLedger, shared: SharedServers | None,
                 history: SessionHistory, fingerprints: dict[str, str]) -> None:
        self.settings = settings
        self.history = history
        self.ledger = ledger
        self.shared = shared
        self._checker: BaselineChecker | None = None
        self.checked = False  # a baseline check ran in this session
        self.server_fingerprints = fingerprints  # profile -> its launch plan's (the Planner's), for A/A runs

    @property
    def checker(self) -> BaselineChecker:
        if self._checker is None:
            from pytest_sglang.baseline import DEFAULT_FILENAME, BaselineChecker, BaselineStore
            from pytest_sglang.machine.facts import run_commit

            s = self.settings
            self._checker = BaselineChecker(
                BaselineStore(s.baseline_path or s.rootdir / DEFAULT_FILENAME), update=s.update_baseline,
                strict=s.baseline_strict, commit=run_commit(s.rootdir), gate_defaults=s.gate_defaults,
                fail_not_judged=s.fail_not_judged)
        return self._checker

    def server_label(self, server: ServerHandle) -> str | None:
        """``"sglang 0.5.2"``: part of the machine fingerprint; asked of the server once per profile."""
        if server.profile not in self.ledger.server_versions:
            from pytest_sglang.bench.client import Client

            with Client(server.base_url, api_key=server.api_key, timeout=30) as client:
                version = client.version()
            self.ledger.server_versions[server.profile] = f"{server.kind} {version}" if version else server.kind
        return self.ledger.server_versions[server.profile]

    def run_bench(self, test: TestRef, server: ServerHandle, **kwargs: Any) -> BenchResult:
        from pytest_sglang.bench import run_bench
        from pytest_sglang.errors import BenchmarkFailedError
        from pytest_sglang.report import junit_properties

        label = self.server_label(server)
        machine_key = (server.machine(label) or self.checker.machine(label)).key
        test_id = test.test_id(server.profile)
        try:
            result = run_bench(server, **kwargs)
        except BenchmarkFailedError as exc:
            if exc.result is not None:
                self.ledger.add_bench(server.profile, test_id, test.nodeid, exc.result, machine_key)
                test.properties.extend(junit_properties(exc.result))  # sglang_gate: not-judged
            server.check_alive(wait=5.0)  # requests that failed as the server died: report the death
            raise
        if result.connection_errors:
            server.check_alive(wait=5.0)
        self.ledger.add_bench(server.profile, test_id, test.nodeid, result, machine_key)
        if self.shared is not None:
            from pytest_sglang.exchange import PublishedBench

            self.shared.results.publish(PublishedBench(server.profile, test_id, test.nodeid,
                                                       result.to_dict()))
        test.properties.extend(junit_properties(result))
        return result

    def check(self, test: TestRef, result: object, tolerances: dict[str, str | float],
              server: ServerHandle | None = None) -> Comparison:
        """``result`` (a benchmark's, or ``server`` itself for its startup_seconds) against its baseline; a
        CheckFailedError on a regression."""
        profile = getattr(result, "profile", None) or getattr(server, "profile", None)
        if not profile:
            raise BaselineError("sglang_baseline.check() needs a result of sglang_bench or the sglang_server handle")
        if server is not None and result is server and getattr(server, "startup_seconds", 0.0) is None:
            raise NotRunError(f"profile {profile!r}: this run did not start the server (--sglang-url), so it has no "
                              "startup time to check or record")
        label = self.server_label(server) if server is not None else self.ledger.server_versions.get(profile)
        self.checked = True
        test_id = test.test_id(profile)
        machine = (server.machine(label) if server is not None else None) or self.checker.machine(label)
        past = self.history.past_runs(result, profile=profile, test_id=test_id, machine=machine.key)
        comp = self.checker.check(result, tolerances, profile=profile, test_id=test_id, server=label,
                                  machine=machine, history=past)
        entries = [b for b in self.ledger.entries_for(test.nodeid) if b.result is result]
        if entries:
            entries[-1].comparisons.append(comp)  # its notes reach the summary through the report
        else:
            self.ledger.startup_checks.append(comp)
            self.ledger.notes.extend(f"{test.nodeid}: {n}" for n in comp.notes)
        from pytest_sglang.report import check_properties

        test.properties.extend(check_properties(comp))  # baselines, sglang_gate and its reason
        if comp.failed:
            raise CheckFailedError(comp.failure_message())
        return comp

    def run_ab(self, test: TestRef, pool: ServerPool, pair: tuple[str, str], together: bool,
               kwargs: dict[str, Any]) -> ABResult:
        """``sglang_ab(**workload, rounds=N, warmup=W)``: both profiles' rounds, interleaved with both servers
        alive (or bracketed, one at a time), recorded for the report; its ``check`` fails the test."""
        from pytest_sglang.baseline.ab import run_bracketed, run_interleaved, workload_of
        from pytest_sglang.baseline.checks import gate_options
        from pytest_sglang.bench import run_bench
        from pytest_sglang.errors import BenchmarkFailedError
        from pytest_sglang.report import ab_properties

        rounds, warmup = kwargs.get("rounds", 10), kwargs.get("warmup", 1)
        workload = workload_of(kwargs)
        first, second = pair
        confidence, max_cv = gate_options(self.settings.gate_defaults)
        gate = {"confidence": confidence, "max_cv_pct": max_cv}
        live: dict[str, ServerHandle] = {}
        machine_keys: dict[str, str] = {}  # profile -> where its rounds ran (each side's server version)

        def switch(profile: str) -> None:
            live.clear()
            live[profile] = pool.acquire([profile])[0]

        def run_round(profile: str, warm: int) -> BenchResult:
            server = live[profile]
            if profile not in machine_keys:
                label = self.server_label(server)
                machine_keys[profile] = (server.machine(label) or self.checker.machine(label)).key
            try:
                return run_bench(server, warmup=warm, profile=profile, **workload)
            except BenchmarkFailedError:
                for handle in live.values():
                    handle.check_alive(wait=5.0)  # requests that failed as a server died: report the death
                raise

        def pair_started() -> None:
            from pytest_sglang.bench.cache import PROMPT_SETS

            PROMPT_SETS.align(handle.base_url for handle in live.values())  # cache="fresh": one prompt set a pair

        if together:
            live.update(zip(pair, pool.acquire(pair), strict=True))
            result = run_interleaved(first, second, run_round, rounds=rounds, warmup=warmup,
                                     pair_started=pair_started, **gate)
        else:
            result = run_bracketed(first, second, run_round, rounds=rounds, warmup=warmup, switch=switch, **gate)
        key = self._instance_noise(result, {**workload, "rounds": rounds,
                                            **({} if together else {"bracketed": True})},
                                   live.get(first) or next(iter(live.values())))
        result.on_check = lambda outcome: self._ab_checked(test, outcome)
        self.ledger.add_ab(test.nodeid, result, machine_keys=machine_keys, workload=key)
        test.properties.extend(ab_properties(result))
        return result

    def _instance_noise(self, result: ABResult, workload: dict[str, Any], server: ServerHandle) -> str:
        """Hand the A/B its recorded A/A runs (before this one is added); record this one if it is an A/A run
        under --sglang-update-baseline. Returns the workload's key (the history's too)."""
        from pytest_sglang.baseline.ab import aa_log_ratios, noise_hint
        from pytest_sglang.baseline.store import workload_key

        prints = [self.server_fingerprints.get(p) for p in (result.first, result.second)]
        result.same_server = prints[0] is not None and prints[0] == prints[1]
        key = workload_key(workload)
        label = self.server_label(server)
        machine = server.machine(label) or self.checker.machine(label)
        store = self.checker.store
        result.instance_noise = store.instance_noise(machine, key)
        result.noise_hint = noise_hint(result.first, key)
        if result.same_server and self.settings.update_baseline:
            store.record_instance_noise(machine, key, aa_log_ratios(result))
            self.ledger.notes.append(aa_recorded(result, store.instance_noise(machine, key), machine.key,
                                                 str(store.path)))
        return key

    def _ab_checked(self, test: TestRef, outcome: ABComparison) -> None:
        import warnings

        from pytest_sglang.baseline import NotJudgedWarning

        test.properties.extend([("sglang_gate", outcome.gate)] + (
            [("sglang_gate_reason", outcome.gate_reason)] if outcome.gate_reason else []))
        if outcome.failed:
            raise CheckFailedError(outcome.failure_message())
        if outcome.not_judged and self.settings.fail_not_judged:
            raise CheckFailedError("\n  ".join([f"{outcome.second} vs {outcome.first} could not be judged "
                                     "(--sglang-not-judged=fail makes this a failure):",
                                     *(j.message for j in outcome.not_judged)]))
        for judged in outcome.not_judged:
            warnings.warn(NotJudgedWarning(judged.message), stacklevel=3)


def aa_recorded(result: ABResult, stored: dict[str, list[float]], machine: str, path: str) -> str:
    """What recording an A/A run did: it was stored, and how many of its workload are stored now."""
    from pytest_sglang.baseline.engine import AA_RUNS_NEEDED

    count = max((len(v) for v in stored.values()), default=0)
    more = (f"; {AA_RUNS_NEEDED - count} more before they judge A/B checks of this workload" if count < AA_RUNS_NEEDED
            else "; they now judge A/B checks of this workload by their instance noise")
    return (f"A/A run {result.second} vs {result.first} stored: {count} A/A run{'s' if count != 1 else ''} of this "
            f"workload now stored for {machine} in {path}{more}")
