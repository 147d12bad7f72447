"""What a check could have seen: the smallest change in the bad direction that it flags as ``regressed`` with
80 % chance, from the noise it measured (issue 24 point 5), so a user knows whether to add rounds, A/A runs or
history before trusting a green gate.

Every rule is, near its decision, a test of a log-ratio against the tolerance's edge with some standard error
``se``; a change is caught at power ``POWER`` when it lies ``(z[1 - alpha] + z[POWER]) * se`` past the edge
(normal approximation; the rank tests lose a few per cent of that efficiency, so the figures are "about").
Each rule supplies its own ``se``: the paired ratios' spread over the root of the pairs, the A/A runs' or past
sessions' prediction spread, the two sides' rounds. A history of runs is judged by change points
(stats/changepoints.py): a step in the middle of ``runs`` runs is a difference of two means of ``runs / 2``
sessions each, so its ``se`` is the session noise times ``2 / sqrt(runs)``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pytest_sglang.baseline.directions import Direction

POWER = 0.8
HISTORY_RUNS = 30  # the length of history a message quotes ("30 runs of history find a step of 3 %")
_NORMAL = statistics.NormalDist()


def log_sd(values: Sequence[float]) -> float | None:
    """The standard deviation of the logs of positive ``values`` (about their CV, for small spreads)."""
    logs = [math.log(v) for v in values if v > 0]
    return statistics.stdev(logs) if len(logs) >= 2 else None


def detectable_pct(se: float | None, bound_pct: float, d: Direction, *, alpha: float, power: float = POWER
                   ) -> float | None:
    """The smallest change of the figure, in % and in the bad direction (a throughput drop, a latency rise),
    that a test of a log-ratio with standard error ``se`` at one-sided level ``alpha`` flags past a tolerance of
    ``bound_pct`` with chance ``power``. None where the noise is unknown."""
    if se is None or not math.isfinite(se):
        return None
    reach = (_NORMAL.inv_cdf(1.0 - alpha) + _NORMAL.inv_cdf(power)) * se
    edge = bound_pct / 100.0
    if d == "higher":
        return (1.0 - max(1.0 - edge, 0.0) * math.exp(-reach)) * 100.0
    return ((1.0 + edge) * math.exp(reach) - 1.0) * 100.0


def history_se(run_sd: float | None, runs: int = HISTORY_RUNS) -> float | None:
    """The standard error of a step in the middle of ``runs`` runs whose medians spread ``run_sd`` (log)."""
    return None if run_sd is None else run_sd * 2.0 / math.sqrt(runs)


def catch_text(detectable: float | None, sample: str = "", history: float | None = None) -> str:
    """``catches about 19% at 80% power (8 pairs); 30 runs of history find a step of about 3%``."""
    if detectable is None:
        return ""
    text = f"catches about {detectable:.0f}% at {POWER:.0%} power" + (f" ({sample})" if sample else "")
    if history is not None:
        text += f"; {HISTORY_RUNS} runs of history find a step of about {history:.1f}%"
    return text
