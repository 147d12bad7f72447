"""What every rule of the engine shares: the statuses, the defaults, the change of a figure, the samples of a
side, the two ways a change makes a status (beyond the tolerance and significant; beyond the tolerance's
edge of a known noise), and :func:`settle`, the one rule every check ends in, so that every rule decides
"regressed" alike.

The one rule (issue 24: a README A/B check stayed green on a 1.74x slowdown because a spread limit answered
first): an interval of the change that lies wholly beyond the tolerance in the bad direction is ``regressed``,
whatever the spread of the rounds or pairs behind it; an interval clear of the tolerance's bad edge cannot be a
regression and is what the rule's test says; only an interval across that edge, from samples spread over the
limit or with a best estimate past the edge that the test cannot confirm, is ``not-judged``, and its message says
how wide it is and what would decide it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Literal

from pytest_sglang.baseline.directions import Direction, Tolerance
from pytest_sglang.errors import BaselineError
from pytest_sglang.stats.inference import Alternative, SessionSpread

Status = Literal["ok", "regressed", "improved", "not-judged"]
Placement = Literal["beyond", "clear", "across"]  # an interval against the tolerance's bad edge
Method = Literal["tolerance", "mann-whitney", "sessions", "signed-rank", "instance-noise", "history"]

DEFAULT_CONFIDENCE = 0.95
DEFAULT_MAX_CV_PCT = 10.0  # rounds spread more than this (CV): too noisy to judge


def change_pct(current: float, reference: float) -> float:
    """The figure's own change in percent of the reference; from a reference of 0, +/-inf (0.0 if equal)."""
    delta = current - reference
    if reference:
        return delta / abs(reference) * 100.0
    return 0.0 if delta == 0 else math.copysign(math.inf, delta)


def samples_of(value: float | Sequence[float]) -> list[float]:
    values = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
    if not values:
        raise BaselineError("a comparison needs at least one value on each side")
    return values


def cv_pct(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / abs(mean) * 100.0 if mean else None


def ab_bound_pct(metric: str, tolerance: Tolerance, first_median: float) -> float:
    if tolerance.sigma:
        raise BaselineError(f"an A/B check of {metric} takes a tolerance like '5%' or an amount in its unit, "
                            f"not {tolerance}: both sides are measured now, there is no baseline spread")
    if not first_median:
        raise BaselineError(f"an A/B check of {metric} needs a first-side figure other than 0")
    return tolerance.allowed(first_median) / abs(first_median) * 100.0


def positive_figures(metric: str, label: str, values: Sequence[float]) -> list[float]:
    values = [float(v) for v in values]
    if not values or any(not v > 0 for v in values):
        raise BaselineError(f"an A/B comparison of {metric} needs positive figures on each side; {label} has "
                            f"{', '.join(f'{v:g}' for v in values) or 'none'}")
    return values


def gain_of(current: float, reference: float, d: Direction) -> float:
    """How much better ``current`` is than ``reference`` (negative: worse), in their unit."""
    return current - reference if d == "higher" else reference - current


def alternatives(d: Direction) -> tuple[Alternative, Alternative]:
    """The one-sided alternatives that mean "worse" and "better" for a metric of direction ``d``."""
    return ("less", "greater") if d == "higher" else ("greater", "less")


def status_of(gain: float, bound: float, *, worse_significant: bool = True,
              better_significant: bool = True) -> Status:
    """Worse than ``bound`` allows (``gain`` below ``-bound``) and, where a test was made, significantly so:
    ``regressed``; better by more than ``bound`` and significant: ``improved``; else ``ok``."""
    if gain < -bound and worse_significant:
        return "regressed"
    if gain > bound and better_significant:
        return "improved"
    return "ok"


def beyond_noise(spread: SessionSpread, value: float, low_edge: float, high_edge: float, d: Direction,
                 confidence: float) -> tuple[Status, float, float]:
    """``value`` against the known noise ``spread`` of unchanged figures, shifted to the tolerance's edges
    (``low_edge`` and ``high_edge`` times its center): ``regressed`` when an unchanged figure at the worse edge
    falls as far as ``value`` with chance at most ``1 - confidence``, ``improved`` likewise, else ``ok``; with
    the chances of worse and of better."""
    if d == "higher":
        p_worse, p_better = spread.p_below(value, low_edge), spread.p_above(value, high_edge)
    else:
        p_worse, p_better = spread.p_above(value, high_edge), spread.p_below(value, low_edge)
    alpha = 1.0 - confidence
    status: Status = "regressed" if p_worse <= alpha else "improved" if p_better <= alpha else "ok"
    return status, p_worse, p_better


def gain_interval(interval: tuple[float, float], d: Direction) -> tuple[float, float]:
    """An interval of a figure's change in % (or of a ratio less 1, in %) as gains in %: positive is better."""
    low, high = interval
    return (low, high) if d == "higher" else (-high, -low)


def placement(gain_low: float, gain_high: float, bound_pct: float) -> Placement:
    """Where an interval of the gain (in %, positive better) lies against the tolerance's bad edge
    ``-bound_pct``: wholly ``beyond`` it (a certain regression), ``clear`` of it (it cannot be one), or
    ``across`` it."""
    if gain_high < -bound_pct:
        return "beyond"
    return "clear" if gain_low >= -bound_pct else "across"


def settle(tested: Status, where: Placement | None, too_wide: bool, past_edge: bool = False) -> Status:
    """The one rule every check ends in. ``tested``: what the check's own test said; ``where``: its interval
    against the tolerance (None: it has none, e.g. one sample a side); ``too_wide``: its samples spread over the
    limit; ``past_edge``: its point estimate is beyond the tolerance in the bad direction. Beyond: ``regressed``
    whatever the spread; clear: the test's word; across (or no interval): the test's ``regressed`` stands, and
    otherwise a spread over the limit, or a best estimate past the edge that the test could not confirm, is
    ``not-judged`` (never "passed": a 0.56x whose interval reaches 1.06x is not a pass)."""
    if where == "beyond":
        return "regressed"
    if where == "clear" or tested == "regressed":
        return tested
    return "not-judged" if too_wide or (past_edge and where is not None) else tested


def over_limit(cv: float | None, limit: float | None) -> bool:
    return cv is not None and limit is not None and cv > limit
