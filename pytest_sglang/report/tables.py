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
    name: str = bench["test_id"].rsplit("::", 1)[-1]
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
            rows.append([name, startup, *bench_cells(bench)])
    return rows


def bench_cells(bench: dict[str, Any]) -> list[str]:
    """A benchmark's cells from ``test`` on (HEADERS[2:]); a benchmark its server died in shows no figures."""
    r = bench["result"]
    if bench.get("server_died"):
        failed = f" ({r['failed']} requests failed)" if r.get("failed") else ""
        return [_test_label(bench), f"server died{failed}", "-", "-", "-", "-", "server died"]
    return [_test_label(bench), _throughput(r), _fmt(r["median_ttft_ms"]), _fmt(r["median_itl_ms"], 2),
            _fmt(r["accept_length"], 2), _delta(bench), _GATE_WORD.get(bench.get("gate") or "", "-")]


HEADERS = ["profile", "startup s", "test", "out tok/s", "TTFT ms (p50)", "ITL ms (p50)", "accept len",
           "tok/s vs baseline", "gate"]


def telemetry_text(r: dict[str, Any]) -> str | None:
    """A result's GPU and server figures in one phrase; None where none was measured."""
    parts = []
    if r.get("energy_per_output_token_j") is not None:
        per_joule = r.get("output_tokens_per_joule")
        parts.append(f"{r['energy_per_output_token_j']:.4g} J/output token"
                     + (f" ({per_joule:.4g} tok/J)" if per_joule is not None else ""))
    for key, label in (("gpu_util_mean_pct", "GPU util {:.0f}%"), ("gpu_power_mean_w", "{:.0f} W"),
                       ("gpu_memory_peak_mib", "{:.0f} MiB peak"), ("gpu_sm_clock_mean_mhz", "SM {:.0f} MHz"),
                       ("server_queue_mean", "queue {:.1f}"), ("server_kv_usage_peak", "KV peak {:.0%}")):
        if r.get(key) is not None:
            parts.append(label.format(r[key]))
    return ", ".join(parts) or None


def _telemetry_lines(report: dict[str, Any]) -> list[str]:
    out = []
    for name, prof in report["profiles"].items():
        for bench in prof["benchmarks"]:
            text = telemetry_text(bench["result"])
            if text:
                out.append(f"{name} {_test_label(bench)}: {text}")
    return out


def _cache_lines(report: dict[str, Any]) -> list[str]:
    """Per benchmark whose server said: ``p test_x: cache='fresh', the server's hit rate per round 0% 0% 0%``
    (its prefix-cache hits over the prompt tokens, bench/cache.py)."""
    out = []
    for name, prof in report["profiles"].items():
        for bench in prof["benchmarks"]:
            r = bench["result"]
            rates = [x.get("server_cache_hit_rate") for x in r.get("rounds") or [r]]
            if any(x is not None for x in rates):
                shown = " ".join("-" if x is None else f"{x:.0%}" for x in rates)
                out.append(f"{name} {_test_label(bench)}: cache={r.get('cache')!r}, the server's hit rate per "
                           f"round {shown}")
    return out


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


def ab_lines(report: dict[str, Any]) -> list[str]:
    """One line per A/B run: ``A/B candidate vs main: output_throughput 0.912x (95% CI 0.89-0.93), 10 pairs
    interleaved, p=0.002: regressed``."""
    out = []
    for ab in report.get("ab", ()):
        ratio, ci, p = (ab["ratio"].get("output_throughput"), ab["ci"].get("output_throughput"),
                        ab["p_value"].get("output_throughput"))
        shown = f"output_throughput {ratio:.3f}x" if ratio is not None else "no throughput ratio"
        if ci:
            shown += f" ({ab['confidence']:.0%} CI {ci[0]:.3f}-{ci[1]:.3f})"
        how = f"{ab['pairs']} pairs interleaved" if ab["together"] else \
            f"bracketed, {ab['pairs']} rounds, drift {ab['drift_pct'] or 0.0:+.1f}%"
        pval = f", p={p:.3f}" if p is not None else ""
        out.append(f"A/B {ab['second']} vs {ab['first']}: {shown}, {how}{pval}: {_GATE_WORD.get(ab['gate'] or '', '-')}"
                   f"  [{ab['nodeid']}]")
    return out


def step_line(step: dict[str, Any]) -> str:
    """``output_throughput stepped down 4.1 % at run 37 (commit abc1234, p=0.003) [base / t.py::test_x]:
    regressed``: one step of the run history (history/steps.py Step.to_dict)."""
    way = "up" if step["after"] > step["before"] else "down"
    commit = f"commit {step['commit']}" if step.get("commit") else "no commit"
    return (f"{step['metric']} stepped {way} {abs(step['change_pct']):.1f} % at run {step['index']} ({commit}, "
            f"p={step['p_value']:.3g}) [{step['profile']} / {step['test']}]: {step['status']}")


