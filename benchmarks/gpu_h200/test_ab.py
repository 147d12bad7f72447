"""Interleaved A/B with real SGLang on one H200 (run_h200.sh AB): A vs A passes, A vs --max-running-requests 12 at
concurrency 16 fails as regressed, and the rounds of a few round lengths for ab_study.py (how the paired spread
falls with pairs and round length). Each A/B's rounds are one JSON line in $FIGURES, whatever its verdict.

Knobs from the environment: AB_ROUNDS (pairs of the gated comparisons, default 10), AB_TOLERANCE (default 10%),
AB_STUDY ("requests x pairs" of the study runs, default "16x12"; empty: none). The regression's pair runs
first, then A vs A and the study on the other pair (three server startups in all, one pair alive at a time), so a
run cut short by the device's limit loses the study first.
"""

from __future__ import annotations

import json
import os

import pytest

GATE = dict(num_requests=64, concurrency=16, input_len=128, output_len=128)
ROUNDS = int(os.environ.get("AB_ROUNDS", "10"))
TOLERANCE = os.environ.get("AB_TOLERANCE", "10%")
STUDY = [tuple(int(x) for x in s.split("x")) for s in os.environ.get("AB_STUDY", "16x12").split()]


def record(name: str, r, outcome=None) -> None:
    line = json.dumps({"kind": "ab", "name": name, "first": r.first, "second": r.second, "pairs": r.pairs,
                       "order": r.order, "ratio": r.ratio, "ci": r.ci, "p_value": r.p_value,
                       "rounds": {p: [x.output_throughput for x in rs] for p, rs in r.rounds.items()},
                       "itl": {p: [x.median_itl_ms for x in rs] for p, rs in r.rounds.items()},
                       "num_requests": r.rounds[r.first][0].completed,
                       "gate": outcome.gate if outcome else None,
                       "message": outcome.gate_reason if outcome else None})
    print(line)
    path = os.environ.get("FIGURES")
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")


@pytest.mark.sglang_ab("ab-main", "ab-mrr12")
def test_max_running_requests_12_regresses(sglang_ab):
    r = sglang_ab(**GATE, rounds=ROUNDS, warmup=16)
    outcome = r.judge(output_throughput=TOLERANCE, max_cv="off")
    record("a-vs-mrr12", r, outcome)
    assert outcome.gate == "regressed", outcome.gate_reason or "passed"


@pytest.mark.sglang_ab("ab-main", "ab-same")
def test_a_vs_a_passes(sglang_ab):
    r = sglang_ab(**GATE, rounds=ROUNDS, warmup=16)
    outcome = r.judge(output_throughput=TOLERANCE, max_cv="off")
    record("a-vs-a", r, outcome)
    r.check(output_throughput=TOLERANCE, max_cv="off")


@pytest.mark.sglang_ab("ab-main", "ab-same")
@pytest.mark.parametrize(("num_requests", "pairs"), STUDY, ids=[f"{n}x{p}" for n, p in STUDY])
def test_study_round_length(sglang_ab, num_requests, pairs):
    r = sglang_ab(**{**GATE, "num_requests": num_requests}, rounds=pairs, warmup=16)
    record(f"study-{num_requests}x{pairs}", r)
