"""The report as an HTML page: tok/s bars against the baseline, throughput-against-latency sweep plots, and
each benchmark's GPU and server telemetry over time (timeseries.py)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_sglang.bench.sweep import CURVE_X, CURVE_Y
from pytest_sglang.report.tables import HEADERS, _rows, _test_label, gate_lines, telemetry_text
from pytest_sglang.report.timeseries import telemetry_panels

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")


def _bars(report: dict[str, Any]) -> str:
    bars: list[tuple[str, float, float | None, str]] = []  # label, tok/s, baseline, status
    for name, prof in report["profiles"].items():
        for bench in prof["benchmarks"]:
            r = bench["result"]
            view = bench["baseline"].get("output_throughput") or {}
            bars.append((f"{name} · {_test_label(bench)}", float(r["output_throughput"]), view.get("baseline"),
                         view.get("status", "")))
    width, bar_h, gap, left, right = 900, 22, 14, 260, 90
    top = 40
    height = top + len(bars) * (bar_h + gap) + 40
    peak = max([v for _, v, _, _ in bars] + [b for _, _, b, _ in bars if b] + [1.0])
    scale = (width - left - right) / peak
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="13" role="img" aria-label="output tok/s per profile">',
           f'<text x="{left}" y="22" font-weight="bold">output throughput (tok/s)'
           f'{"; dashed line: the stored baseline" if any(b for _, _, b, _ in bars) else ""}</text>']
    for i, (label, value, base, status) in enumerate(bars):
        y = top + i * (bar_h + gap)
        color = {"regressed": "#d62728", "improved": "#2ca02c", "missing": "#d62728",
                 "not-judged": "#bcbd22"}.get(status, "#1f77b4")
        svg.append(f'<text x="{left - 8}" y="{y + bar_h * 0.7}" text-anchor="end">{html.escape(label)}</text>')
        svg.append(f'<rect x="{left}" y="{y}" width="{max(value * scale, 1):.1f}" height="{bar_h}" '
                   f'fill="{color}"><title>{value:.1f} tok/s</title></rect>')
        svg.append(f'<text x="{left + value * scale + 6:.1f}" y="{y + bar_h * 0.7}">{value:.1f}</text>')
        if base:
            bx = left + base * scale
            svg.append(f'<line x1="{bx:.1f}" x2="{bx:.1f}" y1="{y - 4}" y2="{y + bar_h + 4}" stroke="black" '
                       f'stroke-width="2" stroke-dasharray="4 2"><title>baseline {base:.1f} tok/s</title></line>')
    svg.append("</svg>")
    return "".join(svg)


def _nice_step(top: float, ticks: int = 5) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) that covers ``top`` in about ``ticks`` steps."""
    raw = max(top, 1e-9) / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def sweep_svg(test: str, curves: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Throughput against latency for one swept test, one line per profile, each point labelled with its load
    and the knee ringed."""
    width, height, left, right, top, bottom = 760, 440, 70, 130, 50, 50
    pts = [p for _, c in curves for p in c["points"]]
    x_step = _nice_step(max([p[CURVE_X] for p in pts] + [1.0]))
    y_step = _nice_step(max([p[CURVE_Y] for p in pts] + [1.0]))
    x_hi = x_step * math.ceil(max([p[CURVE_X] for p in pts] + [1.0]) * 1.05 / x_step)
    y_hi = y_step * math.ceil(max([p[CURVE_Y] for p in pts] + [1.0]) * 1.08 / y_step)

    def px(x: float) -> float:
        return left + x / x_hi * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - y / y_hi * (height - top - bottom)

    mid_y = (top + height - bottom) / 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12" role="img" aria-label="throughput against latency: {html.escape(test)}">',
           f'<text x="{left}" y="20" font-weight="bold" font-size="14">{html.escape(test)}</text>',
           f'<text x="{left}" y="38" fill="#555">output tok/s against median e2e latency, one line per profile; '
           'ringed: the knee</text>',
           f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#333"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#333"/>',
           f'<text x="{(left + width - right) / 2}" y="{height - 12}" text-anchor="middle">median e2e latency '
           '(ms)</text>',
           f'<text x="16" y="{mid_y}" transform="rotate(-90 16 {mid_y})" text-anchor="middle">output tok/s</text>']
    for k in range(int(round(x_hi / x_step)) + 1):
        xv = k * x_step
        out.append(f'<text x="{px(xv):.1f}" y="{height - bottom + 16}" text-anchor="middle">{xv:g}</text>')
    for k in range(int(round(y_hi / y_step)) + 1):
        yv = k * y_step
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{py(yv):.1f}" y2="{py(yv):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{py(yv) + 4:.1f}" text-anchor="end">{yv:g}</text>')
    for i, (profile, curve) in enumerate(curves):
        color = _COLORS[i % len(_COLORS)]
        line = " ".join(f"{px(p[CURVE_X]):.1f},{py(p[CURVE_Y]):.1f}" for p in curve["points"])
        out.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        short = {"concurrency": "c", "request_rate": "rate"}.get(curve["param"], curve["param"])
        for j, p in enumerate(curve["points"]):
            x, y = px(p[CURVE_X]), py(p[CURVE_Y])
            tip = (f"{profile} {curve['param']}={p['value']:g}: {p[CURVE_Y]:.1f} tok/s, {p[CURVE_X]:.0f} ms"
                   + (f", goodput {p['goodput']:.2f} req/s" if p.get("goodput") is not None else ""))
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}"><title>{html.escape(tip)}'
                       '</title></circle>')
            # alternate right-above and left-below, so close points stay legible
            lx, ly, anchor = (x + 7, y - 6, "start") if j % 2 == 0 else (x - 7, y + 12, "end")
            out.append(f'<text x="{lx:.1f}" y="{ly:.1f}" fill="{color}" text-anchor="{anchor}">{short}='
                       f'{p["value"]:g}</text>')
            if curve["knee"] == p["value"]:
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="10" fill="none" stroke="#d62728" '
                           f'stroke-width="2"><title>knee: {curve["param"]}={p["value"]:g}</title></circle>')
                out.append(f'<text x="{x:.1f}" y="{y - 15:.1f}" fill="#d62728" text-anchor="middle">knee</text>')
        ly = top + 18 * i + 10
        out.append(f'<rect x="{width - right + 14}" y="{ly - 9}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{width - right + 32}" y="{ly + 1}">{html.escape(profile)}</text>')
    out.append("</svg>")
    return "".join(out)


def _sweep_charts(report: dict[str, Any]) -> str:
    by_test: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, prof in report["profiles"].items():
        for curve in prof.get("sweeps", []):
            by_test.setdefault(f"{curve['test_id'].rsplit('::', 1)[-1]} over {curve['param']}", []).append(
                (name, curve))
    return "".join(f"<h2>{html.escape(test)}</h2>{sweep_svg(test, curves)}" for test, curves in by_test.items())


def _telemetry_charts(report: dict[str, Any]) -> str:
    out = []
    for name, prof in report["profiles"].items():
        for bench in prof["benchmarks"]:
            panels = telemetry_panels(bench["telemetry"]) if bench.get("telemetry") else []
            if not panels:
                continue
            summary = telemetry_text(bench["result"]) or ""
            out.append(f"<h2>{html.escape(f'{name} · {_test_label(bench)}: telemetry')}</h2>"
                       f"<p>{html.escape(summary)} (shaded: the measured rounds)</p>" + "<br>".join(panels))
    return "".join(out)


def html_page(report: dict[str, Any]) -> str:
    rows_html = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                        for row in _rows(report))
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
    gates = gate_lines(report)
    gate_html = ("<p><b>" + html.escape(gates[0]) + "</b></p><ul>"
                 + "".join(f"<li>{html.escape(g)}</li>" for g in gates[1:]) + "</ul>") if gates else ""
    meta = html.escape(f"{report.get('machine') or ''} {report.get('commit') or ''} {report['created']}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>pytest-sglang report</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}</style></head><body>"
            f"<h1>pytest-sglang report</h1><p>{meta}</p>{gate_html}{_bars(report)}{_sweep_charts(report)}"
            f"{_telemetry_charts(report)}"
            f"<table><tr>{head}</tr>{rows_html}</table></body></html>\n")


def write_html(path: str | Path, report: dict[str, Any]) -> Path:
    path = Path(path)
    path.write_text(html_page(report), encoding="utf-8")
    return path
