"""Calibrate a regression gate: how noisy is this machine, and which tolerance would never have flaked?

Runs one test N times on one commit, each run its own pytest session (its own server, as CI runs are), reads
every run's per-round figures from `--sglang-report`, and judges every run against every other run through
the plugin's own engine (`pytest_sglang.baseline.judge`, the one place that decides "regressed"): for each
metric and candidate tolerance, the false-positive rate is the share of those same-commit pairs that would
have failed as regressed. It suggests the smallest tolerance with no false positive over all those pairs
(the rule tt-metal#53763 uses), with the bound that zero in P pairs puts on the rate (about 3/P at 95 %
confidence, the rule of three), and a CV limit (`max_cv`) above the noise it saw.

    python benchmarks/calibrate.py --runs 20 -- examples/test_throughput.py::test_decode_throughput \
        --sglang-profile=eagle3

The test should call `sglang_bench(..., rounds=N)` (5 is a good start): the rank test needs rounds on both
sides. The runs use a throwaway baseline file, so the committed one is neither read nor written.

    python benchmarks/calibrate.py --demo --jitter 0.05 --runs 20 --rounds 9 --write benchmarks/RESULTS-gates.md

`--demo` does the whole thing on the bundled simulator with a known per-round jitter, then tests the
suggestion end to end: it records a baseline, runs the unchanged test N times (the gate must pass every time)
and N times with the pacing 10 % slower (the gate must fail at least 19 of 20).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_sglang.baseline import DEFAULT_MAX_CV_PCT, Tolerance, judge  # noqa: E402

GRID = ("0.5%", "1%", "1.5%", "2%", "3%", "4%", "5%", "7.5%", "10%", "15%", "20%", "30%", "2sigma", "3sigma")
METRICS = ("output_throughput", "median_ttft_ms", "median_itl_ms", "median_e2e_latency_ms", "p99_ttft_ms")

Samples = dict[str, list[float]]  # metric -> per-round values of one run
# pytest's exit codes that no later run can change: interrupted, internal error, usage error, no tests collected
HOPELESS_EXITS = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}


class CalibrationError(Exception):
    """A run that every later run would repeat: calibrate stops at the first."""


# ---- running the test --------------------------------------------------------------------------------------


def run_once(pytest_args: Sequence[str], *, cwd: Path, report: Path, baseline: Path, env: dict[str, str],
             timeout: float = 600) -> tuple[int, dict[str, Any] | None, float]:
    """One pytest session: (exit code, its --sglang-report, wall seconds)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args,
           f"--sglang-report={report}", f"--sglang-baseline={baseline}"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    took = time.monotonic() - t0
    if proc.returncode in HOPELESS_EXITS:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise CalibrationError(f"pytest {' '.join(pytest_args)} exited {proc.returncode} "
                               f"({HOPELESS_EXITS[proc.returncode]}), so no run can be calibrated; its output "
                               f"ended:\n{tail}")
    data = json.loads(report.read_text()) if report.is_file() else None
    if data is None:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc.returncode, data, took


