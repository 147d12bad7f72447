"""A series of the run history as an SVG: each run's median in run order, each step found in it marked by a
vertical line where it starts, and the medians of the segments between the steps as horizontal lines."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from pytest_sglang.report.abchart import _axis

_WIDTH, _HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 560, 210, 62, 20, 40, 30
_STEP_COLORS = {"regressed": "#c62828", "improved": "#2e7d32"}


def series_svg(series: dict[str, Any], steps: Sequence[dict[str, Any]]) -> str | None:
    """One series (the report's ``history.series`` entry, with its points) and its steps; None without points."""
    points = series.get("points") or []
    if not points:
        return None
    values = [float(p["value"]) for p in points]
    steps = sorted(steps, key=lambda s: s["index"])
    lo, hi = _axis([*values, *(s["before"] for s in steps), *(s["after"] for s in steps)])
    n = len(values)
    inner_w, inner_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM

    def px(run: float) -> float:  # run: 1-based position in the series
        return _LEFT + (run - 0.5) / n * inner_w

    def py(v: float) -> float:
        return _TOP + inner_h - (v - lo) / (hi - lo) * inner_h

    title = f"{series['metric']} · {series['profile']} / {series['test']}"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" font-family="sans-serif" '
           f'font-size="11" role="img" aria-label="{html.escape(title)}">',
           f'<text x="{_LEFT}" y="14" font-weight="bold">{html.escape(title)}</text>',
           f'<text x="{_LEFT}" y="28" fill="#666">{n} run{"s" if n != 1 else ""}, the median of each; '
           f'{len(steps)} step{"s" if len(steps) != 1 else ""}</text>',
           f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + inner_h}" stroke="#333"/>']
    for k in range(5):
        v = lo + k * (hi - lo) / 4
        out.append(f'<line x1="{_LEFT}" x2="{_WIDTH - _RIGHT}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{_LEFT - 5}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.4g}</text>')
    # The segments between steps at their medians: before the first step its "before", after each its "after".
    bounds = [1, *(s["index"] for s in steps), n + 1]
    medians = [steps[0]["before"], *(s["after"] for s in steps)] if steps else []
    for (start, end), median in zip(zip(bounds, bounds[1:], strict=False), medians, strict=False):
        out.append(f'<line class="step-segment" x1="{px(start - 0.5):.1f}" x2="{px(end - 0.5):.1f}" '
                   f'y1="{py(median):.1f}" y2="{py(median):.1f}" stroke="#555" stroke-width="2" '
                   f'stroke-dasharray="5 3"><title>median of runs {start}-{end - 1}: {median:.4g}</title></line>')
    for step in steps:
        x = px(step["index"] - 0.5)
        color = _STEP_COLORS.get(step["status"], "#555")
        commit = f", commit {step['commit']}" if step.get("commit") else ""
        out.append(f'<line class="step-marker" x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" y2="{_TOP + inner_h}" '
                   f'stroke="{color}" stroke-width="2"><title>step {step["change_pct"]:+.1f} % at run '
                   f'{step["index"]}{html.escape(commit)}, p={step["p_value"]:.3g}</title></line>')
        anchor = "end" if x > _LEFT + inner_w * 0.7 else "start"
        out.append(f'<text x="{x + (-4 if anchor == "end" else 4):.1f}" y="{_TOP + 10}" fill="{color}" '
                   f'text-anchor="{anchor}">{step["change_pct"]:+.1f} % at run {step["index"]}</text>')
    line = " ".join(f"{px(i + 1):.1f},{py(v):.1f}" for i, v in enumerate(values))
    out.append(f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="1.2"/>')
    for i, (p, v) in enumerate(zip(points, values, strict=True)):
        tip = f"run {i + 1} (id {p['run_id']}" + (f", commit {p['commit']}" if p.get("commit") else "") + f"): {v:.4g}"
        out.append(f'<circle class="run" cx="{px(i + 1):.1f}" cy="{py(v):.1f}" r="3" fill="#1f77b4"><title>'
                   f"{html.escape(tip)}</title></circle>")
    every = max(1, n // 10)
    for i in range(0, n, every):
        out.append(f'<text x="{px(i + 1):.1f}" y="{_HEIGHT - 14}" text-anchor="middle">{i + 1}</text>')
    out.append(f'<text x="{_LEFT + inner_w / 2}" y="{_HEIGHT - 2}" text-anchor="middle" fill="#555">run</text>')
    out.append("</svg>")
    return "".join(out)


def history_charts(hist: dict[str, Any]) -> list[str]:
    """One chart per series of the report's history section with two runs or more (one point shows no change),
    the series with steps first."""
    key = ("profile", "test", "machine", "workload", "metric")
    by_series: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for step in hist.get("steps", []):
        by_series.setdefault(tuple(step[k] for k in key), []).append(step)
    series = sorted(hist.get("series", []), key=lambda s: tuple(s[k] for k in key) not in by_series)
    charts = [series_svg(s, by_series.get(tuple(s[k] for k in key), [])) for s in series
              if len(s.get("points") or []) >= 2]
    return [c for c in charts if c]
