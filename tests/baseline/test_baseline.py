"""Baseline store and comparisons: every direction, tolerances, the one engine and its sign, profile comparisons,
corrupt files, concurrent writers."""

from __future__ import annotations

import json
import math
import multiprocessing
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pytest_sglang.baseline import (
    BaselineStore,
    Machine,
    Tolerance,
    compare,
    compare_profiles,
    detect_machine,
    direction,
    judge,
)
from pytest_sglang.bench import BenchResult
from pytest_sglang.errors import BaselineError, ProfileComparisonError

M = Machine(name="8x NVIDIA RTX PRO 6000", driver="580.82", server="sglang 0.5.2")
T = "tests/test_perf.py::test_tp"


def store_with(tmp_path: Path, metrics: dict[str, float], machine: Machine = M) -> BaselineStore:
    store = BaselineStore(tmp_path / ".sglang-baselines.json")
    store.record("eagle3", T, machine, metrics, commit="abc1234",
                 when=datetime(2026, 11, 30, 10, 0, tzinfo=timezone.utc))
    return BaselineStore(store.path)  # a fresh reader, as the next session would be


def test_directions() -> None:
    for m in ("output_throughput", "input_throughput", "request_throughput", "total_throughput",
              "accept_length"):
        assert direction(m) == "higher"
    for m in ("median_ttft_ms", "p99_itl_ms", "mean_e2e_latency_ms", "median_tpot_ms", "startup_seconds",
              "duration", "failed"):
        assert direction(m) == "lower"
    with pytest.raises(BaselineError, match="no direction known"):
        direction("bogus")


def test_tolerance_parsing() -> None:
    assert Tolerance.parse("x_ms", "5%") == Tolerance(5.0, True)
    assert Tolerance.parse("x_ms", "2.5 %") == Tolerance(2.5, True)
    assert Tolerance.parse("x_ms", 3) == Tolerance(3.0, False)
    assert Tolerance.parse("x_ms", "3") == Tolerance(3.0, False)
    for bad in ("five", "-5%", True, None):
        with pytest.raises(BaselineError):
            Tolerance.parse("x_ms", bad)  # type: ignore[arg-type]


def test_throughput_regression_message(tmp_path: Path) -> None:
    store = store_with(tmp_path, {"output_throughput": 89.5})
    comp = compare({"output_throughput": 83.9}, {"output_throughput": "5%"}, store=store, profile="eagle3",
                   test_id=T, machine=M)
    assert comp.failed
    assert comp.failure_message() == (
        "output_throughput regressed 6.3% (one sample a side: judged by the tolerance alone): 83.9 tok/s vs "
        "baseline 89.5 tok/s (tolerance 5%; profile eagle3, 8x NVIDIA RTX PRO 6000, recorded 2026-11-30 at "
        "abc1234; session noise not yet known (1 of 5 sessions))")


@pytest.mark.parametrize(
    ("metric", "base", "now", "tol", "status"),
    [
        ("output_throughput", 100.0, 96.0, "5%", "ok"),  # slower, within
        ("output_throughput", 100.0, 94.0, "5%", "regressed"),  # slower, past
        ("output_throughput", 100.0, 104.0, "5%", "ok"),  # faster, within
        ("output_throughput", 100.0, 106.0, "5%", "improved"),  # faster, past: passes with a note
        ("median_ttft_ms", 40.0, 43.0, "10%", "ok"),
        ("median_ttft_ms", 40.0, 45.0, "10%", "regressed"),  # latency up is worse
        ("median_ttft_ms", 40.0, 30.0, "10%", "improved"),  # latency down is better
        ("startup_seconds", 100.0, 121.0, "20%", "regressed"),
        ("startup_seconds", 100.0, 119.0, "20%", "ok"),
        ("accept_length", 3.2, 2.9, "5%", "regressed"),
        ("accept_length", 3.2, 3.2, "0%", "ok"),
        ("median_itl_ms", 10.0, 12.5, 2, "regressed"),  # absolute tolerance: 2 ms
        ("median_itl_ms", 10.0, 11.5, 2, "ok"),
    ],
)
def test_every_direction(tmp_path: Path, metric: str, base: float, now: float, tol: object, status: str) -> None:
    store = store_with(tmp_path, {metric: base})
    comp = compare({metric: now}, {metric: tol}, store=store, profile="eagle3", test_id=T, machine=M)  # type: ignore[dict-item]
    (check,) = comp.checks
    assert check.status == status, check.message
    assert comp.failed == (status == "regressed")
    if status == "regressed":
        assert "regressed" in check.message and metric in check.message
    if status == "improved":
        assert any("--sglang-update-baseline" in n for n in comp.notes)


