"""ABResult and the A/B schedules, without servers: the order, the ratios, the gate options of check()."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_sglang.baseline.ab import ABResult, balanced_order, run_bracketed, run_interleaved
from pytest_sglang.errors import BenchmarkError


def fake_round(pace: dict[str, float]):
    calls: list[tuple[str, int]] = []

    def run(profile: str, warmup: int) -> SimpleNamespace:
        calls.append((profile, warmup))
        tok_s = pace[profile] * (1 + 0.001 * len(calls))
        return SimpleNamespace(output_throughput=tok_s, median_itl_ms=1000.0 / tok_s, completed=8)

    return run, calls


def test_balanced_order_alternates_which_side_goes_first() -> None:
    assert balanced_order("a", "b", 4) == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_interleaved_warms_each_side_then_pairs_rounds() -> None:
    run, calls = fake_round({"main": 100.0, "cand": 90.0})
    r = run_interleaved("main", "cand", run, rounds=6, warmup=2)
    assert calls[:2] == [("main", 2), ("cand", 2)] and all(w == 0 for _, w in calls[2:])
    assert r.pairs == 6 and r.order == balanced_order("main", "cand", 6)
    assert r.ratio["output_throughput"] == pytest.approx(0.9, abs=0.01)
    assert r.ratio["median_itl_ms"] == pytest.approx(1 / 0.9, abs=0.01)
    assert r.check(output_throughput="5%").gate == "regressed"
    assert r.judge(output_throughput="5%", confidence="101%").errors == [
        "confidence must be at least 50% and below 100% (e.g. 95% or 99.9%), got '101%'"]
    assert r.to_dict()["checks"][0]["gate"] == "regressed"  # check() records, judge() does not


def test_bracketed_runs_first_second_first_and_measures_the_drift() -> None:
    run, calls = fake_round({"main": 100.0, "cand": 95.0})
    switched: list[str] = []
    r = run_bracketed("main", "cand", run, rounds=6, warmup=1, switch=switched.append)
    assert switched == ["main", "cand", "main"]
    assert [p for p, _ in calls] == ["main"] * 3 + ["cand"] * 6 + ["main"] * 3
    assert r.drift_pct == pytest.approx(0.9, abs=0.2) and not r.together


def test_rounds_must_be_a_whole_number() -> None:
    run, _ = fake_round({"a": 1.0, "b": 1.0})
    with pytest.raises(BenchmarkError, match="whole number of pairs >= 1, got 0"):
        run_interleaved("a", "b", run, rounds=0, warmup=0)
    assert isinstance(ABResult("a", "b", {"a": [], "b": []}, []).ratio, dict)


def test_an_energy_check_where_no_gpu_was_measured_is_not_judged_and_says_why() -> None:
    from pytest_sglang.bench.metrics import BenchResult

    why = "no GPU source: nvidia-ml-py is not installed and nvidia-smi is not on PATH"

    def run(profile: str, warmup: int) -> BenchResult:
        return BenchResult(output_throughput=100.0, completed=8, gpu_unmeasured=why)

    r = run_interleaved("main", "cand", run, rounds=6, warmup=0)
    outcome = r.check(output_throughput="5%", energy_per_output_token_j="5%")
    energy = next(j for j in outcome.judgements if j.metric == "energy_per_output_token_j")
    assert energy.status == "not-judged" and energy.reason == why and why in energy.message
    assert outcome.errors == [] and outcome.gate == "not-judged" and why in (outcome.gate_reason or "")
    assert r.to_dict()["checks"][0]["checks"][1]["ratio"] is None  # null in the JSON report, never NaN
    assert r.check(gpu_energy_jj="5%").errors  # a metric that is no figure at all is still an error
