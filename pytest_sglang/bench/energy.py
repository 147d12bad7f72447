"""A round's GPU figures drawn from its readings (telemetry.py samples them; its doc says how each is found):
the energy by the GPUs' counters or their power integrated, and the means and peaks over the measured window."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from typing import Any

from pytest_sglang.machine.gpus import GpuReading


def _at(points: Sequence[tuple[float, float]], times: Sequence[float], t: float) -> float:
    """The piecewise-linear curve through ``points`` (time-sorted; ``times`` their times) at ``t``, the first and
    last values held beyond them."""
    k = bisect.bisect_right(times, t)
    if k == 0:
        return points[0][1]
    if k == len(points):
        return points[-1][1]
    (t0, v0), (t1, v1) = points[k - 1], points[k]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1


def _integral(points: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """The integral over [lo, hi] of the piecewise-linear curve through ``points`` (time-sorted), the first and
    last values held beyond them."""
    if hi <= lo or not points:
        return 0.0
    times = [t for t, _ in points]
    inside = points[bisect.bisect_right(times, lo):bisect.bisect_left(times, hi)]
    knots = [(lo, _at(points, times, lo)), *inside, (hi, _at(points, times, hi))]
    return sum((b - a) * (va + vb) / 2 for (a, va), (b, vb) in zip(knots, knots[1:], strict=False))


def _counter_energy(samples: Sequence[tuple[float, Sequence[GpuReading]]], lo: float, hi: float) -> float | None:
    """The energy in J over [lo, hi] from the GPUs' own counters, summed over the GPUs: each counter at ``hi``
    minus at ``lo``, interpolated between the readings around them. None (the caller integrates the power)
    where a GPU read in the round has no counter reading, its readings do not reach both edges, or its counter
    went backwards (a driver reload resets it to zero; a wrap) or stood still while the GPU drew power."""
    counters: dict[int, list[tuple[float, float]]] = {}
    drawn: dict[int, float] = {}
    seen: set[int] = set()
    for t, readings in samples:
        for r in readings:
            seen.add(r.index)
            if r.energy_mj is not None:
                counters.setdefault(r.index, []).append((t, r.energy_mj))
            if r.power_w:
                drawn[r.index] = max(drawn.get(r.index, 0.0), r.power_w)
    if hi <= lo or not seen or set(counters) != seen:
        return None
    total_mj = 0.0
    for index, points in counters.items():
        times = [t for t, _ in points]
        if times[0] > lo or times[-1] < hi:
            return None
        if any(b < a for (_, a), (_, b) in zip(points, points[1:], strict=False)):
            return None
        used = _at(points, times, hi) - _at(points, times, lo)
        if used <= 0 and drawn.get(index, 0.0) > 0:
            return None
        total_mj += used
    return total_mj / 1000.0


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _measured_window(one: Any) -> tuple[float, float]:
    """First request sent to last response done: the round's ``duration``."""
    requests = getattr(one, "requests", None) or []
    if not requests:
        return 0.0, 0.0
    return min(r.start for r in requests), max(r.start + r.latency for r in requests)


def _gpu_figures(tokens: int, samples: list[tuple[float, list[GpuReading]]], lo: float, hi: float
                 ) -> dict[str, Any]:
    """A round's GPU figures from its readings over the window ``lo``..``hi``, ``tokens`` its output tokens."""
    power = [(t, sum(r.power_w for r in readings if r.power_w is not None)) for t, readings in samples
             if any(r.power_w is not None for r in readings)]
    readings = [r for _, rs in samples for r in rs]
    counted = _counter_energy(samples, lo, hi)
    out: dict[str, Any] = {}
    if counted is not None or (power and hi > lo):
        energy = counted if counted is not None else _integral(power, lo, hi)
        out.update(gpu_energy_j=energy, gpu_energy_source="counter" if counted is not None else "power_integral",
                   gpu_power_mean_w=energy / (hi - lo), energy_per_output_token_j=energy / tokens if tokens else None,
                   output_tokens_per_joule=tokens / energy if energy > 0 else None)
    memory = [r.memory_used_mib for r in readings if r.memory_used_mib is not None]
    out.update(gpu_util_mean_pct=_mean([r.util_pct for r in readings]),
               gpu_sm_clock_mean_mhz=_mean([r.sm_clock_mhz for r in readings]),
               gpu_memory_peak_mib=max(memory) if memory else None)
    return out
