"""A benchmark's telemetry (the report's ``telemetry``, bench/telemetry.py) as SVG panels over time: GPU
utilisation and power per GPU, the server's running and queued requests, its KV-cache usage; the measured
rounds shaded, so the gaps between them (and the warmup before) read as what they are."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
_WIDTH, _HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 760, 170, 70, 130, 28, 30

Line = tuple[str, Sequence[float], Sequence[float | None]]  # label, times, values (None: no reading)


def _step(top: float) -> float:
    raw = max(top, 1e-9) / 4
    power: float = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def panel(title: str, lines: Sequence[Line], rounds: Sequence[Sequence[float]], *, t_hi: float,
          y_hi: float | None = None) -> str:
    """One panel: each line over time on a shared axis from 0 to ``t_hi`` seconds, rounds shaded."""
    values = [v for _, _, vs in lines for v in vs if v is not None]
    peak = y_hi if y_hi is not None else max(values + [1.0])  # an idle series still gets a readable axis
    step = _step(peak)
    top_y = step * math.ceil(peak * (1.0 if y_hi is not None else 1.1) / step) or step
    inner_w, inner_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM

    def px(t: float) -> float:
        return _LEFT + max(0.0, t) / max(t_hi, 1e-9) * inner_w

    def py(v: float) -> float:
        return _TOP + inner_h - v / top_y * inner_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" font-family="sans-serif" '
           f'font-size="11" role="img" aria-label="{html.escape(title)}">',
           f'<text x="{_LEFT}" y="16" font-weight="bold">{html.escape(title)}</text>']
    for k, (lo, hi) in enumerate(rounds):
        out.append(f'<rect x="{px(lo):.1f}" y="{_TOP}" width="{max(px(hi) - px(lo), 1):.1f}" height="{inner_h}" '
                   f'fill="#f2f2f2"><title>round {k}: {lo:.2f} to {hi:.2f} s</title></rect>')
    for k in range(int(round(top_y / step)) + 1):
        v = k * step
        out.append(f'<line x1="{_LEFT}" x2="{_WIDTH - _RIGHT}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    t_step = _step(t_hi)
    for k in range(int(t_hi / t_step) + 1):
        t = k * t_step
        out.append(f'<text x="{px(t):.1f}" y="{_HEIGHT - 12}" text-anchor="middle">{t:g} s</text>')
    out.append(f'<line x1="{_LEFT}" y1="{_TOP + inner_h}" x2="{_WIDTH - _RIGHT}" y2="{_TOP + inner_h}" '
               'stroke="#333"/>')
    for i, (label, times, vals) in enumerate(lines):
        color = _COLORS[i % len(_COLORS)]
        points = " ".join(f"{px(t):.1f},{py(v):.1f}" for t, v in zip(times, vals, strict=False) if v is not None)
        out.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.5">'
                   f'<title>{html.escape(label)}</title></polyline>')
        ly = _TOP + 14 * i + 8
        out.append(f'<rect x="{_WIDTH - _RIGHT + 10}" y="{ly - 8}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{_WIDTH - _RIGHT + 25}" y="{ly + 1}">{html.escape(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def _read(lines: list[Line]) -> list[Line]:
    """The lines with at least one reading (a GPU that reports no power has no power line)."""
    return [line for line in lines if any(v is not None for v in line[2])]


def telemetry_panels(series: dict[str, Any]) -> list[str]:
    """The panels of one benchmark's telemetry: those its samples allow (none without samples)."""
    rounds = series.get("rounds") or []
    gpu, server = series.get("gpu"), series.get("server")
    ends = [hi for _, hi in rounds] + (gpu["t"][-1:] if gpu else []) + (server["t"][-1:] if server else [])
    t_hi = max(ends + [1e-3])
    panels = []
    if gpu:
        by_gpu = sorted(gpu["gpus"].items(), key=lambda kv: int(kv[0]))
        util = _read([(f"GPU {i}", gpu["t"], cols["util_pct"]) for i, cols in by_gpu])
        power = _read([(f"GPU {i}", gpu["t"], cols["power_w"]) for i, cols in by_gpu])
        if util:
            panels.append(panel("GPU utilisation (%)", util, rounds, t_hi=t_hi, y_hi=100.0))
        if power:
            panels.append(panel("GPU power (W)", power, rounds, t_hi=t_hi))
    if server:
        requests = [(name, server["t"], server[name]) for name in ("running", "queued") if name in server]
        if requests:
            panels.append(panel("server: requests running and queued", requests, rounds, t_hi=t_hi))
        if "kv_usage" in server:
            kv = [(v * 100.0 if v is not None else None) for v in server["kv_usage"]]
            panels.append(panel("server: KV-cache usage (%)", [("KV cache", server["t"], kv)], rounds, t_hi=t_hi,
                                y_hi=100.0))
    return panels
