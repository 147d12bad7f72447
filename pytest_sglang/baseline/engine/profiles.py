"""Profile comparisons (``sglang_results.compare``): one profile's figures against another's, each with the
margin by which it must be better."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_sglang.baseline.directions import Tolerance, direction
from pytest_sglang.baseline.engine.figures import metric_samples, metric_value
from pytest_sglang.baseline.engine.judgement import Judgement
from pytest_sglang.baseline.engine.rounds import judge
from pytest_sglang.errors import BaselineError

if TYPE_CHECKING:
    from pytest_sglang.bench.metrics import BenchResult


@dataclass
class ProfileComparison:
    """Whether profile ``better`` beat profile ``other`` on ``test`` by each metric's margin."""

    better: str
    other: str
    test: str
    judgements: list[Judgement] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # in the order the margins were given

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @property
    def changes(self) -> dict[str, float]:
        """metric -> the figure's own change, ``better`` vs ``other``, in % (``better``'s TTFT 25 % lower: -25)."""
        return {j.metric: j.change_pct for j in self.judgements}

    @property
    def gains(self) -> dict[str, float]:
        """metric -> the change signed so that positive means ``better`` is better (a lower TTFT: +25)."""
        return {j.metric: j.gain_pct for j in self.judgements}

    @property
    def message(self) -> str:
        if self.failed:
            return f"{self.better} does not beat {self.other} on {self.test}:\n  " + "\n  ".join(self.failures)
        return f"{self.better} beats {self.other} on {self.test}: " + "; ".join(j.message for j in self.judgements)


def compare_profiles(better: str, a: BenchResult, other: str, b: BenchResult, test: str,
                     margins: Mapping[str, str | float]) -> ProfileComparison:
    """Judge result ``a`` (profile ``better``) against ``b`` (profile ``other``) with each metric's margin
    ("10%" relative to ``b`` or an absolute amount; "0%": at least as good; none given: output_throughput
    "0%"). Raises nothing: a metric that cannot be compared (no value, unknown metric, malformed margin) is a
    failure named in the message."""
    outcome = ProfileComparison(better, other, test)
    for metric, raw in (margins or {"output_throughput": "0%"}).items():
        try:
            direction(metric)
            tol = Tolerance.parse(metric, raw)
            va, vb = metric_value(a, metric), metric_value(b, metric)
            if va is None or vb is None or math.isnan(va) or math.isnan(vb):
                outcome.failures.append(f"{metric}: {better}={va}, {other}={vb}: cannot compare")
                continue
            sa, sb = metric_samples(a, metric) or [va], metric_samples(b, metric) or [vb]
            j = judge(metric, sa, sb, tol, margin=True, current_label=better, reference_label=other)
        except BaselineError as exc:
            outcome.failures.append(f"{metric}: {exc}")
            continue
        outcome.judgements.append(j)
        if j.failed:
            outcome.failures.append(j.message)
    return outcome
