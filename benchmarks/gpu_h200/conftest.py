"""User-side instrumentation for the H200 run (no plugin change), and the transformers-serve tests' fixtures
(tf_fixtures.py).

Times every teardown the plugin does: ``stop_and_release`` (SIGTERM, grace, SIGKILL, then the plugin's own wait
until no pid of the tree is in NVML/nvidia-smi and the port is free) is wrapped where server/handle.py calls it,
and ``wait_released`` where release.py calls it; a thread beside them polls ``nvidia-smi`` every 0.1 s for the
tree's compute apps and the GPU's memory.used. One JSON line per teardown goes to $RELEASE_LOG.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

from tf_fixtures import openai_strict, text_prompts, tokenizer  # noqa: F401  (test_tf_server.py's fixtures)

import pytest_sglang.launch.release as release
import pytest_sglang.server.handle as handle

LOG = os.environ.get("RELEASE_LOG")


def _smi() -> tuple[list[tuple[int, int]], int | None]:
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout
        used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return [], None
    rows = []
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            rows.append((int(parts[0]), int(parts[1]) if parts[1].isdigit() else 0))
    return rows, int(used.split()[0]) if used.strip() else None


_timing: dict = {}
_orig_wait = release.wait_released
_orig_stop = handle.stop_and_release


def _wait_released(*args, **kwargs):
    _timing["wait_started"] = time.monotonic()
    held = _orig_wait(*args, **kwargs)
    _timing["wait_ended"] = time.monotonic()
    _timing["held"] = held
    return held


def _stop_and_release(process, *, grace, profile, host, port, on_status=None):
    if not LOG:
        return _orig_stop(process, grace=grace, profile=profile, host=host, port=port, on_status=on_status)
    pids = release.tree_pids(process.pid, process.token)
    members = getattr(process, "members", None)
    if members is not None:
        pids |= members.pids()
    apps, used0 = _smi()
    samples: list[tuple[float, int, int | None]] = []
    stop = threading.Event()
    t0 = time.monotonic()

    def poll() -> None:
        while not stop.is_set() and time.monotonic() - t0 < 150:
            rows, used = _smi()
            samples.append((round(time.monotonic() - t0, 3), sum(1 for p, _ in rows if p in pids), used))
            time.sleep(0.1)

    thread = threading.Thread(target=poll, daemon=True)
    _timing.clear()
    thread.start()
    try:
        return _orig_stop(process, grace=grace, profile=profile, host=host, port=port, on_status=on_status)
    finally:
        t_end = time.monotonic()
        time.sleep(1.0)  # a second more of samples after the plugin let go
        stop.set()
        thread.join(15)
        gone = next((t for t, n, _ in samples if n == 0), None)
        rec = {"profile": profile, "tree_pids": sorted(pids),
               "gpu_apps_before": [(p, m) for p, m in apps if p in pids], "memory_used_before_mib": used0,
               "stop_seconds": round(_timing.get("wait_started", t_end) - t0, 3),
               "plugin_release_wait_seconds": round(
                   _timing.get("wait_ended", t_end) - _timing.get("wait_started", t_end), 3),
               "teardown_total_seconds": round(t_end - t0, 3),
               "smi_apps_gone_seconds": gone,
               "memory_used_after_mib": samples[-1][2] if samples else None,
               "held_at_bound": _timing.get("held"), "samples": samples}
        with open(LOG, "a") as fh:
            fh.write(json.dumps(rec) + "\n")


release.wait_released = _wait_released
handle.stop_and_release = _stop_and_release
