"""The one comparison engine: a candidate figure judged against a reference figure, direction-aware.

:func:`judge` serves both kinds of comparison. A baseline check (checks.py) judges this run's figure
against its stored baseline with a *tolerance*: how much worse it may be. A profile comparison
(:func:`compare_profiles`, behind ``sglang_results.compare``) judges one profile's figure against another's
with a *margin*: how much better it must be.

One sign convention everywhere: ``change_pct`` is the change of the figure itself,
``(current - reference) / |reference| * 100``: a startup 47 % slower is +47.4, a throughput 6 % lower is
-6.0. The status word says whether that is better or worse (``regressed``, ``improved``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pytest_sglang.baseline.directions import Direction, Tolerance, direction, fmt_value
from pytest_sglang.errors import BaselineError

if TYPE_CHECKING:
    from pytest_sglang.bench.metrics import BenchResult

Status = Literal["ok", "regressed", "improved"]


def change_pct(current: float, reference: float) -> float:
    """The figure's own change in percent of the reference; from a reference of 0, +/-inf (0.0 if equal)."""
    delta = current - reference
    if reference:
        return delta / abs(reference) * 100.0
    return 0.0 if delta == 0 else math.copysign(math.inf, delta)


@dataclass(frozen=True)
class Judgement:
    """One figure judged against a reference figure."""

    metric: str
    current: float
    reference: float
    tolerance: Tolerance
    direction: Direction
    status: Status  # regressed: worse than allowed (or short of the margin); improved: better than the tolerance
    change_pct: float  # the figure's own change: (current - reference) / |reference| * 100
    message: str

    @property
    def failed(self) -> bool:
        return self.status == "regressed"

    @property
    def gain_pct(self) -> float:
        """``change_pct`` signed so that positive is better (a throughput up, a latency down)."""
        return self.change_pct if self.direction == "higher" else -self.change_pct


def judge(
    metric: str,
    current: float,
    reference: float,
    tolerance: Tolerance,
    *,
    margin: bool = False,
    current_label: str = "",
    reference_label: str = "baseline",
    context: str = "",
) -> Judgement:
    """Judge ``current`` against ``reference`` for ``metric`` (BaselineError if its direction is unknown).

    ``margin=False``: ``tolerance`` is how much worse than the reference the figure may be; past it the status
    is ``regressed``, better by more than it ``improved``, else ``ok``. ``margin=True``: ``tolerance`` is how
    much better it must be ("0%": at least as good); short of that it is ``regressed``, else ``ok``.
    ``current_label`` and ``reference_label`` name the two figures in the message (``eagle3`` vs ``base``, or
    the figure vs ``baseline``); ``context`` says where the reference comes from.
    """
    d = direction(metric)
    gain = (current - reference) if d == "higher" else (reference - current)  # positive: current is better
    bound = tolerance.allowed(reference)
    status: Status
    if margin:
        status = "regressed" if gain < bound else "ok"
    elif gain < -bound:
        status = "regressed"
    elif gain > bound:
        status = "improved"
    else:
        status = "ok"
    pct = change_pct(current, reference)
    shown = f"{pct:+.1f}%"
    versus = (f"{current_label + ' ' if current_label else ''}{fmt_value(metric, current)} vs {reference_label} "
              f"{fmt_value(metric, reference)}")
    if margin:
        message = f"{metric}: {versus} ({shown}, {d} is better)"
        if status == "regressed":
            message += f"; needed a margin of {tolerance}"
    else:
        versus += f" (tolerance {tolerance}{'; ' + context if context else ''})"
        size = f"{abs(pct):.1f}%" if math.isfinite(pct) else "from 0"
        if status == "ok":
            message = f"{metric} {shown if math.isfinite(pct) else size} within tolerance: {versus}"
        else:
            message = f"{metric} {status} {size}: {versus}"
    return Judgement(metric, current, reference, tolerance, d, status, pct, message)


def metric_value(result: Any, metric: str) -> float | None:
    """``result.metric`` or ``result[metric]``: a BenchResult, a server handle, or a mapping (None if absent);
    BaselineError if it is not a number."""
    if isinstance(result, Mapping):
        value = result.get(metric)
    else:
        value = getattr(result, metric, None)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise BaselineError(f"{metric} of {type(result).__name__} is {value!r}, not a number") from None


# --------------------------------------------------------------------------------------------------------
# Profile comparisons


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
            j = judge(metric, va, vb, tol, margin=True, current_label=better, reference_label=other)
        except BaselineError as exc:
            outcome.failures.append(f"{metric}: {exc}")
            continue
        outcome.judgements.append(j)
        if j.failed:
            outcome.failures.append(j.message)
    return outcome
