"""Issue 24's recipe on the lent H200 (run_h200.sh AB3): the README's A/B recipe on the random 160M Llama, as the
session that filed the issue followed it, now under the one gate rule. profiles-ab.toml's ab-main and ab-same
(the same server twice), then ab-mrr8 and ab-mrr12 (--max-running-requests 8 and 12 at concurrency 16: 0.574x
and 0.758x there), all with the README's workload and its default check:

    sglang_ab(num_requests=64, concurrency=16, input_len=128, output_len=128, rounds=10).check(output_throughput="5%")

Run in one session with --sglang-update-baseline: the A/A jobs (AB3_AA_JOBS, default 5) are recorded into the
baseline file's instance noise as the README's calibration test, each checked as it runs (A vs A); then each
candidate is checked against those recorded runs (no max_cv given: the default). A candidate's test fails when
its check says regressed, as a CI job would. Every job's rounds and verdict go to $FIGURES (ab_figures.py).
"""

from __future__ import annotations

import os

import pytest
from ab_figures import finished, guard, ran, record

WORKLOAD = dict(num_requests=64, concurrency=16, input_len=128, output_len=128, rounds=10)
AA_JOBS = int(os.environ.get("AB3_AA_JOBS", "5"))


@pytest.fixture(autouse=True)
def _guard(request):
    guard(request.node.nodeid)


def checked(name: str, r, **extra) -> None:
    """The README's default check, its verdict recorded before check() fails the test on a regression."""
    record(name, r, r.judge(output_throughput="5%"), **extra)
    r.check(output_throughput="5%")


@pytest.mark.sglang_ab("ab-main", "ab-same")
@pytest.mark.parametrize("job", range(AA_JOBS))
def test_instance_noise(sglang_ab, job):
    t0 = ran()
    r = sglang_ab(**WORKLOAD)
    checked(f"aa-{job}", r, job_seconds=finished(t0))


@pytest.mark.sglang_ab("ab-main", "ab-mrr8")
def test_candidate_mrr8(sglang_ab):
    t0 = ran()
    r = sglang_ab(**WORKLOAD)
    checked("mrr8", r, job_seconds=finished(t0))


@pytest.mark.sglang_ab("ab-main", "ab-mrr12")
def test_candidate_mrr12(sglang_ab):
    t0 = ran()
    r = sglang_ab(**WORKLOAD)
    checked("mrr12", r, job_seconds=finished(t0))
