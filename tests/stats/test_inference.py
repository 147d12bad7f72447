"""The signed-rank test and its interval (pytest_sglang/stats/inference.py) against tabulated values."""

from __future__ import annotations

import pytest

from pytest_sglang.stats.inference import hodges_lehmann_ci, signed_rank_min_p, signed_rank_p


def with_positive_rank_sum(n: int, w: int) -> list[float]:
    """Differences of ranks 1..n whose positive ones sum to ``w``."""
    positive, left = set(), w
    for r in range(n, 0, -1):
        if r <= left:
            positive.add(r)
            left -= r
    return [float(r if r in positive else -r) for r in range(1, n + 1)]


# P(W+ <= w) of the exact null distribution, from the published table (e.g. Wilcoxon, Katti & Wilcox 1963).
@pytest.mark.parametrize(("n", "w", "p"), [(5, 0, 1 / 32), (5, 1, 2 / 32), (6, 2, 3 / 64), (8, 5, 0.0391),
                                           (8, 6, 0.0547), (10, 8, 0.0244), (10, 10, 0.0420), (10, 11, 0.0527),
                                           (12, 13, 0.0212), (15, 30, 0.0473)])
def test_signed_rank_p_matches_the_table(n: int, w: int, p: float) -> None:
    assert signed_rank_p(with_positive_rank_sum(n, w), "less") == pytest.approx(p, abs=6e-5)


def test_signed_rank_p_is_symmetric_drops_zeros_and_handles_ties() -> None:
    d = with_positive_rank_sum(10, 10)
    assert signed_rank_p(d, "less") == pytest.approx(signed_rank_p([-x for x in d], "greater"))
    assert signed_rank_p([0.0, *d, 0.0], "less") == signed_rank_p(d, "less")
    assert signed_rank_p([], "less") == 1.0
    # all 6 tied and positive: only the all-positive pattern reaches the top sum
    assert signed_rank_p([1.0] * 6, "greater") == pytest.approx(1 / 64)
    assert signed_rank_min_p(5) == pytest.approx(1 / 32)


def test_large_samples_use_the_normal_approximation_close_to_exact() -> None:
    d = [((i * 37) % 23 - 10.3) for i in range(70)]
    p = signed_rank_p(d, "less")
    assert 0 < p < 1
    assert p == pytest.approx(signed_rank_p(d[:60], "less"), abs=0.2)


def test_hodges_lehmann_interval_matches_the_table() -> None:
    # 1..10: Walsh averages' 9th smallest and largest (critical value 8 at 2.5 %): R's wilcox.test gives 3 to 8
    assert hodges_lehmann_ci([float(i) for i in range(1, 11)]) == (3.0, 5.5, 8.0)
    assert hodges_lehmann_ci([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # 5 pairs cannot reach 2.5 % a tail
