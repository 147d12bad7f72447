"""Gather what run_sglang.sh produced into one results JSON and print the tables docs/gpu.md quotes.

    python benchmarks/gpu_sglang/summarize.py WORK_OUT_DIR RESULTS_JSON

Reads WORK_OUT_DIR/report-*.json (--sglang-report of each pytest session), release.jsonl (conftest.py's teardown
timings), machine.json, ceiling.json; runs benchmarks/calibrate.py's calibration (every same-commit run judged
against every other by the plugin's engine) over the noise repeats of one server and over the sessions.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibrate import METRICS, calibrate, samples_of  # noqa: E402

KEYS = ("output_throughput", "request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms",
        "median_tpot_ms", "median_e2e_latency_ms", "duration", "concurrency", "client_busy", "num_rounds",
        "completed", "failed", "total_output_tokens", "total_input_tokens")
MAX_CV = 30.0


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def brief(bench: dict) -> dict:
    r = bench["result"]
    out = {k: r.get(k) for k in KEYS}
    spread = r.get("spread") or {}
    out["cv_pct"] = {m: (spread.get(m) or {}).get("cv_pct") for m in ("output_throughput", "median_ttft_ms",
                                                                     "median_itl_ms", "median_e2e_latency_ms")}
    out["rounds_output_throughput"] = [x.get("output_throughput") for x in r.get("rounds") or []]
    out["sweep"] = r.get("sweep")
    return {"test_id": bench["test_id"].split("::")[-1], "outcome": bench.get("outcome"), "gate": bench.get("gate"),
            "gate_reason": bench.get("gate_reason"), "result": out,
            "baseline": {m: {k: v.get(k) for k in ("baseline", "current", "change_pct", "tolerance", "status",
                                                   "method", "p_value", "ci_pct", "rounds", "baseline_rounds")}
                         for m, v in (bench.get("baseline") or {}).items()}}


def main() -> int:
    work, dest = Path(sys.argv[1]), Path(sys.argv[2])
    out: dict = {"machine": load(work / "machine.json"), "sessions": {}, "release": [], "ceiling": load(work / "ceiling.json")}
    gate_runs: dict[str, list] = {}
    for rep_path in sorted(work.glob("report-*.json")):
        rep = load(rep_path)
        if not rep:
            continue
        name = rep_path.stem.removeprefix("report-")
        sess = {"machine": rep.get("machine"), "machine_key": rep.get("machine_key"), "gate": rep.get("gate"),
                "profiles": {}}
        for prof, p in rep["profiles"].items():
            sess["profiles"][prof] = {
                "startup_seconds": p.get("startup_seconds"), "phases": p.get("phases"), "error": p.get("error"),
                "server_version": p.get("server_version"), "startup_gate": p.get("gate"),
                "startup_baseline": p.get("startup_baseline"),
                "benchmarks": [brief(b) for b in p["benchmarks"]], "sweeps": p.get("sweeps")}
            for b in p["benchmarks"]:
                if b["test_id"].endswith("::test_gate"):
                    gate_runs.setdefault(prof, []).append((name, samples_of(b, METRICS)))
        out["sessions"][name] = sess
        noise = [samples_of(b, METRICS) for b in rep["profiles"].get("default", {}).get("benchmarks", [])
                 if "::test_noise" in b["test_id"] or b["test_id"].endswith("::test_gate")]
        if len(noise) >= 2:
            out.setdefault("noise_one_server", {})[name] = {
                "runs": len(noise), "calibration": [calibrate(noise, m, max_cv=MAX_CV) for m in METRICS]}
    for prof, runs in gate_runs.items():
        if len(runs) >= 2 and prof == "default":
            out["noise_across_sessions"] = {"sessions": [n for n, _ in runs], "calibration": [
                calibrate([s for _, s in runs], m, max_cv=MAX_CV) for m in METRICS]}
    rel = work / "release.jsonl"
    if rel.is_file():
        for line in rel.read_text().splitlines():
            rec = json.loads(line)
            s = rec.pop("samples", [])
            rec["samples_count"] = len(s)
            rec["memory_used_mib_first_last"] = [s[0][2], s[-1][2]] if s else None
            # when memory.used fell to within 1 GiB of its final value
            if s and s[-1][2] is not None:
                rec["smi_memory_freed_seconds"] = next((t for t, _, u in s if u is not None and u <= s[-1][2] + 1024), None)
            out["release"].append(rec)
    dest.write_text(json.dumps(out, indent=1, default=str) + "\n")

    # ---- the tables
    for name, sess in out["sessions"].items():
        print(f"## session {name}: gate {sess['gate'] and sess['gate'].get('status')}; machine {sess['machine_key']}")
        for prof, p in sess["profiles"].items():
            ph = p["phases"] or {}
            print(f"  {prof}: startup {p['startup_seconds']} s; phases " + ", ".join(f"{k} {v:.1f}" for k, v in ph.items())
                  + (f"; error {p['error']}" if p["error"] else ""))
            for b in p["benchmarks"]:
                r = b["result"]
                base = "; ".join(f"{m} {v['status']} {v['change_pct'] if v['change_pct'] is None else round(v['change_pct'], 1)}%"
                                 f" p={v['p_value']}" for m, v in b["baseline"].items())
                print(f"    {b['test_id']:<16} {b['outcome']:<7} gate {b['gate']}: {r['output_throughput'] or 0:9.1f} tok/s, "
                      f"TTFT p50 {r['median_ttft_ms'] or 0:7.1f} p99 {r['p99_ttft_ms'] or 0:7.1f} ms, ITL p50 "
                      f"{r['median_itl_ms'] or 0:6.2f} ms, TPOT p50 {r['median_tpot_ms'] or 0:6.2f}, e2e "
                      f"{r['median_e2e_latency_ms'] or 0:8.1f} ms, busy {r['client_busy']}, cv {r['cv_pct']}"
                      + (f"\n        sweep {r['sweep']}" if r["sweep"] else "") + (f"\n        baseline: {base}" if base else "")
                      + (f"\n        reason: {b['gate_reason']}" if b["gate_reason"] else ""))
    for key in ("noise_one_server", ):
        for name, n in out.get(key, {}).items():
            print(f"## noise on one server ({name}, {n['runs']} runs)")
            for c in n["calibration"]:
                print(f"  {c['metric']:<24} cv within {c['within_cv_median']} / {c['within_cv_max']}, between {c['between_cv']}, "
                      f"suggested {c['suggested']} ({c['pairs']} pairs) fp {c['fp']}")
    if "noise_across_sessions" in out:
        n = out["noise_across_sessions"]
        print(f"## noise across sessions {n['sessions']}")
        for c in n["calibration"]:
            print(f"  {c['metric']:<24} cv within {c['within_cv_median']} / {c['within_cv_max']}, between {c['between_cv']}, "
                  f"suggested {c['suggested']} ({c['pairs']} pairs)")
    for r in out["release"]:
        print(f"## release {r['profile']}: stop {r['stop_seconds']} s, plugin wait {r['plugin_release_wait_seconds']} s, "
              f"total {r['teardown_total_seconds']} s, smi apps gone {r['smi_apps_gone_seconds']} s, memory freed "
              f"{r.get('smi_memory_freed_seconds')} s, used before {r['memory_used_before_mib']} MiB after "
              f"{r['memory_used_after_mib']} MiB, apps {r['gpu_apps_before']}, held {r['held_at_bound']}")
    if out["ceiling"]:
        print("## client ceiling", json.dumps({k: v for k, v in out["ceiling"].items() if k != "rows"}))
        for row in out["ceiling"]["rows"]:
            print("  ", json.dumps(row))
    _ = statistics
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
