"""A metric's figure, or its per-round samples, read from whatever a check is given."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from pytest_sglang.bench.metric_table import METRICS
from pytest_sglang.bench.result import BenchResult
from pytest_sglang.errors import BaselineError


def _read(result: Any, metric: str) -> Any:
    """A BenchResult's figure by the metric table; a mapping's by key (its list of samples gives their median);
    anything else (a server handle's ``startup_seconds``, a test's stand-in) by the attribute of that name."""
    if isinstance(result, Mapping):
        value = result.get(metric)
        if isinstance(value, (list, tuple)):
            value = statistics.median(value) if value else None
        return value
    entry = METRICS.get(metric)
    if isinstance(result, BenchResult):
        return entry.read(result) if entry is not None else result.figure(metric)
    return getattr(result, metric, None)


def metric_value(result: Any, metric: str) -> float | None:
    """``result.metric`` or ``result[metric]``: a BenchResult, a server handle, or a mapping (None if absent;
    a mapping's list of samples gives their median); BaselineError if it is not a number."""
    value = _read(result, metric)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise BaselineError(f"{metric} of {type(result).__name__} is {value!r}, not a number") from None


def metric_samples(result: Any, metric: str) -> list[float] | None:
    """The per-round values of ``metric``: a BenchResult's rounds (``result.samples``), a mapping's list, or
    the one figure; None if absent."""
    if isinstance(result, Mapping) and isinstance(result.get(metric), (list, tuple)):
        return [float(v) for v in result[metric]] or None
    if isinstance(result, BenchResult) and len(result.rounds) > 1:
        return result.samples(metric) or None
    rounds = getattr(result, "rounds", None)
    sampler = getattr(result, "samples", None)
    if not isinstance(result, BenchResult) and isinstance(rounds, list) and len(rounds) > 1 and callable(sampler):
        values = sampler(metric)
        return [float(v) for v in values] or None
    value = metric_value(result, metric)
    return None if value is None else [value]
