"""Intervals the dashboard shows: inside a score's range, checked on hand-computed cases."""

from __future__ import annotations

import pytest

from reef.intervals import mean_interval, natural_range, wilson


def test_a_mean_of_thumbs_gets_wilsons_interval_inside_0_1() -> None:
    # 2 of 8 thumbs up: the normal interval was [-0.05, 0.55] (below 0); Wilson at z 1.96 by
    # hand: centre (0.25 + 3.8416/16) / 1.4802 = 0.3311, half 1.96 * 0.19607 / 1.4802 = 0.2596
    low, high = mean_interval(8, 0.25, 0.25 * 0.75 * 8 / 7, (0.0, 1.0))
    assert (low, high) == pytest.approx((0.0715, 0.5907), abs=1e-4)
    assert (low, high) == pytest.approx(wilson(2, 8, z=1.96))


def test_one_score_or_a_mean_at_an_end_still_has_width_and_stays_in_range() -> None:
    low, high = mean_interval(1, 1.0, 0.0, (0.0, 1.0))
    assert 0.0 < low < 1.0 and high == 1.0
    low, high = mean_interval(5, 0.0, 0.0, (0.0, 1.0))
    assert low == 0.0 and 0.0 < high < 1.0


def test_a_signed_reward_rescales_into_minus_1_1() -> None:
    # mean 0.5 of rewards in [-1, 1] is 0.75 of the range: Wilson(3 of 4), mapped back
    w = wilson(3, 4, z=1.96)
    assert w is not None
    low, high = mean_interval(4, 0.5, 1 / 3, (-1.0, 1.0))
    assert (low, high) == pytest.approx((-1 + 2 * w[0], -1 + 2 * w[1]))
    assert -1.0 <= low < 0.5 < high <= 1.0


def test_unbounded_scores_keep_the_normal_interval() -> None:
    assert mean_interval(4, 3.0, 4.0, None) == pytest.approx((1.04, 4.96))
    assert mean_interval(1, 7.0, 0.0, None) == (7.0, 7.0)
    with pytest.raises(ValueError):
        mean_interval(0, 0.0, 0.0, None)


def test_natural_ranges_are_the_narrowest_that_hold_every_score() -> None:
    assert natural_range(0.0, 1.0) == (0.0, 1.0)
    assert natural_range(0.2, 0.2) == (0.0, 1.0)
    assert natural_range(-0.5, 1.0) == (-1.0, 1.0)
    assert natural_range(0.0, 2.0) is None