def benches(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``profile / test_id`` -> that benchmark's report entry (the last one where a test ran several)."""
    out = {}
    for name, prof in report["profiles"].items():
        for bench in prof["benchmarks"]:
            out[f"{name} / {bench['test_id']}"] = bench
    return out


def samples_of(bench: dict[str, Any], metrics: Sequence[str]) -> Samples:
    result = bench["result"]
    source = result.get("rounds") or [result]
    out: Samples = {}
    for m in metrics:
        values = [r.get(m) for r in source]
        if values and all(isinstance(v, (int, float)) for v in values):
            out[m] = [float(v) for v in values]  # type: ignore[arg-type]
    return out


def gate_of(report: dict[str, Any] | None) -> str:
    if report is None:
        return "no report"
    gates = [b.get("gate") for b in benches(report).values()]
    for word in ("regressed", "not-judged"):
        if word in gates:
            return word
    return "passed" if gates else "no benchmark"


# ---- the calibration ------------------------------------------------------------------------------------


def cv_pct(values: Sequence[float]) -> float | None:
    if len(values) < 2 or not statistics.fmean(values):
        return None
    return statistics.stdev(values) / abs(statistics.fmean(values)) * 100.0


def judged(metric: str, candidate: Sequence[float], baseline: Sequence[float], tol: str,
           max_cv: float | None) -> str:
    return judge(metric, candidate, baseline, Tolerance.parse(metric, tol), max_cv_pct=max_cv, resamples=0).status


def calibrate(runs: Sequence[Samples], metric: str, *, max_cv: float | None = DEFAULT_MAX_CV_PCT,
              grid: Sequence[str] = GRID) -> dict[str, Any]:
    """Noise and false-positive rates of one metric over same-commit runs (every ordered pair)."""
    series = [r[metric] for r in runs if metric in r]
    within = [c for s in series if (c := cv_pct(s)) is not None]
    medians = [statistics.median(s) for s in series]
    pairs = [(b, c) for i, b in enumerate(series) for j, c in enumerate(series) if i != j]
    fp: dict[str, float] = {}
    unjudged = math.nan  # too noisy to judge depends on the runs' spread (max_cv), not on the tolerance
    for tol in grid:
        statuses = [judged(metric, c, b, tol, max_cv) for b, c in pairs]
        judged_pairs = [st for st in statuses if st != "not-judged"]
        # A pair that was not judged is no evidence that the tolerance holds: rates are over judged pairs.
        fp[tol] = sum(st == "regressed" for st in judged_pairs) / len(judged_pairs) if judged_pairs else math.nan
        if math.isnan(unjudged) and pairs and tol.endswith("%"):
            unjudged = (len(statuses) - len(judged_pairs)) / len(pairs)
    relative = [t for t in grid if t.endswith("%")]
    zero = next((t for i, t in enumerate(relative) if all(fp[u] == 0 for u in relative[i:])), None)
    worst_cv = max(within) if within else None
    return {
        "metric": metric, "runs": len(series), "rounds": statistics.median(len(s) for s in series) if series else 0,
        "pairs": len(pairs), "within_cv_median": statistics.median(within) if within else None,
        "within_cv_max": worst_cv, "between_cv": cv_pct(medians), "fp": fp, "not_judged": unjudged,
        "zero_fp": zero, "suggested": zero, "fp_bound": 3 / len(pairs) if pairs else None,
        "suggested_max_cv": max(DEFAULT_MAX_CV_PCT, math.ceil(worst_cv * 1.5)) if worst_cv else DEFAULT_MAX_CV_PCT,
    }


def detection(baseline: Samples, slowed: Sequence[Samples], metric: str, *, max_cv: float | None,
              grid: Sequence[str] = GRID) -> dict[str, float]:
    """Share of the slowed runs each tolerance would have failed against the recorded baseline."""
    out = {}
    for tol in grid:
        statuses = [judged(metric, s[metric], baseline[metric], tol, max_cv) for s in slowed if metric in s]
        out[tol] = sum(st == "regressed" for st in statuses) / len(statuses) if statuses else math.nan
    return out


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def markdown(rows: Sequence[dict[str, Any]], *, grid: Sequence[str] = GRID,
             detect: dict[str, float] | None = None) -> str:
    lines = ["| metric | runs x rounds | CV within a run (median / max) | CV of run medians | suggested tolerance "
             "(no false positive from here up) | its false-positive rate, 95 % bound | suggested max_cv |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        bound = f"< {r['fp_bound']:.1%}" if r["fp_bound"] else "-"
        lines.append(f"| {r['metric']} | {r['runs']} x {r['rounds']:g} | {_fmt(r['within_cv_median'])}% / "
                     f"{_fmt(r['within_cv_max'])}% | {_fmt(r['between_cv'])}% | {r['suggested'] or 'none'} | "
                     f"0 of {r['pairs']} pairs ({bound}) | {r['suggested_max_cv']:g}% |")
    lines += ["", "False-positive rate (share of same-commit pairs judged `regressed`) per tolerance"
              + (", and the share of 10 %-slower runs failed (detection):" if detect else ":"), ""]
    head = ["metric", *grid]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        lines.append(f"| {r['metric']} FP | " + " | ".join(f"{r['fp'][t]:.1%}" for t in grid) + " |")
    if detect:
        lines.append("| output_throughput detection | " + " | ".join(f"{detect[t]:.0%}" for t in grid) + " |")
    return "\n".join(lines) + "\n"


# ---- the demo on the simulator ----------------------------------------------------------------------------

DEMO_TEST = '''
import os


def test_decode(sglang_bench, sglang_baseline):
    r = sglang_bench(num_requests=8, concurrency=8, input_len=16, output_len={output_len}, warmup=1,
                     rounds={rounds})
    sglang_baseline.check(r, output_throughput=os.environ.get("GATE_TOLERANCE", "5%"))
'''


def demo_profile(path: Path, *, decode_tok_s: float, ttft_ms: float, jitter: float) -> None:
    path.write_text(
        "[tool.pytest_sglang.profiles.sim]\nmodel = \"sim-model\"\n"
        f"sim = {{ startup_seconds = 0.3, decode_tok_s = {decode_tok_s}, ttft_ms = {ttft_ms}, jitter = {jitter} }}\n")


def demo(args: argparse.Namespace) -> str:
    work = Path(tempfile.mkdtemp(prefix="sglang-calibrate-"))
    (work / "test_gate.py").write_text(DEMO_TEST.format(output_len=args.output_len, rounds=args.rounds))
    env = dict(os.environ, PYTEST_SGLANG_MACHINE="calibration")
    pytest_args = ["test_gate.py", "--sglang-profile=sim", "--sglang-sim"]
    decode, ttft = args.decode_tok_s, 10.0

    def series(label: str, n: int, baseline: Path, *, extra: Sequence[str] = (), tol: str = "5%") -> list[
            tuple[int, dict[str, Any] | None, float]]:
        out = []
        for i in range(n):
            report = work / f"{label}-{i}.json"
            run_env = dict(env, GATE_TOLERANCE=tol)
            out.append(run_once([*pytest_args, *extra], cwd=work, report=report, baseline=baseline, env=run_env))
            rc, rep, took = out[-1]
            print(f"{label} {i + 1}/{n}: exit {rc}, gate {gate_of(rep)}, {took:.1f} s", flush=True)
        return out

    demo_profile(work / "pyproject.toml", decode_tok_s=decode, ttft_ms=ttft, jitter=args.jitter)
    t0 = time.monotonic()
    calib = series("calibrate", args.runs, work / "none.json")
    runs = [samples_of(b, METRICS) for _, rep, _ in calib if rep for b in benches(rep).values()]
    rows = [calibrate(runs, m) for m in METRICS]
    tput = rows[0]
    tol = args.tolerance or tput["suggested"] or "5%"
    print(f"suggested output_throughput tolerance: {tput['suggested']}; verifying with {tol}", flush=True)

    verify = work / "verify-baselines.json"
    (rc, rec, _), = series("record", 1, verify, extra=["--sglang-update-baseline"], tol=tol)
    assert rc == 0 and rec is not None, "recording the baseline failed"
    base_samples = samples_of(next(iter(benches(rec).values())), METRICS)
    unchanged = series("unchanged", args.runs, verify, tol=tol)
    demo_profile(work / "pyproject.toml", decode_tok_s=decode * 0.9, ttft_ms=ttft / 0.9, jitter=args.jitter)
    slowed = series("slowed", args.runs, verify, tol=tol)
    took = time.monotonic() - t0

    def tally(results: Sequence[tuple[int, dict[str, Any] | None, float]]) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, rep, _ in results:
            g = gate_of(rep)
            out[g] = out.get(g, 0) + 1
        return out

    unchanged_gates, slowed_gates = tally(unchanged), tally(slowed)
    slowed_samples = [samples_of(b, METRICS) for _, rep, _ in slowed if rep for b in benches(rep).values()]
    detect = detection(base_samples, slowed_samples, "output_throughput", max_cv=DEFAULT_MAX_CV_PCT)
    unchanged_fail = sum(1 for rc, _, _ in unchanged if rc != 0)
    slowed_fail = sum(1 for rc, _, _ in slowed if rc != 0)
    medians = [statistics.median(s["output_throughput"]) for s in slowed_samples]
    base_median = statistics.median(base_samples["output_throughput"])
    cpu = platform.processor() or platform.machine()
    text = [
        "# Regression gates: calibration on the simulator",
        "",
        "`python benchmarks/calibrate.py --demo "
        f"--jitter {args.jitter} --runs {args.runs} --rounds {args.rounds}` "
        f"({time.strftime('%Y-%m-%d')}, {took / 60:.1f} min).",
        "",
        f"Machine: a 2-core Xeon VM ({os.cpu_count()} cores seen, {cpu}), shared with other engineers' test runs "
        "while this ran, so the figures carry the machine's own noise on top of the simulator's jitter.",
        "",
        f"Workload: the bundled simulator at {decode:g} tok/s per request, TTFT {ttft:g} ms, jitter "
        f"{args.jitter:g} (each round's pace drawn uniformly from [{1 - args.jitter:g}, {1 + args.jitter:g}] "
        f"of that); `sglang_bench(num_requests=8, concurrency=8, input_len=16, output_len={args.output_len}, "
        f"warmup=1, rounds={args.rounds})`; each run a fresh pytest session with its own server.",
        "",
        f"## 1. Calibration: {args.runs} unchanged runs, every run judged against every other "
        f"({tput['pairs']} pairs)",
        "",
        markdown(rows, detect=detect),
        "The detection row judges the 10 %-slower runs of step 2 against the baseline recorded there, for every "
        "tolerance, through the same engine (offline, from their reports).",
        "",
        f"## 2. The gate end to end, `output_throughput=\"{tol}\"`",
        "",
        f"Baseline recorded in one run (median {base_median:.1f} tok/s over {args.rounds} rounds); then:",
        "",
        "| runs | pytest failed | gates |",
        "|---|---|---|",
        f"| {args.runs} unchanged | {unchanged_fail} of {args.runs} (false positives) | "
        + ", ".join(f"{k}: {v}" for k, v in sorted(unchanged_gates.items())) + " |",
        f"| {args.runs} with decode pace x0.9, TTFT /0.9 | {slowed_fail} of {args.runs} (detections) | "
        + ", ".join(f"{k}: {v}" for k, v in sorted(slowed_gates.items())) + " |",
        "",
        f"The slowed runs measured {min(medians):.1f} to {max(medians):.1f} tok/s "
        f"({(statistics.median(medians) / base_median - 1) * 100:+.1f}% median change)." if medians else "",
        "",
    ]
    return "\n".join(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="pytest sessions per series (default 20)")
    parser.add_argument("--metric", action="append", help=f"metric to calibrate (default: {', '.join(METRICS)})")
    parser.add_argument("--demo", action="store_true", help="calibrate and verify on the bundled simulator")
    parser.add_argument("--jitter", type=float, default=0.05, help="--demo: the simulator's per-round jitter")
    parser.add_argument("--rounds", type=int, default=5, help="--demo: rounds per benchmark")
    parser.add_argument("--decode-tok-s", type=float, default=100.0, help="--demo: the simulator's pace")
    parser.add_argument("--output-len", type=int, default=32, help="--demo: output tokens per request")
    parser.add_argument("--tolerance", default=None, help="--demo: verify with this tolerance, not the suggested")
    parser.add_argument("--write", type=Path, default=None, help="also write the markdown report here")
    parser.add_argument("pytest_args", nargs="*", help="after --: the pytest arguments that select one test")
    args = parser.parse_args(argv)
    try:
        text = _calibrate(parser, args)
    except CalibrationError as exc:
        print(f"calibrate: {exc}", file=sys.stderr)
        return 2
    print(text)
    if args.write:
        args.write.write_text(text)
    return 0


def _calibrate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    if args.demo:
        text = demo(args)
    else:
        if not args.pytest_args:
            parser.error("give the test to calibrate after --, e.g. "
                         "-- examples/test_throughput.py::test_decode_throughput --sglang-profile=p")
        metrics = args.metric or list(METRICS)
        tmp = Path(tempfile.mkdtemp(prefix="sglang-calibrate-"))
        runs: dict[str, list[Samples]] = {}
        for i in range(args.runs):
            rc, rep, took = run_once(args.pytest_args, cwd=Path.cwd(), report=tmp / f"run-{i}.json",
                                     baseline=tmp / "none.json", env=dict(os.environ))
            print(f"run {i + 1}/{args.runs}: exit {rc}, {took:.1f} s", flush=True)
            for key, bench in benches(rep or {"profiles": {}}).items():
                runs.setdefault(key, []).append(samples_of(bench, metrics))
        parts = []
        for key, series in runs.items():
            rows = [calibrate(series, m) for m in metrics if any(m in s for s in series)]
            parts.append(f"## {key}\n\n{markdown(rows)}")
        text = "\n".join(parts) or "no benchmark results: does the test call sglang_bench?\n"
    return text


if __name__ == "__main__":
    sys.exit(main())
