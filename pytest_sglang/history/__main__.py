"""``python -m pytest_sglang.history PATH [--json] [--metric NAME ...]``: the series of a run history and the
steps found in them. ``--json`` prints only the steps, a JSON list of Step.to_dict() objects. A PATH that is not
a usable history store: its message on stderr, exit status 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime, timezone

from pytest_sglang.baseline.directions import unit
from pytest_sglang.errors import HistoryError
from pytest_sglang.history.steps import DEFAULT_METRICS, Series, Step, find_steps
from pytest_sglang.history.store import HistoryStore, StoredRun


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pytest_sglang.history", description=__doc__)
    parser.add_argument("path", metavar="PATH", help="the history store that pytest --sglang-history=PATH wrote")
    parser.add_argument("--json", action="store_true", help="print the steps as a JSON list, nothing else")
    parser.add_argument("--metric", action="append", metavar="NAME",
                        help="search this metric's series (repeatable; 'all' for every stored metric; default: "
                             f"{', '.join(DEFAULT_METRICS)})")
    return parser


def _short(commit: str | None) -> str:
    return commit[:10] if commit else "-"


def _column(metric: str) -> str:
    u = unit(metric)
    return f"{metric} ({u})" if u and not metric.endswith(f"_{u}") else metric


def _figure(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 100 else f"{value:.1f}"


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M")


def render(runs: Sequence[StoredRun], series: Sequence[Series], steps: Sequence[Step], path: str) -> list[str]:
    """Per benchmark (profile, test, machine, workload): one row per run with each metric's median, then the
    steps found in its series."""
    span = f", {_when(runs[0].time)} to {_when(runs[-1].time)} UTC" if runs else ""
    lines = [f"history {path}: {len(runs)} run{'s' if len(runs) != 1 else ''}{span}"]
    groups: dict[tuple[str, str, str, str], list[Series]] = {}
    for s in series:
        groups.setdefault(s.key[:4], []).append(s)
    for (profile, test, machine, workload), members in groups.items():
        lines += ["", f"{profile}  {test}", f"  machine: {machine}", f"  workload: {workload}"]
        metrics = [s.metric for s in members]
        by_run: dict[int, dict[str, float]] = {}
        commits: dict[int, tuple[str | None, float]] = {}
        for s in members:
            for p in s.points:
                by_run.setdefault(p.run_id, {})[s.metric] = p.value
                commits[p.run_id] = (p.commit, p.time)
        header = ["run", "commit", "time (UTC)", *(_column(m) for m in metrics)]
        rows = [[str(run_id), _short(commits[run_id][0]), _when(commits[run_id][1]),
                 *(_figure(values[m]) if m in values else "-" for m in metrics)]
                for run_id, values in sorted(by_run.items())]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        mine = [st for st in steps if (st.profile, st.test, st.machine, st.workload) == (profile, test, machine,
                                                                                        workload)]
        lines.append("  steps: " + ("none found" if not mine else ""))
        lines += [f"    {st.describe()} [run id {st.run_id}]" for st in mine]
    if not series:
        lines.append("no series yet: no run with a benchmark has been appended")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    metrics = None if args.metric and "all" in args.metric else (args.metric or DEFAULT_METRICS)
    try:
        with HistoryStore.open(args.path, write=False) as store:
            runs, rows = store.runs(), store.rows(metrics, rounds=False)
    except HistoryError as exc:
        print(f"python -m pytest_sglang.history: {exc}", file=sys.stderr)
        return 2
    series, steps = find_steps(rows, metrics)
    if args.json:
        print(json.dumps([s.to_dict() for s in steps], indent=2))
    else:
        print("\n".join(render(runs, series, steps, str(store.path))))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # piped into head: the reader has what it wanted
        sys.stderr.close()
        sys.exit(0)
