"""What a session measured, as a JSON report, a terminal table, a GitHub step-summary table and an HTML page.

Knows nothing about pytest: it reads the session ledger (startup records, benchmark results, baseline
comparisons) when the plugin asks for the report at the end. The JSON schema is documented in docs/report-schema.md.

Every benchmark carries a ``gate`` (baseline/checks.py ``gate_of``): ``passed``, ``regressed``, ``not-judged``
(failed requests, a client-bound run, too noisy to judge, no baseline; with ``gate_reason``), ``recorded``, or
null when nothing was checked; a profile whose server could not start is ``not-judged`` too. The report's
top-level ``gate`` lists what regressed and what could not be judged, so a CI job can block on the first and
warn on the second; the terminal summary, the step summary and junitxml (``sglang_gate``) say the same.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_sglang.baseline import Comparison, Machine, gate_of
from pytest_sglang.bench import BenchResult
from pytest_sglang.bench.sweep import CURVE_X, CURVE_Y, knee_index
from pytest_sglang.session import SessionLedger

SCHEMA = "pytest-sglang-report"
SCHEMA_VERSION = 1

# The figures shown per benchmark in the tables and recorded as junitxml properties.
HEADLINE = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "median_e2e_latency_ms",
            "accept_length", "goodput")
_CHECK_DETAIL = ("rounds", "baseline_rounds", "method", "p_value", "ci_pct", "cv_pct", "baseline_cv_pct", "reason")


def _baseline_view(comps: Iterable[Comparison]) -> dict[str, Any]:
    view: dict[str, Any] = {}
    for comp in comps:
        for check in comp.checks:
            detail = check.to_dict()
            view[check.metric] = {"baseline": check.baseline, "current": check.current,
                                  "change_pct": check.change_pct, "tolerance": str(check.tolerance),
                                  "status": check.status, **{k: detail[k] for k in _CHECK_DETAIL}}
        if comp.recorded and comp.entry:
            for metric, value in comp.entry.metrics.items():
                n = len(comp.entry.samples.get(metric, [value]))
                view.setdefault(metric, {"baseline": value, "current": value, "change_pct": 0.0,
                                         "tolerance": None, "status": "recorded", "rounds": n,
                                         "baseline_rounds": n})
    return view


def _profile_gate(record: Any, server_checks: Sequence[Comparison]) -> tuple[str | None, str | None]:
    if record is not None and not record.ready:
        return "not-judged", f"the server could not start: {record.cause or record.outcome}"
    return gate_of(None, server_checks)


def _sweeps(benches: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The curves of this profile: benchmarks of one test tagged by a sweep, in load order, with the knee."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for b in benches:
        point = b["result"].get("sweep")
        if point:
            groups.setdefault((b["test_id"], point["param"]), []).append(b)
    out = []
    for (test_id, param), items in groups.items():
        items.sort(key=lambda b: b["result"]["sweep"]["value"])
        points = [{"value": b["result"]["sweep"]["value"], CURVE_Y: b["result"][CURVE_Y],
                   CURVE_X: b["result"][CURVE_X], "median_ttft_ms": b["result"]["median_ttft_ms"],
                   "median_tpot_ms": b["result"]["median_tpot_ms"], "goodput": b["result"].get("goodput"),
                   "gate": b.get("gate")} for b in items]
        i = knee_index([p[CURVE_X] for p in points], [p[CURVE_Y] for p in points])
        out.append({"test_id": test_id, "param": param, "x": CURVE_X, "y": CURVE_Y, "points": points,
                    "knee": points[i]["value"] if i is not None else None})
    return out


def _bench_key(bench: dict[str, Any]) -> str:
    """The test id, and a sweep point's load: ``t.py::test_curve@concurrency=4`` (its baseline key)."""
    point = bench["result"].get("sweep")
    return f"{bench['test_id']}@{point['param']}={point['value']:g}" if point else bench["test_id"]


