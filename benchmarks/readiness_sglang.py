"""Ready-line-to-ready lag on real SGLang: pytest-sglang's launch_server vs SGLang's own popen_launch_server.

    python benchmarks/readiness_sglang.py [--runs 3] [--no-api-key] [--sglang-python PY] [--out results.json]

Run by hand (about a minute per launch on a 2-core CPU). Each launch starts one real SGLang server (CPU,
the tests' tiny random-weight model, the flags of tests/integration/realservers.py, `--api-key` unless
--no-api-key) with `launch_server`, and on that same server, at the same time, measures:

- the ready line: a thread tails the log file every 2 ms and notes time.time() when "The server is fired up
  and ready to roll!" is in it (SGLang's own timestamps have whole seconds only, too coarse for a 0.1 s
  target);
- ours: the moment `launch_server(plan)` returns, minus the ready line;
- SGLang's: the moment `_wait_for_server_health` returns, minus the ready line. That function is the wait
  loop `popen_launch_server` (sglang.test.test_utils) runs right after starting its server: GET
  /health_generate with the API key, then sleep 10 s, until 200. It runs, imported from the installed
  SGLang, in a child process with the SGLang venv's python, started (imports done) just before our
  launch, so its polling phase relative to the server's start is the one popen_launch_server would have.
  Only its `proc.poll()` is a stand-in (the server is not its child): it always says "running".

After both are done, each endpoint a readiness probe could use is timed (median of 3 GETs).
Loads (os.getloadavg) are noted at each launch's start and when the server is ready.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_sglang.config.profiles import Profile  # noqa: E402
from pytest_sglang.launch.plan import plan_launch  # noqa: E402
from pytest_sglang.server import launch_server  # noqa: E402

SGLANG_PYTHON = REPO / ".ci-cache/servers/sglang/bin/python"
TINY_MODEL = REPO / "tests/integration/tiny_model.py"
STUB_DIR = REPO / "tests/integration/sgl_kernel_stub"
# tests/integration/realservers.py SERVER_ARGS["sglang"]: what works on these CPUs (shared/reference/sglang-cpu.md)
SERVER_ARGS = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
               "--max-total-tokens", "4096", "--dtype", "bfloat16")
READY_LINE = b"The server is fired up and ready to roll!"
API_KEY = "bench-key"
ENDPOINTS = ("/v1/models", "/model_info", "/ready", "/health", "/health_generate")

# Run by the SGLang venv's python: popen_launch_server's own wait loop, started on "go".
POPEN_WAIT = r"""
import importlib.metadata, json, sys, time
from sglang.test.test_utils import _wait_for_server_health  # what popen_launch_server calls after Popen

class Running:  # popen_launch_server passes its Popen; the loop only calls poll()
    def poll(self):
        return None

