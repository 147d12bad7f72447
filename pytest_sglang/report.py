"""What a session measured, as a JSON report, a terminal table, a GitHub step-summary table and an HTML page.

Knows nothing about pytest: it reads the session ledger (startup records, benchmark results, baseline
comparisons) when the plugin asks for the report at the end. The JSON schema is documented in docs/report-schema.md.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_sglang.baseline import Comparison, Machine
from pytest_sglang.bench import BenchResult
from pytest_sglang.session import SessionLedger

SCHEMA = "pytest-sglang-report"
SCHEMA_VERSION = 1

# The figures shown per benchmark in the tables and recorded as junitxml properties.
HEADLINE = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "median_e2e_latency_ms",
            "accept_length")


def _baseline_view(comps: Iterable[Comparison]) -> dict[str, Any]:
    view: dict[str, Any] = {}
    for comp in comps:
        for check in comp.checks:
            view[check.metric] = {"baseline": check.baseline, "current": check.current,
                                  "change_pct": check.change_pct, "tolerance": str(check.tolerance),
                                  "status": check.status}
        if comp.recorded and comp.entry:
            for metric, value in comp.entry.metrics.items():
                view.setdefault(metric, {"baseline": value, "current": value, "change_pct": 0.0,
                                         "tolerance": None, "status": "recorded"})
    return view


def build_report(ledger: SessionLedger, *, machine: Machine | None = None, commit: str | None = None,
                 baseline_path: str | None = None, created: datetime | None = None) -> dict[str, Any]:
    profiles: dict[str, Any] = {}
    for name in ledger.profiles:
        record = ledger.startups.get(name)
        server_checks = [c for c in ledger.startup_checks if c.profile == name]
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
            "startup_baseline": _baseline_view(server_checks).get("startup_seconds"),
            "benchmarks": [
                {
                    "test_id": b.test_id,
                    "nodeid": b.nodeid,
                    "outcome": b.outcome,
                    "result": b.result.to_dict(),
                    "baseline": _baseline_view(b.comparisons),
                    "notes": [n for c in b.comparisons for n in c.notes],
                }
                for b in ledger.benches if b.profile == name
            ],
        }
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": (created or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "machine": machine.name if machine else None,
        "machine_key": machine.key if machine else None,
        "commit": commit,
        "baseline_file": baseline_path,
        "profiles": profiles,
    }


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
    mark = {"regressed": " REGRESSED", "improved": " improved", "missing": " MISSING"}.get(view["status"], "")
    return (f"{pct:+.1f}%{mark}" if pct is not None else "?") + f" vs {_fmt(view['baseline'])}"


def _rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, prof in report["profiles"].items():
        startup = _fmt(prof["startup_seconds"]) if prof["startup_seconds"] is not None else "-"
        if prof.get("error"):
            startup = "FAILED"
        benches = prof["benchmarks"] or [None]
        for bench in benches:
            if bench is None:
                rows.append([name, startup, "", "-", "-", "-", "-", ""])
                continue
            r = bench["result"]
            failed = f" ({r['failed']} failed)" if r["failed"] else ""
            rows.append([
                name, startup, bench["test_id"].rsplit("::", 1)[-1],
                _fmt(r["output_throughput"]) + failed, _fmt(r["median_ttft_ms"]), _fmt(r["median_itl_ms"], 2),
                _fmt(r["accept_length"], 2), _delta(bench),
            ])
    return rows


HEADERS = ["profile", "startup s", "test", "out tok/s", "TTFT ms (p50)", "ITL ms (p50)", "accept len",
           "tok/s vs baseline"]


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
        for bench in prof["benchmarks"]:
            for note in bench["notes"]:
                out.append(f"note: {note}")
    return out


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
    return "\n".join(lines) + "\n"


def append_step_summary(report: dict[str, Any], path: str | None = None) -> Path | None:
    target = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(markdown(report) + "\n")
    return Path(target)


def junit_properties(result: BenchResult, comparisons: Iterable[Comparison] = ()) -> list[tuple[str, object]]:
    props: list[tuple[str, object]] = [(f"sglang_{m}", getattr(result, m)) for m in HEADLINE
                                       if getattr(result, m) is not None]
    props += [("sglang_completed", result.completed), ("sglang_failed", result.failed)]
    for comp in comparisons:
        for check in comp.checks:
            if check.baseline is not None:
                props.append((f"sglang_baseline_{check.metric}", check.baseline))
    return props




def html_page(report: dict[str, Any]) -> str:
    bars: list[tuple[str, float, float | None, str]] = []  # label, tok/s, baseline, status
    for name, prof in report["profiles"].items():
        for bench in prof["benchmarks"]:
            r = bench["result"]
            view = bench["baseline"].get("output_throughput") or {}
            label = f"{name} · {bench['test_id'].rsplit('::', 1)[-1]}"
            bars.append((label, float(r["output_throughput"]), view.get("baseline"), view.get("status", "")))
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
        color = {"regressed": "#d62728", "improved": "#2ca02c", "missing": "#d62728"}.get(status, "#1f77b4")
        svg.append(f'<text x="{left - 8}" y="{y + bar_h * 0.7}" text-anchor="end">{html.escape(label)}</text>')
        svg.append(f'<rect x="{left}" y="{y}" width="{max(value * scale, 1):.1f}" height="{bar_h}" '
                   f'fill="{color}"><title>{value:.1f} tok/s</title></rect>')
        svg.append(f'<text x="{left + value * scale + 6:.1f}" y="{y + bar_h * 0.7}">{value:.1f}</text>')
        if base:
            bx = left + base * scale
            svg.append(f'<line x1="{bx:.1f}" x2="{bx:.1f}" y1="{y - 4}" y2="{y + bar_h + 4}" stroke="black" '
                       f'stroke-width="2" stroke-dasharray="4 2"><title>baseline {base:.1f} tok/s</title></line>')
    svg.append("</svg>")
    table = markdown(report).splitlines()[4:] if report["profiles"] else []
    rows_html = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in line.strip("|").split(" | ")) + "</tr>"
        for line in table[2:])
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
    meta = html.escape(f"{report.get('machine') or ''} {report.get('commit') or ''} {report['created']}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>pytest-sglang report</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}</style></head><body>"
            f"<h1>pytest-sglang report</h1><p>{meta}</p>{''.join(svg)}"
            f"<table><tr>{head}</tr>{rows_html}</table></body></html>\n")


def write_html(path: str | Path, report: dict[str, Any]) -> Path:
    path = Path(path)
    path.write_text(html_page(report), encoding="utf-8")
    return path