@pytest.mark.parametrize(
    ("metric", "reference", "current", "status", "change"),
    [
        ("startup_seconds", 100.0, 147.4, "regressed", 47.4),  # 47 % slower: the figure grew, the word says worse
        ("output_throughput", 100.0, 94.0, "regressed", -6.0),  # 6 % lower: the figure fell, worse
        ("median_ttft_ms", 40.0, 30.0, "improved", -25.0),  # latency down: the figure fell, better
        ("output_throughput", 100.0, 110.0, "improved", 10.0),
        ("output_throughput", 0.0, 5.0, "improved", math.inf),
    ],
)
def test_change_pct_is_the_change_of_the_figure_itself(metric: str, reference: float, current: float,
                                                       status: str, change: float) -> None:
    j = judge(metric, current, reference, Tolerance(5.0, True))
    assert j.status == status and j.failed == (status == "regressed")
    assert j.change_pct == pytest.approx(change)
    assert j.gain_pct == pytest.approx(change if direction(metric) == "higher" else -change)


def test_baseline_check_signs_agree_with_the_figure(tmp_path: Path) -> None:
    store = store_with(tmp_path, {"startup_seconds": 10.0, "median_ttft_ms": 40.0})
    comp = compare({"startup_seconds": 14.74, "median_ttft_ms": 41.0}, {"startup_seconds": "20%",
                   "median_ttft_ms": "10%"}, store=store, profile="eagle3", test_id=T, machine=M)
    startup, ttft = comp.checks
    assert startup.status == "regressed" and startup.change_pct == pytest.approx(47.4)
    assert startup.message.startswith("startup_seconds regressed 47.4% (one sample a side: judged by the "
                                      "tolerance alone): 14.7 s vs baseline 10.0 s")
    assert ttft.status == "ok" and ttft.change_pct == pytest.approx(2.5)
    assert ttft.message.startswith("median_ttft_ms +2.5% within tolerance (one sample a side: judged by the "
                                   "tolerance alone): 41.0 ms vs baseline 40.0 ms")


def test_margins_are_the_same_engine_in_the_other_direction() -> None:
    # a margin is how much better the candidate must be; a tolerance how much worse it may be
    assert judge("output_throughput", 105.0, 100.0, Tolerance(10.0, True), margin=True).failed
    assert not judge("output_throughput", 110.0, 100.0, Tolerance(10.0, True), margin=True).failed
    assert not judge("median_ttft_ms", 40.0, 40.0, Tolerance(0.0, True), margin=True).failed  # "0%": as good
    assert judge("median_ttft_ms", 40.1, 40.0, Tolerance(0.0, True), margin=True).failed


def _result(**figures: float | None) -> BenchResult:
    return BenchResult(**figures)


def test_compare_profiles_changes_gains_and_messages() -> None:
    fast = _result(output_throughput=150.0, median_ttft_ms=30.0)
    slow = _result(output_throughput=100.0, median_ttft_ms=40.0)
    ok = compare_profiles("eagle3", fast, "base", slow, "test_x", {"output_throughput": "40%", "median_ttft_ms": 2})
    assert not ok.failed
    assert ok.changes == pytest.approx({"output_throughput": 50.0, "median_ttft_ms": -25.0})  # the figures' own
    assert ok.gains == pytest.approx({"output_throughput": 50.0, "median_ttft_ms": 25.0})  # positive: eagle3 better
    bad = compare_profiles("eagle3", fast, "base", slow, "test_x", {"output_throughput": "60%"})
    assert bad.failed and bad.message == (
        "eagle3 does not beat base on test_x:\n  output_throughput: eagle3 150.0 tok/s vs base 100.0 tok/s "
        "(+50.0%, higher is better); needed a margin of 60%")
    assert compare_profiles("a", fast, "b", slow, "t", {}).changes == pytest.approx({"output_throughput": 50.0})


def test_compare_profiles_raises_nothing() -> None:
    a, b = _result(output_throughput=1.0, accept_length=None), _result(output_throughput=1.0, accept_length=2.0)
    out = compare_profiles("a", a, "b", b, "t", {"accept_length": "0%", "bogus": "5%",
                                                 "output_throughput": "five"})
    assert out.failed and out.changes == {}
    lines = out.message.splitlines()[1:]
    assert lines[0] == "  accept_length: a=None, b=2.0: cannot compare"
    assert "no direction known for metric 'bogus'" in lines[1]
    assert "tolerance for output_throughput must be like '5%'" in lines[2]


