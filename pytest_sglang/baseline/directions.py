"""What each metric means for a comparison: which way is better, its unit, how to show it, how much it may move.

:func:`direction` knows which way is worse from the metric table (bench/metric_table.py: every figure of a
benchmark result, and a server handle's): higher is better for throughputs and the accept length, lower for
latencies (``*_ms``), ``duration``, ``failed`` and ``startup_seconds``; of the GPU and server telemetry
(bench/telemetry.py), tokens per joule, utilisation and SM clock are better higher, energy, power, memory,
queue and KV-cache usage lower. A name outside the table (a mapping's own figure) goes by its suffix
(``*_throughput`` higher; ``*_ms``, ``*_seconds`` lower); one it does not know raises BaselineError.
:class:`Tolerance` is ``"5%"`` (relative to the reference figure), an absolute amount in the metric's unit, or
``"3sigma"``: that many standard deviations of the baseline's rounds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pytest_sglang.bench.metric_table import METRICS, Direction
from pytest_sglang.errors import BaselineError

__all__ = ["Direction", "Tolerance", "direction", "fmt_value", "unit"]

# A figure outside the metric table, by its name's suffix.
_HIGHER = re.compile(r"(^|_)throughput$")
_LOWER = re.compile(r"_ms$|_seconds$")


def direction(metric: str) -> Direction:
    """Which way is better for ``metric``; raises BaselineError for a name whose direction is unknown."""
    entry = METRICS.get(metric)
    if entry is not None:
        return entry.direction
    if _HIGHER.search(metric):
        return "higher"
    if _LOWER.search(metric):
        return "lower"
    raise BaselineError(
        f"no direction known for metric {metric!r}: baselines compare throughputs (*_throughput, higher is "
        "better), goodput, slo_attainment and accept_length (higher), latencies (*_ms, lower), duration, failed "
        "and startup_seconds (lower); of the telemetry, output_tokens_per_joule, gpu_util_mean_pct and "
        "gpu_sm_clock_mean_mhz (higher), gpu_energy_j, energy_per_output_token_j, gpu_power_mean_w, "
        "gpu_memory_peak_mib, server_queue_mean and server_kv_usage_peak (lower)"
    )


def unit(metric: str) -> str:
    entry = METRICS.get(metric)
    if entry is not None:
        return entry.unit
    if metric.endswith("_throughput"):
        return "tok/s"
    if metric.endswith("_ms"):
        return "ms"
    return "s" if metric.endswith("seconds") else ""


def fmt_value(metric: str, value: float) -> str:
    u = unit(metric)
    digits = 1 if abs(value) >= 10 or u in ("tok/s",) else 2 if abs(value) >= 0.1 or value == 0 else 4
    text = f"{value:.{digits}f}"
    return f"{text} {u}" if u else text


_SIGMA = re.compile(r"^(.*?)\s*(sigma|σ)$", re.IGNORECASE)


@dataclass(frozen=True)
class Tolerance:
    """``5%`` (relative to the reference figure), an absolute amount in the metric's unit, or ``3sigma``
    (``sigma``: that many sample standard deviations of the baseline's rounds)."""

    amount: float
    relative: bool
    sigma: bool = False

    @classmethod
    def parse(cls, metric: str, raw: str | float | int) -> Tolerance:
        if isinstance(raw, bool):
            raise BaselineError(f"tolerance for {metric} must be like '5%', '3sigma' or a number, got {raw!r}")
        sigma = False
        if isinstance(raw, (int, float)):
            value, relative = float(raw), False
        elif isinstance(raw, str):
            text = raw.strip()
            relative = text.endswith("%")
            found = _SIGMA.match(text)
            sigma = found is not None
            number = found.group(1) if found else text[:-1] if relative else text
            try:
                value = float(number)
            except ValueError:
                raise BaselineError(
                    f"tolerance for {metric} must be like '5%' (relative), '3sigma' (of the baseline's rounds) or "
                    f"'3' (absolute, in {unit(metric) or 'its unit'}), got {raw!r}") from None
        else:
            raise BaselineError(f"tolerance for {metric} must be like '5%', '3sigma' or a number, got {raw!r}")
        if not math.isfinite(value) or value < 0:
            raise BaselineError(f"tolerance for {metric} must be a finite amount >= 0, got {raw!r}")
        return cls(value, relative, sigma)

    def allowed(self, reference: float, sigma: float | None = None) -> float:
        """The amount in the metric's unit: a relative tolerance scales with the reference figure, a sigma
        tolerance with the baseline's standard deviation ``sigma`` (BaselineError without one)."""
        if self.sigma:
            if sigma is None:
                raise BaselineError(f"tolerance {self} needs the baseline's standard deviation")
            return self.amount * sigma
        return abs(reference) * self.amount / 100.0 if self.relative else self.amount

    def __str__(self) -> str:
        if self.sigma:
            return f"{self.amount:g}sigma"
        return f"{self.amount:g}%" if self.relative else f"{self.amount:g}"

