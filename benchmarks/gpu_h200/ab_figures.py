"""What the H200 A/B stages (GB, AB3) keep of each sglang_ab job, and the guards that keep a device call short.

``record``: one JSON line per job in $FIGURES (each side's rounds of tok/s, TTFT, ITL, start, duration and GPU
utilisation, the ratio, interval and p-value, how many A/A runs were stored for the workload, the verdict, its
message and the whole outcome with ``detectable_pct``), so every figure can be judged again offline.
``guard``: skip a job that would end past $GB_DEADLINE, or whose pair already failed to start in this session
(a failed startup is retried by every later test of the pair otherwise, a minute or more each).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import pytest

_state: dict[str, Any] = {"setting_up": None, "job_seconds": []}


def guard(nodeid: str) -> None:
    """Call first in an autouse fixture (before sglang_ab's setup starts the pair); ``ran`` ends the setup."""
    if _state["setting_up"] is not None:
        pytest.skip(f"the pair did not start for {_state['setting_up']} (its error above); not retried")
    deadline = float(os.environ.get("GB_DEADLINE", "inf"))
    jobs = _state["job_seconds"]
    need = 1.1 * jobs[-1] if jobs else 30.0
    if time.time() + need > deadline:
        pytest.skip(f"GB_DEADLINE: {deadline - time.time():.0f} s left, a job takes about {need:.0f} s")
    _state["setting_up"] = nodeid


def ran() -> float:
    """The test body began: its pair is up. Returns the clock the job's length is measured from."""
    _state["setting_up"] = None
    return time.monotonic()


def finished(t0: float) -> float:
    _state["job_seconds"].append(time.monotonic() - t0)
    return _state["job_seconds"][-1]


def record(name: str, r: Any, outcome: Any, **extra: Any) -> dict[str, Any]:
    def per_round(field: str) -> dict[str, list[Any]]:
        return {p: [getattr(x, field, None) for x in rs] for p, rs in r.rounds.items()}

    line = {"kind": "ab", "name": name, "first": r.first, "second": r.second, "pairs": r.pairs, "order": r.order,
            "ratio": r.ratio, "ci": r.ci, "p_value": r.p_value, "same_server": r.same_server,
            "aa_runs_stored": len((r.instance_noise or {}).get("output_throughput", [])),
            "rounds": per_round("output_throughput"), "ttft": per_round("median_ttft_ms"),
            "itl": per_round("median_itl_ms"), "started_at": per_round("started_at"),
            "duration": per_round("duration"), "gpu_util": per_round("gpu_util_mean_pct"),
            "completed": per_round("completed"),
            "side_median": {p: statistics.median(v) for p, v in per_round("output_throughput").items()},
            "gate": outcome.gate, "message": outcome.gate_reason, "outcome": outcome.to_dict(), **extra}
    print(json.dumps(line))
    path = os.environ.get("FIGURES")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(line) + "\n")
    return line
