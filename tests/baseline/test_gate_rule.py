"""The one gate (baseline/gate.py): its order, how outcomes sum, a check's status as a gate, and that the
baseline checks, the A/B checks, the JSON report's summary and the HTML page all sum with it."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_sglang.baseline import gate_of
from pytest_sglang.baseline.engine import compare_ab
from pytest_sglang.baseline.gate import ORDER, STATUS_GATE, combine, rank, worst
from pytest_sglang.report.build import _gate_summary
from pytest_sglang.report.html import _check_badge


def test_the_order_is_regressed_then_not_judged_then_recorded_then_passed() -> None:
    assert ORDER == ("regressed", "not-judged", "recorded", "passed")
    assert worst(["passed", "recorded", None, "not-judged"]) == "not-judged"
    assert worst(["passed", "recorded"]) == "recorded" and worst([None, None]) is None and worst([]) is None
    assert rank(None) > rank("passed")


def test_combine_keeps_the_reasons_of_the_worst_gate_only() -> None:
    assert combine([("passed", None), ("regressed", "tok/s down 9%"), ("not-judged", "noisy"),
                    ("regressed", "ttft up 12%")]) == ("regressed", "tok/s down 9%; ttft up 12%")
    assert combine([("passed", None)]) == ("passed", None) and combine([]) == (None, None)


def test_every_check_status_has_its_gate() -> None:
    assert STATUS_GATE == {"ok": "passed", "improved": "passed", "regressed": "regressed", "missing": "regressed",
                           "not-judged": "not-judged", "no-baseline": "not-judged"}


def test_a_baseline_check_and_an_ab_check_sum_alike() -> None:
    """gate_of sums a benchmark's comparisons, whatever made them: here an A/B that regressed beside one that
    could not be made (a metric no round measured)."""
    samples = {"output_throughput": ([100.0] * 6, [80.0] * 6)}
    slower = compare_ab("main", "cand", samples, {"output_throughput": "5%"})
    unmade = compare_ab("main", "cand", samples, {"median_itl_ms": "5%"})
    assert slower.gate == "regressed" and unmade.gate == "not-judged" and unmade.failed
    gate, reason = gate_of(None, [unmade, slower])
    assert gate == "regressed" and reason is not None and "output_throughput" in reason
    assert gate_of(SimpleNamespace(failed=3), [slower])[0] == "not-judged"  # failed requests: nothing judged


def test_the_reports_summary_and_the_html_badges_use_the_same_rule() -> None:
    bench = {"test_id": "t.py::test_x", "nodeid": "t.py::test_x[p]", "result": {}}
    profiles = {"p": {"benchmarks": [{**bench, "gate": "recorded", "gate_reason": None},
                                     {**bench, "gate": "passed", "gate_reason": None}], "gate": None}}
    assert _gate_summary(profiles)["status"] == "passed"  # recordings are counted, not judged
    profiles["p"]["benchmarks"].append({**bench, "gate": "not-judged", "gate_reason": "too noisy"})
    summary = _gate_summary(profiles)
    assert summary["status"] == "not-judged" and summary["not_judged"][0]["reason"] == "too noisy"
    assert _gate_summary({"p": {"benchmarks": [{**bench, "gate": "recorded"}], "gate": None}})["status"] is None
    assert "verdict-regressed" in _check_badge("missing") and "missing" in _check_badge("missing")
    assert "verdict-not-judged" in _check_badge("no-baseline") and "verdict-passed" in _check_badge("improved")
