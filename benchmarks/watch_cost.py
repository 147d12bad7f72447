"""The log watcher's cost to a pytest run, end to end: pytest's own CPU seconds per 100 MB of a realistic SGLang log.

    python benchmarks/watch_cost.py [--runs 5] [--log-mb 100] [--rev REV] [--out results.json]

A fake server (readiness.py's generated log: a real SGLang 0.5.23 startup where ../shared/samples is beside the
checkout, then TP0-TP3 "Prefill batch" and
"Decode batch" lines, uvicorn access-log lines and CUDA-graph capture bars redrawn with \\r) writes the whole
log in 64 KiB writes, then its ready line, while a real `python -m pytest --sglang-profile=feed` run waits for
it; a second server test follows, so the session's liveness check reads on too. The figure is the pytest
process's own CPU (RUSAGE_SELF from pytest_sessionstart to pytest_unconfigure: not the server's, not the
interpreter's start; bytecode cached), the same run with a 1 MB log subtracted (the launch and the teardown),
scaled to 100 MB. --when=session writes the log after the ready line instead, while the tests run.
--mb-per-s paces the writes (default: as fast as the pipe takes them). Beside it: one `grep -c Traceback`
pass over the same file. With --rev REV the plugin of git revision REV (`git archive` into a temporary folder,
on PYTHONPATH) runs too, interleaved run by run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_cost import REPO, extract_revision  # noqa: E402
from readiness import GREP_PASS, STREAM_SERVER, generate_log, grep_cpu  # noqa: E402

CONFTEST = r'''
import json, os, resource

def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

def pytest_sessionstart(session):
    session.config.feed_cpu_at_start = _cpu()

def pytest_unconfigure(config):
    with open(os.environ["FEED_OUT"], "w") as f:
        json.dump({"cpu_s": _cpu() - config.feed_cpu_at_start}, f)
'''

TESTS = '''
import os, time

def test_ready(sglang_server):  # under --when=session the log is written now: wait until it all is
    assert sglang_server.phases["ready"] > 0
    while sglang_server.log_path.stat().st_size < int(os.environ["FEED_BYTES"]):
        sglang_server.check_alive()  # as each test's start does: reads what the server logged since
        time.sleep(0.2)

def test_still_alive(sglang_server):
    sglang_server.check_alive()
'''

# --mb-per-s: the server writes at that pace (64 KiB, then a pause), as a busy server logs, not all at once
PACED_SERVER = STREAM_SERVER.replace(
    "            data = data[os.write(1, data):]",
    "            data = data[os.write(1, data):]\n"
    "        time.sleep(65536 / (float(os.environ['FEED_MB_PER_S']) * 1e6))").replace("import os,", "import os, time,")
# --when=session: ready at once, then the serving log while the tests run
SESSION_SERVER = PACED_SERVER.replace(
    "with open(source", "os.write(1, b\"[2025-03-08 13:00:00] The server is fired up and ready to roll!\\n\")\n"
    "with open(source").replace("os.write(1, b\"\\n[2025-03-08 13:00:00] The server is fired up", "(b\"")


def one_run(root: Path, source: Path, code: Path, n: int, mb_per_s: float) -> float:
    out = root / f"feed-{n}.json"
    env = {**os.environ, "FEED_OUT": str(out), "PYTHONPATH": str(code), "FEED_BYTES": str(source.stat().st_size),
           "FEED_MB_PER_S": str(mb_per_s), "PYTHONPYCACHEPREFIX": str(root / "pycache")}
    for name in ("PYTEST_ADDOPTS", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    (root / "pyproject.toml").write_text(
        "[tool.pytest_sglang.profiles.feed]\nkind = \"sglang\"\nhealth_path = \"/health\"\nstartup_timeout = 600\n"
        f"command = [\"{{python}}\", \"{root / 'stream_server.py'}\", \"{{port}}\", \"{source}\"]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--sglang-profile=feed",
                           f"--sglang-log-dir={root / 'logs'}", "test_feed.py"], cwd=root, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"pytest run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return float(json.loads(out.read_text())["cpu_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--log-mb", type=float, default=100.0)
    parser.add_argument("--rev", help="also measure the plugin of this git revision")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--mb-per-s", type=float, default=1000.0, help="the pace the server writes its log at")
    parser.add_argument("--when", choices=("startup", "session"), default="startup",
                        help="the log is written before the ready line (startup) or after it, during the tests")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="watch-cost-") as tmp:
        root = Path(tmp)
        (root / "stream_server.py").write_text(PACED_SERVER if args.when == "startup" else SESSION_SERVER)
        (root / "conftest.py").write_text(CONFTEST)
        (root / "test_feed.py").write_text(TESTS)
        big, small = root / "big.log", root / "small.log"
        big_bytes = generate_log(big, args.log_mb, random.Random(args.seed))
        small_bytes = generate_log(small, 1.0, random.Random(args.seed))
        variants = {"current": REPO} | ({args.rev: extract_revision(args.rev, root / "rev")} if args.rev else {})
        cpu: dict[str, dict[str, list[float]]] = {name: {"big": [], "small": []} for name in variants}
        grep: list[float] = []
        scale = 100_000_000 / (big_bytes - small_bytes)
        for n in range(args.runs):
            for name, code in variants.items():
                cpu[name]["big"].append(one_run(root, big, code, n, args.mb_per_s))
                cpu[name]["small"].append(one_run(root, small, code, n, args.mb_per_s))
            grep.append(grep_cpu(GREP_PASS, big)[0] * 100_000_000 / big_bytes)
            print(f"run {n + 1}/{args.runs}: " + ", ".join(
                f"{name} {(c['big'][-1] - c['small'][-1]) * scale:.2f}" for name, c in cpu.items())
                + f" CPU-s per 100 MB; grep pass {grep[-1]:.3f}", flush=True)
    print(f"log {big_bytes / 1e6:.0f} MB minus {small_bytes / 1e6:.1f} MB, {args.runs} runs, --when={args.when}, "
          f"{args.mb_per_s:g} MB/s, load average {os.getloadavg()[0]:.2f}")
    for name, c in cpu.items():
        each = [(b - s) * scale for b, s in zip(c["big"], c["small"], strict=True)]
        headline = (statistics.median(c["big"]) - statistics.median(c["small"])) * scale
        print(f"{name:<10} pytest CPU-s per 100 MB: {headline:.2f} (median of the big runs minus median of the 1 MB "
              f"ones; run by run: {' / '.join(f'{v:.2f}' for v in each)})")
    print(f"grep pass CPU-s per 100 MB: median {statistics.median(grep):.3f}")
    if args.out:
        args.out.write_text(json.dumps({"log_bytes": big_bytes, "small_bytes": small_bytes, "cpu_s": cpu,
                                        "grep_per_100mb": grep}, indent=1))


if __name__ == "__main__":
    main()