base_url, api_key, timeout = sys.argv[1], sys.argv[2] or None, float(sys.argv[3])
print(json.dumps({"sglang": importlib.metadata.version("sglang")}), flush=True)
sys.stdin.readline()
started = time.time()
ok, error = _wait_for_server_health(Running(), base_url, api_key, timeout)
print(json.dumps({"ok": ok, "error": error, "started": started, "returned": time.time()}), flush=True)
"""


class ReadyLineClock(threading.Thread):
    """Tails a log file every `every` seconds; `at` is time.time() when the ready line is first in it."""

    def __init__(self, path: Path, every: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.path, self.every = path, every
        self.at: float | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        seen, file = b"", None
        while not self._stop.is_set():
            if file is None and self.path.exists():
                file = self.path.open("rb")
            chunk = file.read() if file is not None else b""
            seen = seen[-len(READY_LINE):] + chunk
            if READY_LINE in seen:
                self.at = time.time()
                break
            time.sleep(self.every)
        if file is not None:
            file.close()

    def stop(self) -> None:
        self._stop.set()


def make_model(python: Path, work: Path) -> Path:
    out = work / "tiny"
    subprocess.run([str(python), str(TINY_MODEL), str(out)], check=True, capture_output=True, timeout=300)
    return out


def bench_plan(python: Path, model: Path, work: Path, n: int, api_key: str | None):
    args = (*SERVER_ARGS, "--api-key", api_key) if api_key else SERVER_ARGS
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "SGLANG_USE_CPU_ENGINE": "1",
           "PYTHONPATH": str(STUB_DIR)}
    profile = Profile(name="bench", source=work / "bench.toml", kind="sglang", model=str(model), python=str(python),
                      args=args, env=env, startup_timeout=600.0)
    log_dir = work / f"launch-{n}"
    log_dir.mkdir()
    return plan_launch(profile, sim=False, log_dir=log_dir)


def start_popen_wait(python: Path, base_url: str, api_key: str | None) -> tuple[subprocess.Popen, str]:
    """Start SGLang's wait loop in its own venv; returns once its imports are done (it waits for "go")."""
    proc = subprocess.Popen([str(python), "-c", POPEN_WAIT, base_url, api_key or "", "600"], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    version = json.loads(proc.stdout.readline())["sglang"]
    return proc, version


def endpoint_times(base_url: str, api_key: str | None) -> dict[str, dict]:
    """Median seconds of 3 GETs of each endpoint, and the status it answered (with the key, if any)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    out = {}
    with requests.Session() as session:
        for path in ENDPOINTS:
            times, status = [], None
            for _ in range(3):
                t0 = time.monotonic()
                status = session.get(base_url + path, headers=headers, timeout=30).status_code
                times.append(time.monotonic() - t0)
            out[path] = {"status": status, "s": statistics.median(times)}
        if api_key:
            out["/v1/models (no key)"] = {"status": session.get(base_url + "/v1/models", timeout=30).status_code}
    return out


def one_launch(python: Path, model: Path, work: Path, n: int, api_key: str | None) -> dict:
    plan = bench_plan(python, model, work, n, api_key)
    popen_wait, version = start_popen_wait(python, plan.base_url, api_key)
    clock = ReadyLineClock(plan.log_path)
    clock.start()
    load_start = os.getloadavg()[0]
    launched = time.time()
    popen_wait.stdin.write("go\n")
    popen_wait.stdin.flush()
    handle = None
    try:
        handle = launch_server(plan)
        ours_at = time.time()
        load_ready = os.getloadavg()[0]
        theirs = json.loads(popen_wait.communicate(timeout=120)[0].strip().splitlines()[-1])
        endpoints = endpoint_times(plan.base_url, api_key)
    finally:
        clock.stop()
        if popen_wait.poll() is None:
            popen_wait.kill()
            popen_wait.wait()
        if handle is not None:
            handle.close()
    if clock.at is None or not theirs["ok"]:
        raise SystemExit(f"launch {n}: ready line {clock.at}, popen_launch_server wait {theirs}; log {plan.log_path}")
    return {
        "sglang": version, "load_start": load_start, "load_ready": load_ready,
        "ready_line_s": clock.at - launched, "ours_lag_s": ours_at - clock.at,
        "popen_lag_s": theirs["returned"] - clock.at, "popen_phase_s": theirs["started"] - launched,
        "endpoints": endpoints, "log": str(plan.log_path),
    }


def report(runs: list[dict]) -> None:
    print(f"\n{'run':>3}  {'load':>11}  {'ready line':>10}  {'ours':>8}  {'popen_launch_server':>19}")
    for i, r in enumerate(runs, 1):
        print(f"{i:>3}  {r['load_start']:>4.2f}->{r['load_ready']:<5.2f}  {r['ready_line_s']:>8.1f} s  "
              f"{r['ours_lag_s']:>6.3f} s  {r['popen_lag_s']:>17.3f} s")
    ours = statistics.median(r["ours_lag_s"] for r in runs)
    theirs = statistics.median(r["popen_lag_s"] for r in runs)
    print(f"median lag after the ready line: ours {ours:.3f} s (target <= 0.1 s: {'yes' if ours <= 0.1 else 'NO'}), "
          f"popen_launch_server {theirs:.3f} s")
    print("endpoint answer times after ready (median of the runs' medians):")
    for path in runs[0]["endpoints"]:
        cells = [r["endpoints"][path] for r in runs]
        took = [c["s"] for c in cells if "s" in c]
        status = sorted({c["status"] for c in cells})
        print(f"  GET {path:<22} HTTP {status}" + (f"  {statistics.median(took) * 1000:8.1f} ms" if took else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="server launches (each measures both waits)")
    p.add_argument("--no-api-key", action="store_true", help="launch without --api-key")
    p.add_argument("--sglang-python", type=Path, default=Path(os.environ.get("PYTEST_SGLANG_SGLANG_PYTHON",
                                                                           SGLANG_PYTHON)))
    p.add_argument("--out", type=Path, default=None, help="write every measurement as JSON here")
    args = p.parse_args()
    api_key = None if args.no_api_key else API_KEY
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()}; api key: {bool(api_key)}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="readiness-sglang-"))
    model = make_model(args.sglang_python, work)
    runs = []
    for n in range(1, args.runs + 1):
        runs.append(one_launch(args.sglang_python, model, work, n, api_key))
        r = runs[-1]
        print(f"launch {n}: ready line at {r['ready_line_s']:.1f} s, ours +{r['ours_lag_s']:.3f} s, "
              f"popen_launch_server +{r['popen_lag_s']:.3f} s (load {r['load_start']:.2f})", flush=True)
    print(f"SGLang {runs[0]['sglang']}; logs under {work}")
    report(runs)
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "api_key": bool(api_key)}, indent=2))


if __name__ == "__main__":
    main()
