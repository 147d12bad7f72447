"""An A/B run as a small SVG: interleaved, the paired ratios (second over first, pair by pair) with the median,
its interval, 1.0 and the tolerance's edge; bracketed, each side's rounds in the order they ran."""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Sequence
from typing import Any

_WIDTH, _HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 560, 200, 56, 150, 26, 30
_SIDES = ("#1f77b4", "#ff7f0e")


def tolerance_edge(check: dict[str, Any] | None) -> float | None:
    """The ratio at the tolerance's edge of a relative tolerance (``5%`` of a higher-is-better metric: 0.95);
    None for an absolute or sigma tolerance, which is no ratio."""
    raw = (check or {}).get("tolerance")
    if not isinstance(raw, str) or not raw.strip().endswith("%"):
        return None
    try:
        amount = float(raw.strip()[:-1]) / 100.0
    except ValueError:
        return None
    return 1.0 - amount if check and check.get("direction") == "higher" else 1.0 + amount


def _axis(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * 0.12, 0.02 * max(abs(hi), 1e-9))
    return lo - pad, hi + pad


def _frame(title: str, lo: float, hi: float, fmt: str) -> tuple[list[str], Any]:
    inner_h = _HEIGHT - _TOP - _BOTTOM

    def py(v: float) -> float:
        return _TOP + inner_h - (v - lo) / (hi - lo) * inner_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" font-family="sans-serif" '
           f'font-size="11" role="img" aria-label="{html.escape(title)}">',
           f'<text x="{_LEFT}" y="15" font-weight="bold">{html.escape(title)}</text>',
           f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + inner_h}" stroke="#333"/>']
    step = (hi - lo) / 4
    for k in range(5):
        v = lo + k * step
        out.append(f'<line x1="{_LEFT}" x2="{_WIDTH - _RIGHT}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{_LEFT - 5}" y="{py(v) + 4:.1f}" text-anchor="end">{v:{fmt}}</text>')
    return out, py


def _hline(py: Any, value: float, color: str, label: str, dash: str = "", width: float = 1.5,
           css: str = "") -> tuple[str, tuple[float, str, str]]:
    """A horizontal line across the plot, and its label (y, colour, text) for :func:`_labels` to place."""
    y = py(value)
    style = f' stroke-dasharray="{dash}"' if dash else ""
    cls = f' class="{css}"' if css else ""
    return (f'<line{cls} x1="{_LEFT}" x2="{_WIDTH - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" '
            f'stroke-width="{width}"{style}><title>{html.escape(label)}</title></line>', (y, color, label))


def _labels(labels: list[tuple[float, str, str]]) -> list[str]:
    """The lines' labels right of the plot, top to bottom, pushed apart where lines lie close together."""
    out, last = [], -1e9
    for y, color, text in sorted(labels):
        y = max(y + 4, last + 12)
        out.append(f'<text x="{_WIDTH - _RIGHT + 6}" y="{y:.1f}" fill="{color}">{html.escape(text)}</text>')
        last = y
    return out


def ratio_svg(ab: dict[str, Any], check: dict[str, Any] | None) -> str | None:
    """Interleaved: each pair's ratio of output tok/s, the median ratio and its interval, 1.0 and the tolerance's
    edge (class ``tolerance-line``). None without rounds to pair."""
    a, b = ab["rounds"].get(ab["first"]) or [], ab["rounds"].get(ab["second"]) or []
    ratios = [y / x for x, y in zip(a, b, strict=False) if x and y is not None and math.isfinite(y / x)]
    if not ratios:
        return None
    ratio, ci = ab["ratio"].get("output_throughput"), ab["ci"].get("output_throughput")
    edge = tolerance_edge(check)
    lo, hi = _axis([*ratios, 1.0, *(ci or []), *([edge] if edge else [])])
    out, py = _frame(f"output tok/s, {ab['second']} over {ab['first']}, pair by pair", lo, hi, ".2f")
    inner_w = _WIDTH - _LEFT - _RIGHT
    if ci:
        out.append(f'<rect class="ci-band" x="{_LEFT}" y="{py(ci[1]):.1f}" width="{inner_w}" '
                   f'height="{max(py(ci[0]) - py(ci[1]), 1):.1f}" fill="#dbe9f6"><title>'
                   f'{ab["confidence"]:.0%} CI {ci[0]:.3f}-{ci[1]:.3f}</title></rect>')
    lines = [_hline(py, 1.0, "#555", "1.0 (no change)", "2 2", 1.0)]
    if edge is not None:
        lines.append(_hline(py, edge, "#c62828", f"tolerance {edge:.2f}x", "6 3", css="tolerance-line"))
    if ratio is not None:
        lines.append(_hline(py, ratio, "#1f77b4", f"median {ratio:.3f}x"))
    out += [line for line, _ in lines] + _labels([label for _, label in lines])
    n = len(ratios)
    for i, r in enumerate(ratios):
        x = _LEFT + (i + 0.5) / n * inner_w
        out.append(f'<circle class="pair" cx="{x:.1f}" cy="{py(r):.1f}" r="4" fill="#1f77b4"><title>pair {i + 1}: '
                   f'{r:.3f}x ({b[i]:.1f} / {a[i]:.1f} tok/s)</title></circle>')
        out.append(f'<text x="{x:.1f}" y="{_HEIGHT - 12}" text-anchor="middle">{i + 1}</text>')
    out.append(f'<text x="{_LEFT + inner_w / 2}" y="{_HEIGHT - 1}" text-anchor="middle" fill="#555">pair</text>')
    out.append("</svg>")
    return "".join(out)


def rounds_svg(ab: dict[str, Any]) -> str | None:
    """Bracketed (or any run without pairs): each round's output tok/s in the order the rounds ran, one colour
    per profile, with each side's median."""
    order: list[str] = ab.get("order") or []
    rounds = {p: list(v or []) for p, v in ab["rounds"].items()}
    seq: list[tuple[str, float]] = []
    taken = {p: 0 for p in rounds}
    for profile in order:
        values = rounds.get(profile, [])
        if taken.get(profile, 0) < len(values):
            seq.append((profile, values[taken[profile]]))
            taken[profile] += 1
    if not seq:
        return None
    lo, hi = _axis([v for _, v in seq])
    out, py = _frame("output tok/s of each round, in the order they ran", lo, hi, ".0f")
    inner_w = _WIDTH - _LEFT - _RIGHT
    colors = {ab["first"]: _SIDES[0], ab["second"]: _SIDES[1]}
    lines = [_hline(py, statistics.median(values), colors.get(profile, "#555"),
                    f"{profile} median {statistics.median(values):.0f}", "4 2", 1.0)
             for profile, values in rounds.items() if values]
    out += [line for line, _ in lines] + _labels([label for _, label in lines])
    for i, (profile, value) in enumerate(seq):
        x = _LEFT + (i + 0.5) / len(seq) * inner_w
        out.append(f'<circle cx="{x:.1f}" cy="{py(value):.1f}" r="4" fill="{colors.get(profile, "#555")}"><title>'
                   f'{html.escape(profile)} round: {value:.1f} tok/s</title></circle>')
    out.append(f'<text x="{_LEFT + inner_w / 2}" y="{_HEIGHT - 8}" text-anchor="middle" fill="#555">rounds in '
               'the order they ran</text>')
    out.append("</svg>")
    return "".join(out)
