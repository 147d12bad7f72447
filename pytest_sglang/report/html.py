"""The report as an HTML page: tok/s bars against the baseline, throughput-against-latency sweep plots, and
each benchmark's GPU and server telemetry over time (timeseries.py)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_sglang.baseline.gate import STATUS_GATE, worst
from pytest_sglang.bench.sweep import CURVE_X, CURVE_Y
from pytest_sglang.report.tables import (
    HEADERS,
    _test_label,
    bench_cells,
    history_lines,
    member_lines,
    step_line,
    telemetry_text,
)
from pytest_sglang.report.timeseries import telemetry_panels

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")


_BAR_COLORS = {"regressed": "#c62828", "missing": "#c62828", "not-judged": "#e0a800", "passed": "#2e7d32",
               "improved": "#2e7d32", "ok": "#2e7d32"}


def _bars(report: dict[str, Any]) -> str:
    """Output tok/s per benchmark, coloured by its throughput check, with the stored baseline as a dashed line
    and its value; a benchmark its server died in has no bar."""
    bars: list[tuple[str, float | None, float | None, str]] = []  # label, tok/s, baseline, status
    for name, prof in report["profiles"].items():
        for bench in prof["benchmarks"]:
            view = bench["baseline"].get("output_throughput") or {}
            value = None if bench.get("server_died") else float(bench["result"]["output_throughput"])
            bars.append((f"{name} · {_test_label(bench)}", value, view.get("baseline"), view.get("status", "")))
    width, bar_h, gap, left, right = 900, 22, 14, 260, 200
    top = 40
    height = top + len(bars) * (bar_h + gap) + 10
    peak = max([v for _, v, _, _ in bars if v] + [b for _, _, b, _ in bars if b] + [1.0])
    scale = (width - left - right) / peak
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="13" role="img" aria-label="output tok/s per benchmark">',
           f'<text x="{left}" y="22" font-weight="bold">output throughput (tok/s)'
           f'{"; dashed line: the stored baseline" if any(b for _, _, b, _ in bars) else ""}</text>']
    for i, (label, value, base, status) in enumerate(bars):
        y = top + i * (bar_h + gap)
        svg.append(f'<text x="{left - 8}" y="{y + bar_h * 0.7}" text-anchor="end">{html.escape(label)}</text>')
        if value is None:
            svg.append(f'<text class="died" x="{left + 4}" y="{y + bar_h * 0.7}" fill="#b71c1c" '
                       'font-weight="bold">server died: no figure</text>')
            continue
        svg.append(f'<rect x="{left}" y="{y}" width="{max(value * scale, 1):.1f}" height="{bar_h}" '
                   f'fill="{_BAR_COLORS.get(status, "#1f77b4")}"><title>{value:.1f} tok/s</title></rect>')
        end = left + max(value, base or 0.0) * scale
        svg.append(f'<text x="{end + 6:.1f}" y="{y + bar_h * 0.7}">{value:.1f}'
                   + (f'<tspan fill="#555"> (baseline {base:.1f})</tspan>' if base else "") + "</text>")
        if base:
            bx = left + base * scale
            svg.append(f'<line class="baseline" x1="{bx:.1f}" x2="{bx:.1f}" y1="{y - 4}" y2="{y + bar_h + 4}" '
                       'stroke="black" stroke-width="2" stroke-dasharray="4 2"><title>baseline '
                       f'{base:.1f} tok/s</title></line>')
    svg.append("</svg>")
    return "".join(svg)


def _nice_step(top: float, ticks: int = 5) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) that covers ``top`` in about ``ticks`` steps."""
    raw = max(top, 1e-9) / ticks
    power: float = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def sweep_svg(test: str, curves: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Throughput against latency for one swept test, one line per profile, each point labelled with its load
    and the knee ringed."""
    width, height, left, right, top, bottom = 760, 440, 70, 130, 50, 50
    pts = [p for _, c in curves for p in c["points"]]
    x_step = _nice_step(max([p[CURVE_X] for p in pts] + [1.0]))
    y_step = _nice_step(max([p[CURVE_Y] for p in pts] + [1.0]))
    x_hi: float = x_step * math.ceil(max([p[CURVE_X] for p in pts] + [1.0]) * 1.05 / x_step)
    y_hi: float = y_step * math.ceil(max([p[CURVE_Y] for p in pts] + [1.0]) * 1.08 / y_step)

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


# The page: what a person reads first (the verdict, what failed and why) at the top, the figures below.

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em 2em;color:#222;max-width:1200px}
h1{font-size:1.5em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.6em 0 .5em;border-bottom:1px solid #ddd;
padding-bottom:.2em}.meta{color:#666;margin:0 0 1em}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ddd;padding:4px 8px;white-space:nowrap;
text-align:left;
vertical-align:top;font-size:.92em}th{background:#f6f6f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
.banner{padding:.8em 1.1em;border-radius:6px;font-size:1.15em;margin:.6em 0;border-left:8px solid}
.banner b{font-size:1.2em;margin-right:.6em}
.badge{display:inline-block;padding:1px 7px;border-radius:4px;font-size:.85em;font-weight:600;white-space:nowrap}
.verdict-regressed{background:#fde0e0;border-color:#c62828;color:#8e1010}
.verdict-not-judged{background:#fff3cd;border-color:#e0a800;color:#7a5800}
.verdict-passed{background:#dff3e0;border-color:#2e7d32;color:#1b5e20}
.verdict-recorded{background:#e3ecf7;border-color:#3f6fb0;color:#274a7a}
.verdict-none{background:#eee;border-color:#999;color:#444}
ul.verdicts{list-style:none;padding:0;margin:.4em 0}ul.verdicts li{margin:.35em 0;padding:.35em .6em;
border-left:5px solid;border-radius:3px}ul.verdicts li .why{display:block;color:#333;font-size:.92em;margin-top:.15em}
.outcome-passed{color:#1b5e20;font-weight:600}.outcome-failed,.outcome-error{color:#b71c1c;font-weight:600}
.outcome-skipped{color:#777}.died{color:#b71c1c;font-weight:600}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;margin:.8em 0}.card h3{margin:.1em 0 .4em;
font-size:1.05em}.msg{color:#444;font-size:.88em;white-space:normal}td.wrap{white-space:normal}.small{color:#666;font-size:.88em}
"""
_VERDICT_WORD = {"regressed": "REGRESSED", "not-judged": "NOT JUDGED", "passed": "PASSED", "recorded": "RECORDED"}


def _badge(gate: str | None, text: str | None = None) -> str:
    word = text or _VERDICT_WORD.get(gate or "", "not checked")
    return f'<span class="badge verdict-{gate or "none"}">{html.escape(word)}</span>'


# A check's status (baseline/checks.py CheckStatus) in the words of its badge, where the gate's own word is not it.
_CHECK_WORD = {"ok": "passed", "improved": "improved", "missing": "missing", "no-baseline": "no baseline"}


def _check_badge(status: str | None) -> str:
    gate = STATUS_GATE.get(status or "")
    return _badge(gate, _CHECK_WORD.get(status or "") if gate else status)


def _verdicts(report: dict[str, Any]) -> str:
    """The banner (the run's gate in colour and its counts), then each regressed and not judged test and why."""
    g = report.get("gate") or {}
    status = g.get("status") or ("recorded" if g.get("recorded") else None)
    counts = (f"{len(g.get('regressed', []))} regressed, {len(g.get('not_judged', []))} not judged, "
              f"{g.get('passed', 0)} passed" + (f", {g['recorded']} recorded" if g.get("recorded") else ""))
    word = _VERDICT_WORD.get(status or "", "NOTHING CHECKED")
    out = [f'<div class="banner verdict-{status or "none"}" id="gate"><b>{word}</b>{html.escape(counts)}</div>']
    items = [("regressed", i) for i in g.get("regressed", [])] + [("not-judged", i) for i in g.get("not_judged", [])]
    died = {b["nodeid"] for prof in report["profiles"].values() for b in prof["benchmarks"] if b.get("server_died")}
    if items:
        out.append('<ul class="verdicts">')
        for gate, item in items:
            badge = _badge("regressed", "SERVER DIED") if item.get("nodeid") in died else _badge(gate)
            out.append(f'<li class="verdict-{gate}">{badge} <b>{html.escape(item["profile"])}</b> '
                       f'{html.escape(item["test_id"])}<span class="why">{html.escape(item.get("reason") or "")}'
                       "</span></li>")
        out.append("</ul>")
    return "".join(out)


def _tests(report: dict[str, Any]) -> str:
    """Each test that measured something: its outcome and its gate (the worst of its benchmarks')."""
    outcomes: dict[str, str | None] = {}
    gates: dict[str, list[str | None]] = {}
    for prof in report["profiles"].values():
        for bench in prof["benchmarks"]:
            outcomes.setdefault(bench["nodeid"], bench.get("outcome"))
            gates.setdefault(bench["nodeid"], []).append("died" if bench.get("server_died") else bench.get("gate"))
    for ab in report.get("ab", ()):
        outcomes.setdefault(ab["nodeid"], ab.get("outcome"))
        gates.setdefault(ab["nodeid"], []).append(ab.get("gate"))
    if not outcomes:
        return ""
    rows = []
    for nodeid, outcome in outcomes.items():
        seen = gates[nodeid]
        badge = (_badge("regressed", "server died") if "died" in seen
                 else _badge(worst(seen)))  # type: ignore[arg-type]
        rows.append(f'<tr><td>{html.escape(nodeid)}</td><td class="outcome-{outcome or "none"}">'
                    f'{html.escape(outcome or "not finished")}</td><td>{badge}</td></tr>')
    return ("<h2>Tests</h2><table><tr><th>test</th><th>outcome</th><th>gate</th></tr>" + "".join(rows)
            + "</table>")


def _fmt_num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ab_card(ab: dict[str, Any]) -> str:
    from pytest_sglang.report.abchart import ratio_svg, rounds_svg

    checks = [c for comp in ab.get("checks", []) for c in comp.get("checks", [])]
    errors = [e for comp in ab.get("checks", []) for e in comp.get("errors", [])]
    how = (f"{ab['pairs']} pairs interleaved" if ab["together"]
           else f"bracketed, {ab['pairs']} rounds, drift {ab.get('drift_pct') or 0.0:+.1f}%")
    same = " (A/A: the same server twice)" if ab.get("same_server") else ""
    out = [f'<div class="card ab"><h3>{_badge(ab.get("gate"))} {html.escape(ab["second"])} vs '
           f'{html.escape(ab["first"])}{same}</h3><p class="small">{html.escape(ab["nodeid"])}: '
           f'<span class="outcome-{ab.get("outcome") or "none"}">{html.escape(ab.get("outcome") or "not finished")}'
           f"</span>; {html.escape(how)}</p>"]
    if checks:
        out.append("<table><tr><th>metric</th><th>ratio</th><th>interval</th><th>p</th><th>pairs</th>"
                   "<th>tolerance</th><th>verdict</th></tr>")
        for c in checks:
            ci = c.get("ci")
            interval = f"{c['confidence']:.0%} CI {ci[0]:.3f}-{ci[1]:.3f}" if ci else "-"
            out.append(f"<tr><td>{html.escape(c['metric'])}</td><td class='num'>{_fmt_num(c.get('ratio'), '.3f')}x"
                       f"</td><td>{interval}</td><td class='num'>{_fmt_num(c.get('p_value'), '.3f')}</td>"
                       f"<td class='num'>{c.get('pairs', '-')}</td><td>{html.escape(c.get('tolerance') or '-')}</td>"
                       f"<td>{_check_badge(c.get('status'))}</td></tr>"
                       f"<tr><td colspan='7' class='msg'>{html.escape(c.get('message') or '')}</td></tr>")
        out.append("</table>")
    else:
        ratio, ci = ab["ratio"].get("output_throughput"), ab["ci"].get("output_throughput")
        out.append(f"<p>output_throughput {_fmt_num(ratio, '.3f')}x"
                   + (f" ({ab['confidence']:.0%} CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
                   + "; not checked (the test called no check())</p>")
    out += [f'<p class="msg">{html.escape(e)}</p>' for e in errors]
    tput = next((c for c in checks if c["metric"] == "output_throughput"), None)
    chart = ratio_svg(ab, tput) if ab["together"] else rounds_svg(ab)
    out.append((chart or "") + "</div>")
    return "".join(out)


def _ab_section(report: dict[str, Any]) -> str:
    runs = report.get("ab") or []
    return ("<h2>A/B comparisons</h2>" + "".join(_ab_card(ab) for ab in runs)) if runs else ""


def _history(report: dict[str, Any]) -> str:
    """The run history: where this run went, each step found (a badge by its direction), each series plotted."""
    from pytest_sglang.report.historychart import history_charts

    hist = report.get("history")
    lines = history_lines(report)
    if not hist or not lines:
        return ""
    css = ' class="died"' if hist.get("error") else ""  # this run's figures were not recorded: say it in red
    out = [f"<h2>Run history</h2><p{css}>{html.escape(lines[0])}</p>"]
    steps = hist.get("steps", [])
    if steps:
        out.append('<ul class="verdicts">')
        for st in steps:
            gate = "regressed" if st["status"] == "regressed" else "passed"
            out.append(f'<li class="verdict-{gate}">{_badge(gate, st["status"].upper())} '
                       f'{html.escape(step_line(st).rsplit(": ", 1)[0])}</li>')
        out.append("</ul>")
    out += [f'<p class="small">{html.escape(line.removeprefix("history: "))}</p>' for line in lines[1 + len(steps):]]
    charts = history_charts(hist)
    short = len(hist.get("series", [])) - len(charts)
    if short:
        out.append(f'<p class="small">{short} series with a single run so far: plotted from their second run</p>')
    return "".join(out + charts)


def _benchmarks(report: dict[str, Any]) -> str:
    rows = []
    for name, prof in report["profiles"].items():
        for bench in prof["benchmarks"]:
            cells = bench_cells(bench)
            gate = "regressed" if bench.get("server_died") else bench.get("gate")
            rows.append(f"<tr><td>{html.escape(name)}</td>"
                        + "".join(f"<td>{html.escape(c)}</td>" for c in cells[:-1])
                        + f"<td>{_badge(gate, cells[-1] if cells[-1] != '-' else None)}</td></tr>")
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS if h != "startup s")
    members = "".join(f"<li class='small'>{html.escape(line)}</li>" for line in member_lines(report))
    spread = f"<h3>What each fleet member served</h3><ul>{members}</ul>" if members else ""
    return f"<h2>Benchmarks</h2>{_bars(report)}<table><tr>{head}</tr>{''.join(rows)}</table>{spread}"


def _href(path: str, base: Path | None) -> str:
    """A link to a log: relative to the page's folder where it lies under it (an uploaded CI artifact keeps the
    link working), else a file URI."""
    target = Path(path)
    if base is not None and target.is_absolute():
        try:
            return target.relative_to(base.resolve()).as_posix()
        except ValueError:
            pass
    return target.as_uri() if target.is_absolute() else target.as_posix()


def _servers(report: dict[str, Any], base: Path | None) -> str:
    rows = []
    for name, prof in report["profiles"].items():
        if prof.get("error"):
            state = f'<span class="died">failed to start</span>: {html.escape(prof.get("gate_reason") or "")}'
        elif prof.get("died"):
            state = f'<span class="died">server died during the session</span>: {html.escape(prof["died"])}'
        else:
            state = html.escape(prof.get("outcome") or "-")
        log = prof.get("log_path")
        link = f'<a href="{html.escape(_href(log, base))}">{html.escape(Path(log).name)}</a>' if log else "-"
        startup = _fmt_num(prof.get("startup_seconds"), ".1f")
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{html.escape(prof.get('kind') or '-')}</td>"
                    f"<td>{html.escape(prof.get('server_version') or '-')}</td>"
                    f"<td>{html.escape(prof.get('origin') or '-')}</td><td class='num'>{startup}</td>"
                    f"<td class='wrap'>{state}</td><td>{link}</td></tr>")
    if not rows:
        return ""
    return ("<h2>Servers</h2><table><tr><th>profile</th><th>kind</th><th>version</th><th>origin</th>"
            "<th>startup s</th><th>state</th><th>log</th></tr>" + "".join(rows) + "</table>")