def test_session_results_compare_keeps_its_return_meaning() -> None:
    from pytest_sglang.session import SessionLedger

    results = SessionLedger()
    results.add_bench("eagle3", "t.py::test_x", "t.py::test_x[eagle3]", _result(median_ttft_ms=30.0))
    results.add_bench("base", "t.py::test_x", "t.py::test_x[base]", _result(median_ttft_ms=40.0))
    assert results.compare("eagle3", "base", "test_x", median_ttft_ms="10%") == pytest.approx(
        {"median_ttft_ms": 25.0})  # positive: eagle3 is better
    with pytest.raises(ProfileComparisonError, match=r"base does not beat eagle3 on test_x:\n  median_ttft_ms: "
                       r"base 40\.0 ms vs eagle3 30\.0 ms \(\+33\.3%, lower is better\); needed a margin of 0%"):
        results.compare("base", "eagle3", "test_x", median_ttft_ms="0%")


def test_no_baseline_passes_with_a_note_unless_strict(tmp_path: Path) -> None:
    other = Machine(name="1x NVIDIA H200", driver="570", server="sglang 0.5.2")
    store = store_with(tmp_path, {"output_throughput": 50.0}, machine=other)
    comp = compare({"output_throughput": 10.0}, {"output_throughput": "5%"}, store=store, profile="eagle3",
                   test_id=T, machine=M)
    assert not comp.failed
    assert comp.checks[0].status == "no-baseline"
    assert "--sglang-update-baseline" in comp.notes[0] and "1x NVIDIA H200" in comp.notes[0]
    strict = compare({"output_throughput": 10.0}, {"output_throughput": "5%"}, store=store, profile="eagle3",
                     test_id=T, machine=M, strict=True)
    assert strict.failed and "no baseline for output_throughput" in strict.failure_message()


def test_missing_current_value_fails(tmp_path: Path) -> None:
    store = store_with(tmp_path, {"accept_length": 3.2})
    comp = compare({"accept_length": None}, {"accept_length": "5%"}, store=store, profile="eagle3", test_id=T,
                   machine=M)
    assert comp.failed and "accept_length regressed" in comp.failure_message()


def test_update_records_merges_and_keeps_other_entries(tmp_path: Path) -> None:
    store = store_with(tmp_path, {"output_throughput": 89.5})
    comp = compare({"median_ttft_ms": 41.0, "output_throughput": 90.0}, {"median_ttft_ms": "10%"},
                   store=store, profile="eagle3", test_id=T, machine=M, update=True, commit="def5678",
                   also_record=["output_throughput"])
    assert comp.recorded and not comp.failed
    data = json.loads(store.path.read_text())
    entry = data["baselines"]["eagle3"][T][M.key]
    assert entry["metrics"] == {"median_ttft_ms": 41.0, "output_throughput": 90.0}
    assert entry["commit"] == "def5678" and entry["machine"] == M.name
    assert data["format"] == "pytest-sglang-baselines" and data["version"] == 3
    assert entry["samples"] == {"median_ttft_ms": [41.0], "output_throughput": [90.0]}
    assert entry["server"] == "sglang 0.5.2" and entry["driver"] == "580.82"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", "invalid JSON at line 1 column 2"),
        ("", "empty"),
        ("[]", "top level is a list"),
        ('{"format": "pytest-sglang-baselines", "version": 1, "baselines": {"p": {"t": {"m": {"metrics": '
         '{"output_throughput": "fast"}}}}}}', "not a number"),
        ('{"format": "other", "version": 1, "baselines": {}}', '"format"'),
    ],
)
def test_corrupt_file_is_a_clear_error_and_never_overwritten(tmp_path: Path, content: str, words: str) -> None:
    path = tmp_path / ".sglang-baselines.json"
    path.write_text(content)
    store = BaselineStore(path)
    with pytest.raises(BaselineError, match="broken") as info:
        compare({"output_throughput": 1.0}, {"output_throughput": "5%"}, store=store, profile="p", test_id="t",
                machine=M)
    assert words in str(info.value) and str(path) in str(info.value)
    with pytest.raises(BaselineError, match=words.split()[0]):
        compare({"output_throughput": 1.0}, {"output_throughput": "5%"}, store=BaselineStore(path),
                profile="p", test_id="t", machine=M, update=True)
    assert path.read_text() == content
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def _writer(path: str, i: int) -> None:
    store = BaselineStore(path)
    for j in range(5):
        store.record("p", f"test_{i}", M, {"output_throughput": float(i * 10 + j)})


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), i)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    data = json.loads(path.read_text())
    tests = data["baselines"]["p"]
    assert sorted(tests) == [f"test_{i}" for i in range(6)]
    for i in range(6):
        assert tests[f"test_{i}"][M.key]["metrics"]["output_throughput"] == i * 10 + 4


def test_machine_detection_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    m = detect_machine("sglang 0.5.2")
    assert m.name and m.key.endswith("sglang 0.5.2")
    monkeypatch.setenv("PYTEST_SGLANG_MACHINE", "ci-runner-8xh200")
    assert detect_machine().name == "ci-runner-8xh200"
