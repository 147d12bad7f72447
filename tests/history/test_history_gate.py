"""The history rule through real pytest runs on the simulator: a check on a run that sits after a step down
beyond its tolerance fails naming the run and commit the step began at, with no baseline file at all; an
xdist-free run that sits before any step passes and says what its history could have seen."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers import profile_toml

from pytest_sglang.history.store import BenchRecord, HistoryStore, RunRecord

CHECKED = '''
def test_tok_s(sglang_server, sglang_bench, sglang_baseline):
    r = sglang_bench(num_requests=4, concurrency=4, input_len=8, output_len=16, warmup=0, rounds=2)
    sglang_baseline.check(r, output_throughput="5%")
'''


def project(pytester: pytest.Pytester, mark: str, decode_tok_s: int) -> None:
    pytester.makefile(".toml", pyproject="[tool.pytest.ini_options]\n" + profile_toml(
        "p", mark, sim=f"startup_seconds = 0.2, decode_tok_s = {decode_tok_s}, ttft_ms = 5"))
    pytester.makepyfile(test_bench=CHECKED)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-profile=p", "--sglang-sim", *args,
                                         timeout=120)


def copies(first: RunRecord, factors: list[float], commits: list[str]) -> list[RunRecord]:
    """Runs like ``first`` (the same series: profile, test, machine, workload) at ``factors`` of its figures."""
    (bench,) = first.benchmarks
    return [RunRecord(commit=c, time=first.time + i + 1, benchmarks=(replace(bench, rounds={
        m: [v * f for v in values] for m, values in bench.rounds.items()}),))
        for i, (f, c) in enumerate(zip(factors, commits, strict=True))]


def test_a_run_after_a_step_down_fails_its_check_naming_where_the_step_began(
        pytester: pytest.Pytester, mark: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_SGLANG_MACHINE", "hist-gate")
    monkeypatch.setenv("PYTEST_SGLANG_COMMIT", "c0001")
    history, report = pytester.path / "h.sqlite", pytester.path / "report.json"
    project(pytester, mark, decode_tok_s=400)
    first = run(pytester, f"--sglang-history={history}", f"--sglang-report={report}")
    first.assert_outcomes(passed=1)  # no baseline and one run of history: nothing to judge against yet
    checks = json.loads(report.read_text())["profiles"]["p"]["benchmarks"][0]["baseline"]
    assert checks["output_throughput"]["status"] == "no-baseline"

    with HistoryStore.open(history) as store:
        (row,) = [r for r in store.rows(["output_throughput"])]
        stored = RunRecord(commit=row.commit, time=row.time, benchmarks=(BenchRecord(
            row.profile, row.test, row.machine, row.workload, {"output_throughput": list(row.rounds)}),))
        # four more runs at that speed, then four at half of it from commit c0006 on
        for again in copies(stored, [1.01, 0.99, 1.0, 1.02, 0.5, 0.51, 0.49, 0.5],
                            [f"c{i:04d}" for i in range(2, 10)]):
            store.append(again)

    project(pytester, mark, decode_tok_s=200)  # this run sits after the step too
    monkeypatch.setenv("PYTEST_SGLANG_COMMIT", "c0010")
    after = run(pytester, f"--sglang-history={history}", f"--sglang-report={report}")
    after.assert_outcomes(failed=1)
    after.stdout.fnmatch_lines(["*output_throughput stepped down *% at run 6 (commit c0006, p=*): * before, * since, "
                                "this run * (tolerance 5%; 10 runs of history*"])
    check = json.loads(report.read_text())["profiles"]["p"]["benchmarks"][0]["baseline"]["output_throughput"]
    assert check["status"] == "regressed" and check["method"] == "history"


def test_a_run_without_a_step_passes_and_says_what_its_history_could_have_seen(
        pytester: pytest.Pytester, mark: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_SGLANG_MACHINE", "hist-gate")
    history, report = pytester.path / "h.sqlite", pytester.path / "report.json"
    project(pytester, mark, decode_tok_s=400)
    run(pytester, f"--sglang-history={history}").assert_outcomes(passed=1)
    with HistoryStore.open(history) as store:
        (row,) = [r for r in store.rows(["output_throughput"])]
        stored = RunRecord(commit=row.commit, time=row.time, benchmarks=(BenchRecord(
            row.profile, row.test, row.machine, row.workload, {"output_throughput": list(row.rounds)}),))
        for again in copies(stored, [1.01, 0.99, 1.0, 1.02, 0.98, 1.0], ["x"] * 6):
            store.append(again)
    result = run(pytester, f"--sglang-history={history}", f"--sglang-report={report}")
    result.assert_outcomes(passed=1)
    check = json.loads(report.read_text())["profiles"]["p"]["benchmarks"][0]["baseline"]["output_throughput"]
    assert check["status"] == "no-baseline" and check["history"] is not None
    assert check["history"].startswith("output_throughput: no step in 8 runs of history")
