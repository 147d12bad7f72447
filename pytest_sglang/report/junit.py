"""The report's figures as junitxml properties: headline metrics, baseline checks, gates."""

from __future__ import annotations

from collections.abc import Iterable

from pytest_sglang.baseline import Comparison, gate_of
from pytest_sglang.baseline.ab import ABResult
from pytest_sglang.bench import BenchResult
from pytest_sglang.bench.metrics import GPU_FIGURES, SERVER_FIGURES

# The figures shown per benchmark in the tables and recorded as junitxml properties (where not None).
HEADLINE = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "median_e2e_latency_ms",
            "accept_length", "goodput", *GPU_FIGURES, *SERVER_FIGURES)


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


def ab_properties(result: ABResult) -> list[tuple[str, object]]:
    """An A/B result as junitxml properties: the pair, the pairs, each ratio and its interval."""
    props: list[tuple[str, object]] = [("sglang_ab", f"{result.second} vs {result.first}"),
                                       ("sglang_ab_pairs", result.pairs)]
    for metric, ratio in result.ratio.items():
        props.append((f"sglang_ab_ratio_{metric}", round(ratio, 4)))
        ci = result.ci.get(metric)
        if ci:
            props.append((f"sglang_ab_ci_{metric}", f"{ci[0]:.4f}-{ci[1]:.4f}"))
    if result.drift_pct is not None:
        props.append(("sglang_ab_drift_pct", round(result.drift_pct, 2)))
    return props


# ---- HTML ------------------------------------------------------------------------------------------------

