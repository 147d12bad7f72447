"""Comparisons the way to trust them on a noisy GPU box: both servers alive, rounds interleaved A B B A ...

The host's drift hits both sides of each pair and cancels in the ratio; the check fails only on a change past
the tolerance that the signed-rank test finds significant, and says "not judged" when the pairs are too few or
too noisy to tell.
"""

import pytest

WORKLOAD = dict(num_requests=8, concurrency=8, input_len=128, output_len=32)


@pytest.mark.sglang_ab("baseline", "eagle3")
def test_eagle3_is_not_slower_than_baseline(sglang_ab):
    """Run with --sglang-profile=baseline,eagle3: EAGLE-3 was 0.6x the baseline on the CUDA 12.8 stack."""
    r = sglang_ab(**WORKLOAD, rounds=6)
    r.check(output_throughput="5%")


@pytest.mark.sglang_ab("cuda12-8", "cuda13")
def test_cuda13_stack_is_not_slower(sglang_ab):
    """Run with --sglang-profile=cuda12-8,cuda13: is the upgrade's +3.5 % (92.6 vs 89.5 tok/s) real?"""
    r = sglang_ab(**WORKLOAD, rounds=10)
    r.check(output_throughput="2%", median_itl_ms="5%")
    print(f"cuda13 vs cuda12-8: {r.ratio['output_throughput']:.3f}x (95% CI {r.ci['output_throughput']}, "
          f"p={r.p_value['output_throughput']:.3f}, {r.pairs} pairs)")