def _gate_summary(profiles: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {"status": None, "passed": 0, "recorded": 0, "unchecked": 0, "regressed": [],
                               "not_judged": []}
    for name, prof in profiles.items():
        items = [(_bench_key(b), b["nodeid"], b.get("gate"), b.get("gate_reason")) for b in prof["benchmarks"]]
        if prof.get("gate"):
            items.append(("(server)", None, prof["gate"], prof["gate_reason"]))
        for test_id, nodeid, gate, reason in items:
            if gate in ("regressed", "not-judged"):
                key = "regressed" if gate == "regressed" else "not_judged"
                summary[key].append({"profile": name, "test_id": test_id, "nodeid": nodeid, "reason": reason})
            else:
                summary["unchecked" if gate is None else gate] += 1
    if summary["regressed"]:
        summary["status"] = "regressed"
    elif summary["not_judged"]:
        summary["status"] = "not-judged"
    elif summary["passed"]:
        summary["status"] = "passed"
    return summary


def build_report(ledger: SessionLedger, *, machine: Machine | None = None, commit: str | None = None,
                 baseline_path: str | None = None, created: datetime | None = None) -> dict[str, Any]:
    profiles: dict[str, Any] = {}
    for name in ledger.profiles:
        record = ledger.startups.get(name)
        server_checks = [c for c in ledger.startup_checks if c.profile == name]
        benches = []
        for b in ledger.benches:
            if b.profile != name:
                continue
            gate, reason = gate_of(b.result, b.comparisons)
            benches.append({
                "test_id": b.test_id,
                "nodeid": b.nodeid,
                "outcome": b.outcome,
                "gate": gate,
                "gate_reason": reason,
                "result": b.result.to_dict(),
                "baseline": _baseline_view(b.comparisons),
                "notes": [n for c in b.comparisons for n in c.notes],
                "warnings": [w for c in b.comparisons for w in c.warnings],
            })
        server_gate, server_reason = _profile_gate(record, server_checks)
        profiles[name] = {
            "kind": record.kind if record else None,
            "model": record.model if record else None,
            "server_version": ledger.server_versions.get(name),
            "origin": record.origin if record else None,
            "outcome": record.outcome if record else None,
            "startup_seconds": record.startup_seconds if record else None,
            "phases": dict(record.phases) if record else {},
            "log_path": str(record.log_path) if record and record.log_path else None,
            "error": record.error if record and not record.ready else None,
            "gate": server_gate,
            "gate_reason": server_reason,
            "startup_baseline": _baseline_view(server_checks).get("startup_seconds"),
            "benchmarks": benches,
            "sweeps": [],
        }
    return summarize({
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": (created or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "machine": machine.name if machine else None,
        "machine_key": machine.key if machine else None,
        "commit": commit,
        "baseline_file": baseline_path,
        "gate": None,
        "profiles": profiles,
    })


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """(Re)compute what a report derives from its benchmarks: each profile's ``sweeps`` and the top-level
    ``gate``; call it again after folding other reports' benchmarks in (pytest-xdist workers')."""
    for prof in report["profiles"].values():
        prof["sweeps"] = _sweeps(prof["benchmarks"])
    report["gate"] = _gate_summary(report["profiles"])
    return report


def write_json(path: str | Path, report: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _delta(bench: dict[str, Any], metric: str = "output_throughput") -> str:
    view = bench["baseline"].get(metric)
    if not view or view.get("baseline") is None:
        return "no baseline"
    if view["status"] == "recorded":
        return "recorded"
    pct = view.get("change_pct")
    mark = {"regressed": " REGRESSED", "improved": " improved", "missing": " MISSING",
            "not-judged": " not judged"}.get(view["status"], "")
    p = f", p={view['p_value']:.3f}" if view.get("p_value") is not None else ""
    return (f"{pct:+.1f}%{mark}" if pct is not None else "?") + f" vs {_fmt(view['baseline'])}{p}"


def _test_label(bench: dict[str, Any]) -> str:
    name = bench["test_id"].rsplit("::", 1)[-1]
    point = bench["result"].get("sweep")
    if point:
        short = {"concurrency": "c", "request_rate": "rate"}.get(point["param"], point["param"])
        name += f" @{short}={point['value']:g}"
    return name


def _throughput(r: dict[str, Any]) -> str:
    text = _fmt(r["output_throughput"])
    if r.get("num_rounds", 1) > 1:
        cv = (r.get("spread") or {}).get("output_throughput", {}).get("cv_pct")
        text += f" ({r['num_rounds']} rounds" + (f", CV {cv:.1f}%)" if cv is not None else ")")
    if r["failed"]:
        text += f" ({r['failed']} failed)"
    if r.get("client_bound"):
        text += " (client-bound)"
    return text


_GATE_WORD = {"passed": "passed", "regressed": "REGRESSED", "not-judged": "not judged", "recorded": "recorded"}


def _rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, prof in report["profiles"].items():
        startup = _fmt(prof["startup_seconds"]) if prof["startup_seconds"] is not None else "-"
        if prof.get("error"):
            startup = "FAILED"
        benches = prof["benchmarks"] or [None]
        for bench in benches:
            if bench is None:
                rows.append([name, startup, "", "-", "-", "-", "-", "", _GATE_WORD.get(prof.get("gate") or "", "-")])
                continue
            r = bench["result"]
            rows.append([
                name, startup, _test_label(bench), _throughput(r), _fmt(r["median_ttft_ms"]),
                _fmt(r["median_itl_ms"], 2), _fmt(r["accept_length"], 2), _delta(bench),
                _GATE_WORD.get(bench.get("gate") or "", "-"),
            ])
    return rows


HEADERS = ["profile", "startup s", "test", "out tok/s", "TTFT ms (p50)", "ITL ms (p50)", "accept len",
           "tok/s vs baseline", "gate"]


def gate_lines(report: dict[str, Any]) -> list[str]:
    """``gate: 1 regressed, 2 not judged, 3 passed``, then one line per test that regressed or was not judged."""
    g = report.get("gate") or {}
    if not (g.get("regressed") or g.get("not_judged") or g.get("passed")):
        return []
    counts = [f"{len(g['regressed'])} regressed", f"{len(g['not_judged'])} not judged", f"{g['passed']} passed"]
    if g.get("recorded"):
        counts.append(f"{g['recorded']} recorded")
    out = ["gate: " + ", ".join(counts)]
    for key, word in (("regressed", "REGRESSED"), ("not_judged", "NOT JUDGED")):
        for item in g[key]:
            out.append(f"{word} {item['profile']} {item['test_id']}: {item['reason'] or ''}".rstrip(": "))
    return out


def terminal_lines(report: dict[str, Any]) -> list[str]:
    rows = _rows(report)
    if not rows:
        return []
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    out = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    for name, prof in report["profiles"].items():  # phases: the plugin's "sglang servers" section shows them
        sb = prof.get("startup_baseline")
        if sb and sb.get("baseline") is not None and sb.get("change_pct") is not None:
            out.append(f"{name} startup vs baseline {sb['baseline']:.1f}s: {sb['change_pct']:+.1f}% "
                       f"({sb['status']})")
        for sweep in prof.get("sweeps", []):
            knee = f", knee at {sweep['param']}={sweep['knee']:g}" if sweep["knee"] is not None else ""
            curve = "; ".join(f"{p['value']:g}: {p[CURVE_Y]:.1f} tok/s at {p[CURVE_X]:.0f} ms" for p in sweep["points"])
            out.append(f"{name} sweep {sweep['test_id'].rsplit('::', 1)[-1]} over {sweep['param']}{knee}: {curve}")
        for bench in prof["benchmarks"]:
            for note in bench["notes"]:
                out.append(f"note: {note}")
    return out + gate_lines(report)


def markdown(report: dict[str, Any]) -> str:
    rows = _rows(report)
    lines = ["### pytest-sglang benchmarks", ""]
    if report.get("machine"):
        lines += [f"Machine: {report['machine']}" + (f", commit {report['commit']}" if report.get("commit") else ""),
                  ""]
    lines.append("| " + " | ".join(HEADERS) + " |")
    lines.append("|" + "|".join("---" for _ in HEADERS) + "|")
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    gates = gate_lines(report)
    if gates:
        lines += ["", f"**{gates[0]}**", ""]
        lines += [f"- {line}" for line in gates[1:]]
    return "\n".join(lines) + "\n"


def append_step_summary(report: dict[str, Any], path: str | None = None) -> Path | None:
    target = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(markdown(report) + "\n")
    return Path(target)


def junit_properties(result: BenchResult, comparisons: Iterable[Comparison] = ()) -> list[tuple[str, object]]:
    """A benchmark's figures as junitxml properties; ``sglang_gate`` when its requests failed."""
    props: list[tuple[str, object]] = [(f"sglang_{m}", getattr(result, m)) for m in HEADLINE
                                       if getattr(result, m) is not None]
    props += [("sglang_completed", result.completed), ("sglang_failed", result.failed)]
    if result.num_rounds > 1:
        props.append(("sglang_rounds", result.num_rounds))
        spread = result.spread.get("output_throughput")
        if spread is not None and spread.cv_pct is not None:
            props.append(("sglang_output_throughput_cv_pct", round(spread.cv_pct, 2)))
    if result.client_bound:
        props.append(("sglang_client_bound", True))
    comps = list(comparisons)
    for comp in comps:
        props += check_properties(comp)
    if result.failed and not comps:
        gate, reason = gate_of(result, [])
        props += [("sglang_gate", gate), ("sglang_gate_reason", reason)]
    return props


def check_properties(comp: Comparison) -> list[tuple[str, object]]:
    """One ``check()`` as junitxml properties: each checked metric's baseline, and the gate with its reason."""
    props: list[tuple[str, object]] = [(f"sglang_baseline_{c.metric}", c.baseline) for c in comp.checks
                                       if c.baseline is not None]
    props.append(("sglang_gate", comp.gate))
    if comp.gate_reason:
        props.append(("sglang_gate_reason", comp.gate_reason))
    return props


def startup_failure_properties(cause: str | None) -> list[tuple[str, object]]:
    """A test that could not run because its server did not start: not judged, not regressed."""
    return [("sglang_gate", "not-judged"), ("sglang_gate_reason", f"the server could not start: {cause or '?'}")]


# ---- HTML ------------------------------------------------------------------------------------------------

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
           f'<text x="{left}" y="22" font-weight="bold">output throughput (tok/s); '
           'line: baseline</text>']
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
            f"<table><tr>{head}</tr>{rows_html}</table></body></html>\n")


def write_html(path: str | Path, report: dict[str, Any]) -> Path:
    path = Path(path)
    path.write_text(html_page(report), encoding="utf-8")
    return path
