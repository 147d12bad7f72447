"""Baselines that know session-to-session noise: the file keeps the last 20 recording sessions' medians, and
with 5 or more a check judges the new session against their prediction interval (t quantiles in pure Python)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pytest_sglang.baseline.checks import Check, compare
from pytest_sglang.baseline.store import SESSIONS_KEPT, BaselineStore
from pytest_sglang.errors import BaselineError
from pytest_sglang.machine.facts import Machine
from pytest_sglang.stats.inference import SessionSpread, t_cdf, t_quantile

M = Machine(name="8x NVIDIA H200", driver="580.82", server="sglang 0.5.2")
T = "tests/test_perf.py::test_throughput"
# Ten sessions of one unchanged server whose sessions differ by about 15 % (CV), 100 tok/s in the middle.
SESSIONS = [100.0, 118.0, 86.0, 104.0, 79.0, 112.0, 95.0, 131.0, 90.0, 101.0]


@pytest.mark.parametrize(("p", "df", "table"), [(0.975, 1, 12.706), (0.975, 9, 2.262), (0.95, 4, 2.132),
                                                (0.95, 19, 1.729), (0.99, 30, 2.457), (0.5, 7, 0.0)])
def test_t_quantiles_match_the_tables(p: float, df: int, table: float) -> None:
    assert t_quantile(p, df) == pytest.approx(table, abs=5e-4)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)
    assert t_cdf(-t_quantile(p, df), df) == pytest.approx(1 - p, abs=1e-9)


def test_the_prediction_bounds_hold_an_unchanged_session_with_the_confidence() -> None:
    spread = SessionSpread.of(SESSIONS)
    low, high = spread.bounds(0.95)
    assert low < min(SESSIONS) < max(SESSIONS) < high * 1.1
    assert spread.p_below(low) == pytest.approx(0.05) and spread.p_above(high) == pytest.approx(0.05)
    assert spread.center == pytest.approx(math.exp(sum(map(math.log, SESSIONS)) / len(SESSIONS)))
    assert 14 < spread.cv_pct < 16


def store_with_sessions(tmp_path: Path, sessions: list[float], metric: str = "output_throughput") -> BaselineStore:
    store = BaselineStore(tmp_path / "b.json")
    for value in sessions:
        store.record("p", T, M, {metric: [value * 0.99, value, value * 1.01]})
    return store


def test_each_recording_appends_one_session_and_the_file_keeps_the_last_twenty(tmp_path: Path) -> None:
    store = store_with_sessions(tmp_path, [float(v) for v in range(1, SESSIONS_KEPT + 6)])
    data = json.loads(store.path.read_text())
    entry = data["baselines"]["p"][T][M.key]
    assert data["version"] == 3
    assert entry["sessions"]["output_throughput"] == [float(v) for v in range(6, SESSIONS_KEPT + 6)]
    assert entry["metrics"]["output_throughput"] == SESSIONS_KEPT + 5  # the latest session's median
    assert BaselineStore(store.path).lookup("p", T, M).sessions_of("output_throughput")[-1] == SESSIONS_KEPT + 5


def test_a_version_2_file_loads_its_figure_as_one_session(tmp_path: Path) -> None:
    path = tmp_path / "v2.json"
    path.write_text(json.dumps({"format": "pytest-sglang-baselines", "version": 2, "baselines": {"p": {T: {
        M.key: {"metrics": {"output_throughput": 90.0}, "samples": {"output_throughput": [89.0, 90.0, 91.0]}}}}}}))
    comp = compare({"output_throughput": [88.0, 89.0, 90.0]}, {"output_throughput": "5%"}, store=BaselineStore(path),
                   profile="p", test_id=T, machine=M)
    (check,) = comp.checks
    assert check.method == "mann-whitney" and check.sessions == 1
    assert "session noise not yet known (1 of 5 sessions)" in check.message


def test_bad_sessions_are_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"format": "pytest-sglang-baselines", "version": 3, "baselines": {"p": {"t": {
        "m": {"metrics": {"output_throughput": 1.0}, "sessions": {"output_throughput": ["fast"]}}}}}}))
    with pytest.raises(BaselineError, match=r"sessions\.output_throughput is \['fast'\], not a non-empty list"):
        BaselineStore(path).load()


def check(store: BaselineStore, value: float, tolerance: str = "10%", metric: str = "output_throughput") -> Check:
    comp = compare({metric: [value * 0.99, value, value * 1.01]}, {metric: tolerance}, store=store, profile="p",
                   test_id=T, machine=M)
    (one,) = comp.checks
    return one


def test_with_four_sessions_the_rounds_judge_and_the_message_says_the_session_noise_is_unknown(tmp_path: Path
                                                                                                ) -> None:
    store = store_with_sessions(tmp_path, SESSIONS[:4])
    one = check(store, 80.0)
    assert one.status == "regressed" and one.method == "mann-whitney" and one.sessions == 4
    assert "session noise not yet known (4 of 5 sessions)" in one.message


def test_with_ten_sessions_their_spread_judges_an_unchanged_slow_session_ok_and_half_the_pace_regressed(
        tmp_path: Path) -> None:
    store = store_with_sessions(tmp_path, SESSIONS)
    slow_but_usual = check(store, 80.0)  # 20 % under the middle: past the tolerance, within the session noise
    assert slow_but_usual.status == "ok" and slow_but_usual.method == "sessions"
    assert slow_but_usual.sessions == 10 and slow_but_usual.baseline_rounds == 10
    assert "-20.4% within the tolerance plus the session noise (session noise: CV 15.3% over 10 past sessions" in \
        slow_but_usual.message
    low, high = slow_but_usual.ci_pct
    assert low < -20 < 20 < high
    half = check(store, 50.0)
    assert half.status == "regressed" and half.p_value < 0.05 and half.change_pct == pytest.approx(-50, abs=1)
    assert half.message.startswith("output_throughput regressed 50.") and "beyond the tolerance and the session " \
        "noise" in half.message
    assert check(store, 200.0).status == "improved"


def test_a_latency_that_doubles_regresses_and_the_record_carries_the_sessions(tmp_path: Path) -> None:
    store = store_with_sessions(tmp_path, [40.0 * v / 100 for v in SESSIONS], metric="median_ttft_ms")
    doubled = check(store, 80.0, metric="median_ttft_ms")
    assert doubled.status == "regressed" and doubled.change_pct > 90
    assert check(store, 44.0, metric="median_ttft_ms").status == "ok"
    assert doubled.to_dict()["sessions"] == 10 and doubled.to_dict()["method"] == "sessions"


PERF = """
def test_throughput(sglang_server, sglang_bench, sglang_baseline):
    r = sglang_bench(num_requests=4, concurrency=4, input_len=8, output_len=3, warmup=1, rounds=3)
    sglang_baseline.check(r, output_throughput="10%", max_cv="off")
