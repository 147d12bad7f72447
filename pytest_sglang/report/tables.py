"""The report as tables: the terminal summary, markdown for $GITHUB_STEP_SUMMARY, and the gate lines."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pytest_sglang.baseline.checks import NO_BASELINE_NOTE
from pytest_sglang.bench.sweep import CURVE_X, CURVE_Y


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
        out += [f"note: {note}" for note in _notes(name, prof, report)]
    return out + gate_lines(report)


def _notes(name: str, prof: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """The benchmarks' notes; "no baseline" once for the profile, naming its tests, not once per check."""
    notes: list[str] = []
    unrecorded: list[tuple[dict[str, Any], str]] = []  # (its benchmark, the note)
    for bench in prof["benchmarks"]:
        for note in bench["notes"]:
            if note.startswith(NO_BASELINE_NOTE):
                unrecorded.append((bench, note))
            else:
                notes.append(note)
    if len(unrecorded) == 1:
        notes.append(unrecorded[0][1])
    elif unrecorded:
        labels = list(dict.fromkeys(_test_label(bench) for bench, _ in unrecorded))
        shown = ", ".join(labels[:6]) + (f" and {len(labels) - 6} more" if len(labels) > 6 else "")
        where = f" in {report['baseline_file']}" if report.get("baseline_file") else ""
        notes.append(f"{NO_BASELINE_NOTE}{len(unrecorded)} checks of {name} on "
                     f"{report.get('machine_key') or 'this machine'}{where} ({shown}); run with "
                     "--sglang-update-baseline to record them")
    return notes


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