def history_lines(report: dict[str, Any]) -> list[str]:
    """What the run history says: where this run went, how many runs each benchmark's series has, each step
    found in them, and the benchmarks left out; nothing without --sglang-history."""
    hist = report.get("history")
    if not hist:
        return []
    if hist.get("error"):
        return [f"history {hist['path']}: this run was not appended: {hist['error']}"]
    runs: dict[str, int] = {}  # "profile / test" -> the most runs of its series
    for series in hist.get("series", []):
        key = f"{series['profile']} / {series['test']}"
        runs[key] = max(runs.get(key, 0), series["runs"])
    commit = f" (commit {hist['commit']})" if hist.get("commit") else ""
    steps = hist.get("steps", [])
    counts = "; ".join(f"{key}: {n} run{'s' if n != 1 else ''}" for key, n in runs.items()) or "no series"
    out = [f"history {hist['path']}: run {hist['run_id']} appended{commit}; {counts}; "
           f"{len(steps)} step{'s' if len(steps) != 1 else ''} found"]
    out += [f"history: {step_line(step)}" for step in steps]
    out += [f"history: left out {s['profile']} / {s['test']}: {s['reason']}" for s in hist.get("skipped", [])]
    return out


def member_lines(report: dict[str, Any]) -> list[str]:
    """Per benchmark through a fleet's router: ``p test_x: worker0 33 requests (52 %, 4224 tok out), worker1 ...``
    (each member's own /metrics, bench/members.py)."""
    out = []
    for name, prof in report["profiles"].items():
        for bench in prof["benchmarks"]:
            loads = bench["result"].get("members") or {}
            totals: dict[str, int] = {}  # per role: a request reaches one prefill and one decode member
            for load in loads.values():
                totals[load["role"]] = totals.get(load["role"], 0) + (load["requests"] or 0)
            parts = [f"{member} ({load['role']}) {load['requests'] if load['requests'] is not None else '?'} requests"
                     + (f" ({100.0 * load['requests'] / totals[load['role']]:.0f} % of the {load['role']}s)"
                        if totals[load["role"]] and load["requests"] is not None else "")
                     + f", {load['prompt_tokens'] if load['prompt_tokens'] is not None else '?'} tok in, "
                       f"{load['generation_tokens'] if load['generation_tokens'] is not None else '?'} tok out"
                     for member, load in loads.items()]
            if parts:
                out.append(f"{name} {_test_label(bench)}: " + "; ".join(parts))
    return out


def terminal_lines(report: dict[str, Any]) -> list[str]:
    rows = _rows(report)
    if not rows:
        return ab_lines(report) + history_lines(report) + gate_lines(report)
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
    out += [f"telemetry: {line}" for line in _telemetry_lines(report)]
    out += [f"prefix cache: {line}" for line in _cache_lines(report)]
    out += [f"fleet members: {line}" for line in member_lines(report)]
    return out + ab_lines(report) + history_lines(report) + gate_lines(report)


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
    telemetry = _telemetry_lines(report)
    if telemetry:
        lines += ["", "GPU and server telemetry (medians of the rounds):", ""]
        lines += [f"- {line}" for line in telemetry]
    cached = _cache_lines(report)
    if cached:
        lines += ["", "Prefix cache (the server's hits over the prompt tokens):", ""]
        lines += [f"- {line}" for line in cached]
    ab_shown = ab_lines(report)
    if ab_shown:
        lines += ["", *(f"- {line}" for line in ab_shown)]
    lines += _history_markdown(report)
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


def _history_markdown(report: dict[str, Any]) -> list[str]:
    """The run history for the step summary: where this run went, then a table of the steps found."""
    shown = history_lines(report)
    hist = report.get("history")
    if not shown or not hist:
        return []
    lines = ["", "#### Run history", "", shown[0]]
    steps = hist.get("steps", [])
    if steps:
        lines += ["", "| metric | profile / test | change | at run | commit | p | before → after | |",
                  "|---|---|---|---|---|---|---|---|"]
        for st in steps:
            cells = [st["metric"], f"{st['profile']} / {st['test']}", f"{st['change_pct']:+.1f} %", str(st["index"]),
                     st.get("commit") or "-", f"{st['p_value']:.3g}", f"{st['before']:.4g} → {st['after']:.4g}",
                     "**regressed**" if st["status"] == "regressed" else st["status"]]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += [f"- {line.removeprefix('history: ')}" for line in shown[1 + len(steps):]]
    return lines