"""


def test_real_recordings_append_sessions_and_the_check_names_the_session_noise(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_SGLANG_MACHINE", "test-machine")
    pytester.makefile(".toml", pyproject='[tool.pytest_sglang.profiles.p]\nmodel = "sim-model"\n'
                                         # 4 tok/s: never client-bound on a loaded runner (the bar is
                                         # half the time per token, 125 ms, against a lag of 20 to 40-odd ms)
                                         "sim = { startup_seconds = 0.3, decode_tok_s = 4, ttft_ms = 5 }\n")
    pytester.makepyfile(test_perf=PERF)
    path = pytester.path / ".sglang-baselines.json"

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-profile=p", "--sglang-sim", *args,
                                             timeout=120)

    run("--sglang-update-baseline").assert_outcomes(passed=1)
    data = json.loads(path.read_text())
    (entry,) = data["baselines"]["p"]["test_perf.py::test_throughput"].values()
    measured = entry["sessions"]["output_throughput"][0]
    entry["sessions"]["output_throughput"] = [measured * f for f in (1.2, 0.85, 1.05, 0.9, 1.1)]
    path.write_text(json.dumps(data))
    run("--sglang-update-baseline").assert_outcomes(passed=1)
    (entry,) = json.loads(path.read_text())["baselines"]["p"]["test_perf.py::test_throughput"].values()
    assert len(entry["sessions"]["output_throughput"]) == 6
    report = pytester.path / "report.json"
    run(f"--sglang-report={report}").assert_outcomes(passed=1)
    view = json.loads(report.read_text())["profiles"]["p"]["benchmarks"][0]["baseline"]["output_throughput"]
    assert view["status"] == "ok" and view["method"] == "sessions" and view["sessions"] == 6
    assert view["baseline_rounds"] == 6 and view["baseline_cv_pct"] > 5
