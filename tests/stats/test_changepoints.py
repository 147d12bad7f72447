"""The change-point search (pytest_sglang/stats/changepoints.py) on series made here from seeded noise."""

from __future__ import annotations

import math
import random

import pytest

from pytest_sglang.errors import SeriesError
from pytest_sglang.stats.changepoints import (
    MIN_SEGMENT,
    PERMUTATIONS,
    SIGNIFICANCE,
    ChangePoint,
    _within_sums,
    find_change_points,
    format_p_value,
)


def noisy(n: int, seed: int, cv: float = 0.04, level: float = 100.0) -> list[float]:
    """n runs of one unchanged server: a lognormal session factor each, as the simulator's session_drift draws."""
    rng = random.Random(seed)
    sigma = math.sqrt(math.log1p(cv * cv))
    return [level * math.exp(rng.gauss(0.0, sigma)) for _ in range(n)]


def stepped(n: int, at: int, change: float, seed: int, cv: float = 0.04) -> list[float]:
    return [v * (1.0 + change if i >= at else 1.0) for i, v in enumerate(noisy(n, seed, cv))]


def test_a_clear_step_is_found_where_it_starts() -> None:
    values = stepped(35, 20, -0.20, seed=1)
    found = find_change_points(values)
    assert [c.index for c in found] == [20]
    assert found[0].p_value <= SIGNIFICANCE
    assert found[0].p_value == pytest.approx(1 / (PERMUTATIONS + 1))  # no shuffle scores as high as a 5-sigma step


def test_a_step_up_is_found_as_well_as_a_step_down() -> None:
    assert [c.index for c in find_change_points(stepped(30, 12, +0.15, seed=2))] == [12]


def test_unchanged_series_give_no_step_in_nearly_every_seed() -> None:
    # At the default significance about 1 unchanged series in 20 shows a step: 2 of 40 expected, 6 would be
    # under 2 % likely for a search that kept its significance.
    false = sum(bool(find_change_points(noisy(35, seed))) for seed in range(40))
    assert false <= 5, f"{false} of 40 unchanged series showed a step"
    strict = sum(bool(find_change_points(noisy(35, seed), significance=0.01, permutations=199)) for seed in range(40))
    assert strict <= false


def test_the_p_value_of_noise_is_not_significant_when_asked_for_every_split() -> None:
    # With significance 0.99 every candidate is accepted: the p-values of pure noise must still be large.
    found = find_change_points(noisy(35, seed=3), significance=0.99)
    assert found, "a significance of 0.99 accepts the best split of noise"
    assert max(c.p_value for c in found) > 0.05


def test_two_steps_are_both_found() -> None:
    values = [v * (0.85 if 12 <= i < 26 else 1.0) for i, v in enumerate(noisy(40, seed=4, cv=0.02))]
    assert [c.index for c in find_change_points(values)] == [12, 26]


def test_two_steps_down_in_a_row_are_both_found() -> None:
    values = [v * (1.0 if i < 15 else 0.85 if i < 30 else 0.70) for i, v in enumerate(noisy(45, seed=5, cv=0.02))]
    assert [c.index for c in find_change_points(values)] == [15, 30]


def test_a_constant_series_has_no_step() -> None:
    assert find_change_points([123.0] * 35) == []
    assert find_change_points([7] * 2 * MIN_SEGMENT) == []


def test_too_short_a_series_is_not_searched() -> None:
    assert find_change_points([]) == []
    assert find_change_points([1.0]) == []
    values = [100.0] * MIN_SEGMENT + [50.0] * (MIN_SEGMENT - 1)  # one run short of a segment after the step
    assert find_change_points(values) == []
    # Just long enough; but 2m values split m | m have only C(2m, m) orders (70 for m=4), two of them (either
    # half first) scoring as high as the perfect split: p cannot go much below 2 / C(2m, m).
    found = find_change_points([*values, 50.0])
    assert [c.index for c in found] == [MIN_SEGMENT]
    assert 1 / math.comb(2 * MIN_SEGMENT, MIN_SEGMENT) <= found[0].p_value <= 0.05
    assert find_change_points([*values, 50.0], significance=0.01) == []


