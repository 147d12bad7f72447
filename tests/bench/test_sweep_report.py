"""Sweeps (the curve, its knee, the highest load meeting an SLO) and the report's outcomes: which tests
regressed and which could not be judged, in the JSON report, the terminal, the step summary, HTML and junit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sglang.baseline import BaselineStore, Machine, compare
from pytest_sglang.bench import BenchResult, RequestRecord, combine_rounds, knee_index, search_slo, sweep
from pytest_sglang.errors import BenchmarkError
from pytest_sglang.report import build_report, html_page, junit_properties, markdown, terminal_lines
from pytest_sglang.server import StartupRecord
from pytest_sglang.session import SessionLedger

M = Machine(name="cpu: test (2 cores)", server="sglang 0.5.2")


def fake_server(concurrency: int = 1, request_rate: float = 0.0, slo: dict[str, float] | None = None,
                **_: Any) -> BenchResult:
    """A server that saturates at 4 in flight: throughput flattens, latency climbs past it."""
    load = concurrency or max(1.0, request_rate)
    latency = 0.1 * max(1.0, load / 4)
    reqs = [RequestRecord(ok=True, start=0.0, latency=latency, ttft=latency / 10, itls=[], input_tokens=8,
                          output_tokens=10, chunks=10, server_counted=True) for _ in range(8)]
    r = BenchResult(output_throughput=100.0 * min(load, 4) + load, median_e2e_latency_ms=latency * 1000,
                    median_ttft_ms=latency * 100, completed=8, requests=reqs, slo=slo)
    return combine_rounds([r])


def test_knee_is_where_throughput_stops_paying_for_latency() -> None:
    assert knee_index([10, 20, 40, 80, 160], [100, 190, 380, 400, 410]) == 2
    assert knee_index([10, 20, 30], [1, 2, 3]) is None  # a straight line has no bend
    assert knee_index([10, 20], [1, 2]) is None


def test_sweep_runs_each_load_lowest_first_and_tags_the_points() -> None:
    calls: list[int] = []

    def bench(**kw: Any) -> BenchResult:
        calls.append(kw["concurrency"])
        return fake_server(**kw)

    curve = sweep(bench, concurrency=[16, 1, 4, 8, 2], num_requests=8)
    assert calls == [1, 2, 4, 8, 16] and curve.values == [1, 2, 4, 8, 16]
    assert curve.at(4).sweep == {"param": "concurrency", "value": 4}
    knee = curve.knee()
    assert knee is not None and knee.sweep == {"param": "concurrency", "value": 4}
    assert curve.to_dict()["knee"] == 4
    best = curve.highest_meeting(e2el_ms=150)
    assert best is not None and best.sweep["value"] == 4  # 8 in flight: 200 ms
    assert curve.highest_meeting(e2el_ms=50) is None
    with pytest.raises(BenchmarkError, match="one of concurrency"):
        sweep(bench, concurrency=[1], request_rate=[1.0])


def test_search_slo_bisects_to_the_highest_load_meeting_it() -> None:
    probes: list[int] = []

    def bench(**kw: Any) -> BenchResult:
        probes.append(kw["concurrency"])
        return fake_server(**kw)

    found = search_slo(bench, slo={"e2el_ms": 260}, concurrency=list(range(1, 33)))
    assert found.best == 10 and found.result is not None and found.result.sweep["value"] == 10
    assert len(probes) <= 6 and found.result.slo == {"e2el_ms": 260.0}  # log2(32) + 1 probes, not 32
    assert found.to_dict()["best"] == 10
    assert search_slo(bench, slo={"e2el_ms": 10}, concurrency=[1, 2]).best is None


def _entry(ledger: SessionLedger, profile: str, test: str, result: BenchResult, comps: list[Any],
           outcome: str) -> None:
    b = ledger.add_bench(profile, f"t.py::{test}", f"t.py::{test}[{profile}]", result)
    b.comparisons.extend(comps)
    b.outcome = outcome


def test_the_report_tells_regressions_from_what_could_not_be_judged(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "b.json")
    base = [344.7, 343.1, 346.0, 342.5, 345.2]
    for test in ("test_slow", "test_noisy", "test_same"):
        store.record("p", f"t.py::{test}", M, {"output_throughput": base})

    def rounds(values: list[float], **extra: Any) -> BenchResult:
        out = []
        for v in values:
            r = BenchResult(output_throughput=v, completed=8, **extra)
            out.append(r)
        return combine_rounds(out)

    def check(test: str, result: BenchResult) -> Any:
        return compare(result, {"output_throughput": "5%"}, store=store, profile="p", test_id=f"t.py::{test}",
                       machine=M)

    ledger = SessionLedger()
    slow, noisy, same = rounds([v * 0.9 for v in base]), rounds([250.0, 400.0, 320.0, 200.0, 380.0]), rounds(base)
    _entry(ledger, "p", "test_slow", slow, [check("test_slow", slow)], "failed")
    _entry(ledger, "p", "test_noisy", noisy, [check("test_noisy", noisy)], "passed")
    _entry(ledger, "p", "test_same", same, [check("test_same", same)], "passed")
    broken = rounds([300.0], failed=2, first_failure={"index": 0, "status": 500, "error": "boom"})
    _entry(ledger, "p", "test_broken", broken, [], "failed")
    curve = sweep(fake_server, concurrency=[1, 2, 4, 8, 16])
    for point in curve:
        _entry(ledger, "p", "test_curve", point, [], "passed")
    ledger.add_startup(StartupRecord(profile="dead", kind="sglang", origin="launched", outcome="failed",
                                     host="127.0.0.1", port=1, error="boom", cause="RuntimeError: CUDA OOM"))
    report = json.loads(json.dumps(build_report(ledger, machine=M)))  # JSON-clean

    gates = {b["test_id"]: (b["gate"], b["gate_reason"]) for b in report["profiles"]["p"]["benchmarks"]}
    assert gates["t.py::test_slow"][0] == "regressed"
    assert gates["t.py::test_noisy"][0] == "not-judged" and "too noisy to judge: CV 27.4%" in gates[
        "t.py::test_noisy"][1]
    assert gates["t.py::test_same"] == ("passed", None)
    assert gates["t.py::test_broken"] == ("not-judged", "2 of 10 requests failed")
    assert gates["t.py::test_curve"] == (None, None)
    assert report["profiles"]["dead"]["gate"] == "not-judged"
    summary = report["gate"]
    assert summary["status"] == "regressed" and summary["passed"] == 1
    assert [r["test_id"] for r in summary["regressed"]] == ["t.py::test_slow"]
    assert {r["test_id"] for r in summary["not_judged"]} == {"t.py::test_noisy", "t.py::test_broken", "(server)"}
    view = report["profiles"]["p"]["benchmarks"][0]["baseline"]["output_throughput"]
    assert view["rounds"] == 5 and view["baseline_rounds"] == 5 and view["p_value"] < 0.01
    (curve_view,) = report["profiles"]["p"]["sweeps"]
    assert curve_view["param"] == "concurrency" and curve_view["knee"] == 4
    assert [p["value"] for p in curve_view["points"]] == [1, 2, 4, 8, 16]

    lines = terminal_lines(report)
    assert any(line.startswith("p sweep test_curve over concurrency, knee at concurrency=4: 1: ") for line in lines)
    assert "gate: 1 regressed, 3 not judged, 1 passed" in lines
    assert any(line.startswith("REGRESSED p t.py::test_slow: output_throughput regressed 10.0%") for line in lines)
    assert "NOT JUDGED dead (server): the server could not start: RuntimeError: CUDA OOM" in lines
    md = markdown(report)
    assert "**gate: 1 regressed, 3 not judged, 1 passed**" in md and "- NOT JUDGED p t.py::test_broken" in md
    assert "| gate |" in md.splitlines()[2] + md.splitlines()[4] and "test_curve @c=4" in md
    page = html_page(report)
    assert "test_curve over concurrency" in page and ">knee<" in page and "<polyline" in page
    props = dict(junit_properties(broken))
    assert props["sglang_gate"] == "not-judged" and props["sglang_gate_reason"] == "2 of 10 requests failed"


PLUGIN_TESTS = '''
def test_gate(sglang_bench, sglang_baseline):
    r = sglang_bench(num_requests=4, concurrency=4, input_len=8, output_len=6, rounds=3,
                     slo={"ttft_ms": 2000, "tpot_ms": 500})
    assert len(r.rounds) == 3 and r.goodput > 0
    sglang_baseline.check(r, output_throughput="50%", goodput="50%", max_cv="50%")


def test_curve(sglang_bench, sglang_baseline):
    curve = sglang_bench.sweep(concurrency=[1, 2, 4], num_requests=4, input_len=8, output_len=6)
    assert curve.values == [1, 2, 4]
    for point in curve:
        sglang_baseline.check(point, output_throughput="50%", max_cv="50%")
'''


def test_rounds_sweeps_and_gates_through_pytest(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_SGLANG_MACHINE", "test-machine")
    pytester.makefile(".toml", pyproject=(
        '[tool.pytest_sglang.profiles.p]\nmodel = "sim-model"\n'
        "sim = { startup_seconds = 0.3, decode_tok_s = 16, ttft_ms = 5 }\n"  # never client-bound when loaded
        '[tool.pytest_sglang.profiles.dead]\nmodel = "sim-model"\n'
        'sim = { startup_seconds = 0.6, fault = "exit" }\n'))
    pytester.makepyfile(test_perf=PLUGIN_TESTS)

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", *args, timeout=120)

    unrecorded = run("--sglang-profile=p", "--sglang-report=first.json")
    unrecorded.assert_outcomes(passed=2)
    notes = [line for line in unrecorded.outlines if line.startswith("note: no baseline")]
    assert notes == ["note: no baseline for 4 checks of p on test-machine in "
                     f"{pytester.path / '.sglang-baselines.json'} (test_gate, test_curve @c=1, test_curve @c=2, "
                     "test_curve @c=4); run with --sglang-update-baseline to record them"], unrecorded.outlines
    assert "baseline</text>" not in (pytester.path / "first.html").read_text(), "no baseline: no line to explain"
    run("--sglang-profile=p", "--sglang-update-baseline").assert_outcomes(passed=2)
    data = json.loads((pytester.path / ".sglang-baselines.json").read_text())
    tests = data["baselines"]["p"]
    assert set(tests) == {"test_perf.py::test_gate", "test_perf.py::test_curve@concurrency=1",
                          "test_perf.py::test_curve@concurrency=2", "test_perf.py::test_curve@concurrency=4"}
    (entry,) = tests["test_perf.py::test_gate"].values()
    assert len(entry["samples"]["output_throughput"]) == 3 and "goodput" in entry["samples"]

    report = pytester.path / "report.json"
    out = run("--sglang-profile=p,dead", f"--sglang-report={report}", "--junitxml=junit.xml")
    out.assert_outcomes(passed=2, errors=2)
    out.stdout.fnmatch_lines(["*gate: 0 regressed, 1 not judged, 4 passed*",
                              "NOT JUDGED dead (server): the server could not start: *"])
    data = json.loads(report.read_text())
    bench = data["profiles"]["p"]["benchmarks"][0]
    assert bench["gate"] == "passed" and bench["result"]["num_rounds"] == 3
    assert bench["baseline"]["output_throughput"]["method"] == "mann-whitney"
    assert data["profiles"]["p"]["sweeps"][0]["param"] == "concurrency"
    page = report.with_suffix(".html").read_text()
    assert "<polyline" in page and "output throughput (tok/s); dashed line: the stored baseline</text>" in page
    junit = (pytester.path / "junit.xml").read_text()
    assert 'name="sglang_gate" value="passed"' in junit and 'name="sglang_rounds" value="3"' in junit
    assert 'name="sglang_gate" value="not-judged"' in junit  # the tests whose server could not start
