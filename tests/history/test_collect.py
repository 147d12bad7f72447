"""A session's report as the run the history appends: keys as the baseline's, every round, and benchmarks whose
figures say nothing about the server (failed requests, client-bound) left out with their reason."""

from __future__ import annotations

from pytest_sglang.bench import BenchResult
from pytest_sglang.history.collect import run_of, workload_of
from pytest_sglang.report import build_report
from pytest_sglang.session import SessionLedger


def _result(tok_s: list[float], **fields: object) -> BenchResult:
    rounds = [BenchResult(num_requests=8, max_concurrency=4, input_len=32, output_len=16, output_throughput=v,
                          median_ttft_ms=10.0 + i, completed=8) for i, v in enumerate(tok_s)]
    return BenchResult(num_requests=8, max_concurrency=4, input_len=32, output_len=16, completed=8,
                       output_throughput=sorted(tok_s)[len(tok_s) // 2], median_ttft_ms=11.0, num_rounds=len(tok_s),
                       rounds=rounds, **fields)


def test_a_report_becomes_one_run_and_unusable_figures_are_left_out_with_why() -> None:
    ledger = SessionLedger()
    ledger.server_versions["p"] = "sglang 0.5.23"
    ledger.add_bench("p", "t.py::test_ok", "t.py::test_ok[p]", _result([98.0, 100.0, 103.0]), "box | sglang 0.5.23")
    ledger.add_bench("p", "t.py::test_failing", "t.py::test_failing[p]", _result([50.0, 51.0, 52.0], failed=2))
    ledger.add_bench("p", "t.py::test_client", "t.py::test_client[p]",
                     _result([70.0, 71.0, 72.0], client_bound=True, client_bound_reason="client busy 97% of the time"))
    run, skipped = run_of(build_report(ledger), commit="abc", time=5.0, exit_status=1,
                          machine_of=lambda version: f"this machine | {version}")
    (bench,) = run.benchmarks
    assert (run.commit, run.time, run.exit_status) == ("abc", 5.0, 1)
    assert (bench.profile, bench.test, bench.machine, bench.server_version) == ("p", "t.py::test_ok",
                                                                                "box | sglang 0.5.23", "sglang 0.5.23")
    assert bench.rounds["output_throughput"] == [98.0, 100.0, 103.0]
    assert bench.rounds["median_ttft_ms"] == [10.0, 11.0, 12.0]
    assert "completed" not in bench.rounds and "failed" not in bench.rounds
    assert bench.workload == workload_of(build_report(ledger)["profiles"]["p"]["benchmarks"][0]["result"])
    assert "input_len=32" in bench.workload and "rounds=3" in bench.workload
    assert skipped == [{"profile": "p", "test": "t.py::test_failing", "reason": "2 of 10 requests failed"},
                       {"profile": "p", "test": "t.py::test_client", "reason": "client busy 97% of the time"}]


def test_a_benchmark_without_its_machine_key_gets_this_machine_s() -> None:
    ledger = SessionLedger()
    ledger.server_versions["p"] = "vllm 0.11"
    ledger.add_bench("p", "t.py::test_ok", "t.py::test_ok[p]", _result([1.0, 2.0]))
    run, _ = run_of(build_report(ledger), commit=None, time=0.0, exit_status=0,
                    machine_of=lambda version: f"this machine | {version}")
    assert run.benchmarks[0].machine == "this machine | vllm 0.11"
