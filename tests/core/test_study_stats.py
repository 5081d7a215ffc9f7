"""Means and 95% t intervals over a few seeds (blockviz.core.studies.stats)."""

from __future__ import annotations

import math

import pytest

from blockviz.core.studies.stats import (
    difference_interval,
    finite,
    mean_interval,
    paired_interval,
    t_cdf,
    t_quantile,
)

# Two-sided 95% critical values of Student's t, from any printed t table.
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 30: 2.042}


@pytest.mark.parametrize(("df", "expected"), sorted(T_TABLE.items()))
def test_t_quantile_matches_the_printed_table(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


def test_t_quantile_tends_to_the_normal_and_is_symmetric() -> None:
    assert t_quantile(0.975, 1e6) == pytest.approx(1.95996, abs=1e-4)
    assert t_quantile(0.025, 4) == pytest.approx(-t_quantile(0.975, 4))
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="p must be"):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_cdf(1.0, 0)


def test_mean_interval_by_hand() -> None:
    got = mean_interval([1.0, 2.0, 3.0])
    assert got is not None
    half = 4.303 * 1.0 / math.sqrt(3)
    assert (got.n, got.mean, got.sd) == (3, 2.0, 1.0)
    assert got.low == pytest.approx(2.0 - half, abs=1e-3)
    assert got.high == pytest.approx(2.0 + half, abs=1e-3)
    assert got.half_width == pytest.approx(half, abs=1e-3)


def test_non_finite_values_are_left_out_and_one_value_is_its_own_interval() -> None:
    assert finite([1, None, float("nan"), float("inf"), 2.5]) == [1.0, 2.5]
    assert mean_interval([None, float("nan")]) is None
    one = mean_interval([2.0, float("inf")])
    assert one is not None and (one.n, one.low, one.high, one.sd) == (1, 2.0, 2.0, 0.0)


def test_difference_interval_is_welch() -> None:
    a, b = [1.0, 2.0, 3.0], [2.0, 3.0, 4.5]
    got = difference_interval(a, b)
    assert got is not None
    va, vb = 1.0 / 3, (sum((x - 19 / 6) ** 2 for x in b) / 2) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    assert got.mean == pytest.approx(2.0 - 19 / 6)
    assert got.low == pytest.approx(got.mean - half)
    assert got.high == pytest.approx(got.mean + half)
    # Clearly separated groups give an interval that excludes zero.
    apart = difference_interval([1.0, 1.1, 0.9], [2.0, 2.1, 1.9])
    assert apart is not None and apart.high < 0
    assert difference_interval([1.0], [2.0, 3.0]) is None
    same = difference_interval([1.0, 1.0], [1.0, 1.0])
    assert same is not None and (same.low, same.high) == (0.0, 0.0)


def test_paired_interval_is_the_one_sample_interval_of_the_differences() -> None:
    a, b = [2.0, 2.5, 1.8, None], [2.1, 2.6, 1.95, 2.0]
    got = paired_interval(a, b)
    assert got is not None
    differences = [-0.1, -0.1, -0.15]  # the fourth pair has no value on one side
    mean = sum(differences) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / 2)
    assert (got.n, got.mean, got.sd) == (3, pytest.approx(mean), pytest.approx(sd))
    assert got.high == pytest.approx(mean + 4.303 * sd / math.sqrt(3), abs=1e-3)
    # The seed-to-seed spread both sides share cancels: Welch cannot see this difference.
    welch = difference_interval([x for x in a if x is not None], b[:3])
    assert got.high < 0 < welch.high


def test_paired_interval_needs_two_pairs_of_the_same_length() -> None:
    assert paired_interval([1.0, float("nan")], [1.1, 1.2]) is None
    assert paired_interval([1.0], [1.1]) is None
    with pytest.raises(ValueError, match="3 values paired with 2"):
        paired_interval([1.0, 2.0, 3.0], [1.0, 2.0])