def _notes(report: dict[str, Any]) -> str:
    notes = [f"{name}: {n}" for name, prof in report["profiles"].items() for b in prof["benchmarks"]
             for n in b.get("notes", [])]
    return ("<h2>Notes</h2><ul>" + "".join(f"<li class='small'>{html.escape(n)}</li>" for n in notes)
            + "</ul>") if notes else ""


def html_page(report: dict[str, Any], base: Path | None = None) -> str:
    """The report as one self-contained page (inline CSS and SVG, no script); ``base``: the page's folder, which
    the links to the server logs are relative to."""
    meta = " · ".join(html.escape(str(v)) for v in (report.get("machine"), report.get("commit") and
                                                    f"commit {report['commit']}", report["created"]) if v)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>pytest-sglang report</title>"
            f"<style>{_CSS}</style></head><body>"
            f"<h1>pytest-sglang report</h1><p class='meta'>{meta}</p>{_verdicts(report)}{_tests(report)}"
            f"{_ab_section(report)}{_history(report)}{_benchmarks(report)}{_sweep_charts(report)}"
            f"{_servers(report, base)}{_telemetry_charts(report)}{_notes(report)}</body></html>\n")


def write_html(path: str | Path, report: dict[str, Any]) -> Path:
    path = Path(path)
    path.write_text(html_page(report, path.parent), encoding="utf-8")
    return path
