"""Throughput the way users assert it in GPU CI: measured, then checked against a committed baseline."""

import pytest


def test_decode_throughput(sglang_bench, sglang_baseline):
    result = sglang_bench(num_requests=16, concurrency=4, input_len=256, output_len=64, warmup=2)
    assert result.completed == 16 and result.failed == 0
    assert result.total_output_tokens == 16 * 64
    # Replaces hand-coded floors such as `output_throughput > 3800`: the floor is the recorded baseline.
    sglang_baseline.check(result, output_throughput="5%", median_ttft_ms="25%")


def test_startup_time_is_baselined(sglang_server, sglang_baseline):
    sglang_baseline.check(sglang_server, startup_seconds="20%")


@pytest.mark.sglang_compare
def test_eagle3_beats_baseline(sglang_results):
    """Measured in this same session: run with --sglang-profile=baseline,eagle3."""
    profiles = sglang_results.profiles
    if not {"baseline", "eagle3"} <= set(profiles):
        pytest.skip(f"needs both profiles in one run (this run: {', '.join(profiles) or 'none'})")
    sglang_results.compare("eagle3", "baseline", "test_decode_throughput", output_throughput="2%")