def test_a_step_is_reported_once_min_segment_runs_sit_after_it() -> None:
    values = noisy(30, seed=11, cv=0.02)
    after = [v * 0.8 for v in noisy(MIN_SEGMENT, seed=12, cv=0.02)]
    short = values + after[:-1]
    assert all(c.index <= len(short) - MIN_SEGMENT for c in find_change_points(short))  # never fewer after it
    assert [c.index for c in find_change_points(values + after)] == [30]


def test_the_same_input_gives_the_same_answer_and_the_seed_only_moves_p_values() -> None:
    values = stepped(35, 20, -0.06, seed=6)
    first = find_change_points(values, seed=0)
    assert first == find_change_points(list(values), seed=0)
    other = find_change_points(values, seed=1)
    assert [c.index for c in other] == [c.index for c in first]


def test_the_scale_of_the_figures_does_not_matter() -> None:
    values = stepped(35, 20, -0.10, seed=7)
    assert find_change_points(values) == find_change_points([v * 1000.0 for v in values])


def test_a_long_series_is_searched_in_its_most_recent_window_with_indices_of_the_input() -> None:
    values = stepped(60, 45, -0.20, seed=8, cv=0.02)
    values[:10] = [v * 0.5 for v in values[:10]]  # a step at 10, outside the window of the last 40
    assert [c.index for c in find_change_points(values, window=40)] == [45]
    assert [c.index for c in find_change_points(values)] == [10, 45]


def test_a_gap_in_the_runs_is_the_caller_dropping_it() -> None:
    values: list[float | None] = list(stepped(35, 20, -0.20, seed=9))
    values[5] = values[25] = None
    kept = [v for v in values if v is not None]
    assert [c.index for c in find_change_points(kept)] == [19]  # index 20 less the one dropped before it


@pytest.mark.parametrize("bad", [math.nan, math.inf, None, "fast"])
def test_a_value_that_is_not_a_finite_number_is_a_clear_error(bad: object) -> None:
    values: list = [100.0] * 10
    values[3] = bad
    with pytest.raises(SeriesError, match=r"position 3.*drop runs without a figure"):
        find_change_points(values)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"significance": 0.0}, "between 0 and 1"),
    ({"significance": 1.5}, "between 0 and 1"),
    ({"significance": 0.01, "permutations": 50}, "at least 99"),
    ({"min_segment": 1}, "at least 2"),
    ({"window": 5}, "shorter than two segments"),
])
def test_settings_that_cannot_work_are_a_clear_error(kwargs: dict, match: str) -> None:
    with pytest.raises(SeriesError, match=match):
        find_change_points([1.0, 2.0] * 10, **kwargs)


def test_the_within_sample_sums_match_the_plain_double_loop() -> None:
    rng = random.Random(10)
    values = [rng.choice([1.0, 2.0, 2.0, 3.5]) for _ in range(25)] + [rng.random() for _ in range(25)]
    sums = _within_sums(values)
    for t in range(len(values) + 1):
        plain = sum(abs(values[i] - values[j]) for i in range(t) for j in range(i))
        assert sums[t] == pytest.approx(plain)


def test_p_values_read_as_a_message_shows_them() -> None:
    assert ChangePoint(index=3, p_value=0.003).p_text == "p=0.003"
    assert format_p_value(0.0004) == "p<0.001"
    assert format_p_value(0.35) == "p=0.35"


def test_stopping_hopeless_shuffles_early_leaves_accepted_p_values_as_the_full_test_gives_them() -> None:
    values = stepped(35, 20, -0.08, seed=13)
    strict = find_change_points(values)
    full = find_change_points(values, significance=0.99)  # every shuffle runs for every candidate
    assert strict, "an 8 % step on 4 % noise"
    assert set(strict) <= set(full)  # the same splits, at the same p-values


def test_a_strict_significance_gets_enough_shuffles_unless_told_otherwise() -> None:
    values = stepped(35, 20, -0.20, seed=14, cv=0.02)
    found = find_change_points(values, significance=0.001)  # a check at confidence 99.9 %
    assert [c.index for c in found] == [20]
    assert found[0].p_value <= 0.001
    with pytest.raises(SeriesError, match="use at least 999"):
        find_change_points(values, significance=0.001, permutations=PERMUTATIONS)
