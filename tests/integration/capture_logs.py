"""Launch the real servers by hand (no plugin involved) and keep their logs as test data.

    python tests/integration/capture_logs.py --sglang-python V/sglang/bin/python \
        --vllm-python V/vllm/bin/python --out tests/integration/logs [case ...]

Each case starts the server in its own session with stdout+stderr to a log file, waits for the ready line or
the exit, sends a few requests when it is up, then ends the whole process group and checks nothing is left.
A summary (exit codes, timings, leftovers) goes to OUT/cases.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
STUB = HERE / "sgl_kernel_stub"

SGLANG_FLAGS = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
                "--max-total-tokens", "4096", "--dtype", "bfloat16"]
VLLM_FLAGS = ["--dtype", "float32", "--max-model-len", "512"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 60) -> str:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (loopback only)
        return r.read().decode()


def leftovers(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line and "capture_logs" not in line]


def run_case(name: str, kind: str, python: str, model: Path, extra: list[str], out: Path,
             ready_re: str, requests: str, wait_s: float) -> dict:
    port = free_port()
    if kind == "sglang":
        cmd = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
               "--port", str(port), *SGLANG_FLAGS, *extra]
        env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", HF_HUB_OFFLINE="1",
                   PYTHONPATH=str(STUB))
    else:
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
               "127.0.0.1", "--port", str(port), *VLLM_FLAGS, *extra]
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    log_path = out / f"{name}.log"
    t0 = time.monotonic()
    events: dict[str, float] = {}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    answers: dict[str, str] = {}
    try:
        while time.monotonic() - t0 < wait_s:
            if proc.poll() is not None:
                break
            text = log_path.read_text(errors="replace")
            if re.search(ready_re, text):
                events.setdefault("ready", time.monotonic() - t0)
                break
            time.sleep(0.5)
        if "ready" in events:
            # Requests the tests will make; a crash on the first request is a case too.
            try:
                if requests in ("all", "one"):
                    answers["completion"] = post(base + "/v1/completions", {
                        "model": str(model), "prompt": "The capital city of France is",
                        "max_tokens": 8, "temperature": 0})
                if requests == "all":
                    answers["chat_stream"] = post(base + "/v1/chat/completions", {
                        "model": str(model), "messages": [{"role": "user", "content": "Hello"}],
                        "max_tokens": 8, "temperature": 0, "stream": True,
                        "stream_options": {"include_usage": True}})
                    if kind == "sglang":
                        answers["generate"] = post(base + "/generate", {
                            "text": "Once upon a time", "sampling_params": {"max_new_tokens": 8,
                                                                            "temperature": 0}})
            except Exception as exc:  # noqa: BLE001
                answers["error"] = repr(exc)
                events["request_failed"] = time.monotonic() - t0
            if requests == "one":  # wait for the server to die by itself
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    pass
        if proc.poll() is None:
            events["terminate"] = time.monotonic() - t0
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                events["sigkill"] = time.monotonic() - t0
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        events["exited"] = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        try:  # anything of the group left (children that outlived the leader)
            os.killpg(proc.pid, 0)
            group_left = True
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            group_left = False
    time.sleep(1)
    return {"case": name, "cmd": cmd, "returncode": proc.returncode, "events": events,
            "answers": answers, "group_left_after_exit": group_left, "leftovers": leftovers(str(model))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang-python")
    ap.add_argument("--vllm-python")
    ap.add_argument("--out", type=Path, default=HERE / "logs")
    ap.add_argument("cases", nargs="*")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tiny-models-"))
    maker = a.sglang_python or a.vllm_python
    models = {}
    for variant in ("ok", "head_dim16", "corrupt", "unknown_arch"):
        models[variant] = work / variant
        subprocess.run([maker, str(HERE / "tiny_model.py"), str(models[variant]), "--variant", variant],
                       check=True)
    sg_ready = r"The server is fired up and ready to roll!"
    vl_ready = r"Application startup complete\."
    cases = {
        "sglang_ready": ("sglang", "ok", [], sg_ready, "all", 300),
        "sglang_bad_flag": ("sglang", "ok", ["--no-such-flag", "1"], sg_ready, "none", 120),
        "sglang_corrupt_safetensors": ("sglang", "corrupt", [], sg_ready, "none", 180),
        "sglang_unknown_arch": ("sglang", "unknown_arch", [], sg_ready, "none", 180),
        "vllm_ready": ("vllm", "ok", [], vl_ready, "all", 400),
        "vllm_bad_flag": ("vllm", "ok", ["--no-such-flag", "1"], vl_ready, "none", 120),
        "vllm_head_dim16": ("vllm", "head_dim16", [], vl_ready, "one", 400),
    }
    chosen = a.cases or list(cases)
    results = []
    summary_path = a.out / "cases.json"
    old = json.loads(summary_path.read_text()) if summary_path.exists() else []
    for name in chosen:
        kind, variant, extra, ready, reqs, wait_s = cases[name]
        python = a.sglang_python if kind == "sglang" else a.vllm_python
        if not python:
            continue
        print(f"== {name}", flush=True)
        r = run_case(name, kind, python, models[variant], extra, a.out, ready, reqs, wait_s)
        print(json.dumps(r, indent=1)[:3000], flush=True)
        results.append(r)
    merged = {r["case"]: r for r in old}
    merged.update({r["case"]: r for r in results})
    summary_path.write_text(json.dumps(list(merged.values()), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
