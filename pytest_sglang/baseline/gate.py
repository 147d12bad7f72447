"""The gate: what an outcome means for CI, decided here and nowhere else.

A gate is one of four words, ordered worst first: ``regressed`` (a change past the tolerance, certain enough),
``not-judged`` (a check that could not decide: too noisy, no baseline, failed requests, a server that could not
start, a check that could not be made), ``recorded`` (a baseline written, nothing judged) and ``passed``.
Whatever sums outcomes (a benchmark's checks, a test's benchmarks, the run's) takes the worst of them with
:func:`combine`; a check's status (baseline/checks.py ``CheckStatus``, the engine's ``Status``) maps to its gate
through :data:`STATUS_GATE`. The terminal, junit, the step summary, the JSON report and the HTML page show these
words; none of them decides one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

Gate = Literal["regressed", "not-judged", "recorded", "passed"]
ORDER: tuple[Gate, ...] = ("regressed", "not-judged", "recorded", "passed")  # worst first

# A check's status as the gate it amounts to: a metric missing from this run is a regression (the figure is
# gone); a metric with no baseline yet could not be judged.
STATUS_GATE: dict[str, Gate] = {"ok": "passed", "improved": "passed", "regressed": "regressed",
                                "missing": "regressed", "not-judged": "not-judged", "no-baseline": "not-judged"}


def rank(gate: str | None) -> int:
    """Where ``gate`` stands, 0 the worst; None (nothing checked) after every gate."""
    return ORDER.index(gate) if gate in ORDER else len(ORDER)


def worst(gates: Iterable[Gate | None]) -> Gate | None:
    """The worst of ``gates``; None when none was given (nothing was checked)."""
    found = [g for g in gates if g is not None]
    return min(found, key=rank) if found else None


def combine(outcomes: Iterable[tuple[Gate | None, str | None]]) -> tuple[Gate | None, str | None]:
    """The worst gate of ``outcomes`` (gate, reason) and the reasons of every outcome at it, joined."""
    given = list(outcomes)
    gate = worst(g for g, _ in given)
    reasons = [reason for g, reason in given if g == gate and reason]
    return gate, "; ".join(reasons) or None
