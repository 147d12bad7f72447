"""The report's figures as junitxml properties: headline metrics, baseline checks, gates."""

from __future__ import annotations

from collections.abc import Iterable

from pytest_sglang.baseline import Comparison, gate_of
from pytest_sglang.bench import BenchResult

# The figures shown per benchmark in the tables and recorded as junitxml properties.
HEADLINE = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "median_e2e_latency_ms",
            "accept_length", "goodput")


def junit_properties(result: BenchResult, comparisons: Iterable[Comparison] = ()) -> list[tuple[str, object]]:
    """A benchmark's figures as junitxml properties; ``sglang_gate`` when its requests failed."""
    props: list[tuple[str, object]] = [(f"sglang_{m}", getattr(result, m)) for m in HEADLINE
                                       if getattr(result, m) is not None]
    props += [("sglang_completed", result.completed), ("sglang_failed", result.failed)]
    if result.num_rounds > 1:
        props.append(("sglang_rounds", result.num_rounds))
        spread = result.spread.get("output_throughput")
        if spread is not None and spread.cv_pct is not None:
            props.append(("sglang_output_throughput_cv_pct", round(spread.cv_pct, 2)))
    if result.client_bound:
        props.append(("sglang_client_bound", True))
    comps = list(comparisons)
    for comp in comps:
        props += check_properties(comp)
    if result.failed and not comps:
        gate, reason = gate_of(result, [])
        props += [("sglang_gate", gate), ("sglang_gate_reason", reason)]
    return props


def check_properties(comp: Comparison) -> list[tuple[str, object]]:
    """One ``check()`` as junitxml properties: each checked metric's baseline, and the gate with its reason."""
    props: list[tuple[str, object]] = [(f"sglang_baseline_{c.metric}", c.baseline) for c in comp.checks
                                       if c.baseline is not None]
    props.append(("sglang_gate", comp.gate))
    if comp.gate_reason:
        props.append(("sglang_gate_reason", comp.gate_reason))
    return props


def startup_failure_properties(reason: str) -> list[tuple[str, object]]:
    """A test that could not run because its server did not start: not judged, not regressed."""
    return [("sglang_gate", "not-judged"), ("sglang_gate_reason", f"the server could not start: {reason}")]


# ---- HTML ------------------------------------------------------------------------------------------------

