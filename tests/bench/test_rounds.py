"""Rounds: N runs of the workload after one warmup, medians as the headline, the spread of each figure; goodput
under SLOs; the simulator's per-round jitter."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import pytest

from pytest_sglang.bench import BenchResult, RequestRecord, Spread, combine_rounds, compute_metrics, run_bench
from pytest_sglang.bench.runner import _run_coroutine
from pytest_sglang.errors import BenchmarkError
from pytest_sglang.sim.config import KnobError, load_knobs

from .simproc import run_sim


def rec(start: float, ttft: float, gap: float, out: int, *, ok: bool = True) -> RequestRecord:
    latency = ttft + gap * (out - 1)
    return RequestRecord(ok=ok, start=start, latency=latency, ttft=ttft, itls=[gap] * (out - 1), input_tokens=8,
                         output_tokens=out if ok else 0, chunks=out, server_counted=True,
                         status=None if ok else 500, error=None if ok else "boom")


def one_round(pace: float, *, failed: int = 0) -> BenchResult:
    records = [rec(0.0, 0.01, 1 / pace, 10) for _ in range(4)]
    records += [rec(0.0, 0.01, 0.01, 1, ok=False) for _ in range(failed)]
    return compute_metrics(records, num_requests=4 + failed)


def test_headline_is_the_median_of_the_rounds_and_failures_add_up() -> None:
    rounds = [one_round(100), one_round(80, failed=1), one_round(120)]
    head = combine_rounds(rounds)
    assert head.num_rounds == 3 and head.rounds == rounds
    tputs = [r.output_throughput for r in rounds]
    assert head.output_throughput == statistics.median(tputs)
    assert head.median_itl_ms == statistics.median(r.median_itl_ms for r in rounds)
    assert head.failed == 1 and not head.ok
    assert head.first_failure is not None and head.first_failure["round"] == 1
    assert head.completed == 4  # the median round's count, not the sum
    sp = head.spread["output_throughput"]
    assert (sp.n, sp.min, sp.max) == (3, min(tputs), max(tputs))
    assert sp.cv_pct == pytest.approx(statistics.stdev(tputs) / statistics.fmean(tputs) * 100)
    assert head.samples("output_throughput") == tputs
    d = head.to_dict()
    assert d["num_rounds"] == 3 and len(d["rounds"]) == 3 and "rounds" not in d["rounds"][0]
    assert d["spread"]["output_throughput"]["cv_pct"] == pytest.approx(sp.cv_pct)


def test_one_round_is_todays_result() -> None:
    only = one_round(100)
    head = combine_rounds([only])
    assert head.output_throughput == only.output_throughput and head.completed == only.completed
    assert head.spread["output_throughput"] == Spread(1, only.output_throughput, only.output_throughput, 0.0, None,
                                                      only.output_throughput, only.output_throughput)
    assert head.samples("output_throughput") == [only.output_throughput]
    assert "rounds" not in head.to_dict()


def test_goodput_counts_requests_meeting_every_limit_per_second() -> None:
    records = [rec(0.0, 0.010, 0.005, 11), rec(0.0, 0.030, 0.005, 11), rec(0.0, 0.010, 0.020, 11),
               rec(0.0, 0.010, 0.005, 11, ok=False)]
    r = compute_metrics(records, slo={"ttft_ms": 20, "tpot_ms": 10})
    assert r.slo_attainment == pytest.approx(1 / 4)  # only the first meets both; the failed one never counts
    assert r.goodput == pytest.approx(1 / r.duration)
    assert compute_metrics(records).goodput is None


def test_rounds_on_the_simulator_share_one_warmup_and_jitter_per_round(tmp_path: Path) -> None:
    # 6 tok/s: a loaded runner's client lag (20 to 40-odd ms p90) stays under the client-bound bar (half of the
    # 167 ms a token, at the least: the jitter's fastest round)
    with run_sim(tmp_path, {"decode_tok_s": 6, "ttft_ms": 5, "jitter": 0.4}) as server:
        r = run_bench(server, num_requests=3, concurrency=3, input_len=4, output_len=3, warmup=1, rounds=4,
                      slo={"ttft": 1000, "tpot": 1000})
    assert r.num_rounds == 4 and len(r.rounds) == 4 and len(r.requests) == 12
    assert all(x.completed == 3 for x in r.rounds) and r.failed == 0
    assert r.output_throughput == statistics.median(x.output_throughput for x in r.rounds)
    sp = r.spread["output_throughput"]
    assert sp.max / sp.min > 1.02, [x.output_throughput for x in r.rounds]  # each round drew its own pace
    assert r.goodput is not None and r.slo_attainment == 1.0
    assert r.client_busy is not None and 0 <= r.client_busy < 1 and not r.client_bound


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_rounds_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(BenchmarkError, match="rounds must be an integer"):
        run_bench("http://127.0.0.1:9", rounds=bad)  # type: ignore[arg-type]


def test_slo_keys_are_checked() -> None:
    with pytest.raises(BenchmarkError, match="slo key 'itl' unknown"):
        run_bench("http://127.0.0.1:9", slo={"itl": 5})


def test_jitter_knob_is_a_fraction() -> None:
    assert load_knobs('{"jitter": 0.05}').jitter == 0.05
    for bad in ("1.0", "-0.1", '"x"'):
        with pytest.raises(KnobError, match="jitter"):
            load_knobs(f'{{"jitter": {bad}}}')


def test_an_error_inside_the_benchmark_loop_is_not_chained_to_a_missing_event_loop() -> None:
    async def failing() -> None:
        raise BenchmarkError("the round broke")

    async def inside_a_loop() -> None:  # pytest-asyncio's case: the benchmark runs in a thread of its own
        _run_coroutine(failing)

    for run in (lambda: _run_coroutine(failing), lambda: asyncio.run(inside_a_loop())):
        with pytest.raises(BenchmarkError, match="the round broke") as caught:
            run()
        assert caught.value.__context__ is None, repr(caught.value.__context__)
