"""Min/max bucket downsampling on its own: series boundaries, extremes, NaNs, last points."""

from __future__ import annotations

import numpy as np
import pytest

from blockviz.store.downsample import downsample_mask, series_starts


def test_series_starts_marks_a_change_in_any_key_column():
    runs = np.array([1, 1, 1, 2, 2, 2])
    names = np.array(["a", "a", "b", "b", "b", "c"], dtype=object)
    assert series_starts([runs, names]).tolist() == [0, 2, 3, 5]
    assert series_starts([runs]).tolist() == [0, 3]


def test_series_starts_of_nothing_is_empty():
    assert series_starts([]).tolist() == []
    assert series_starts([np.array([], dtype=np.int64)]).tolist() == []


def test_short_series_are_kept_whole():
    steps = np.arange(41)  # 2N + 1 rows for N = 20: still short
    keep = downsample_mask(np.array([0]), steps, np.sin(steps / 3.0), max_points=20)
    assert keep.all()


def test_a_long_series_is_bounded_and_keeps_its_spike_and_last_point():
    steps = np.arange(10_000)
    values = np.zeros(len(steps))
    values[7_777] = 1e6  # a divergence spike, one row wide
    keep = downsample_mask(np.array([0]), steps, values, max_points=50)
    assert keep.sum() <= 2 * 50 + 1
    assert keep[7_777] and keep[-1]


def test_a_nan_survives_in_its_bucket():
    steps = np.arange(1_000)
    values = np.linspace(0.0, 1.0, len(steps))
    values[333] = np.nan
    keep = downsample_mask(np.array([0]), steps, values, max_points=10)
    assert np.isnan(values[keep]).sum() == 1
    assert keep[0] and keep[-1]  # the smallest value and the last point


def test_each_series_is_thinned_on_its_own():
    long_steps, short_steps = np.arange(500), np.arange(5)
    steps = np.concatenate([long_steps, short_steps])
    values = np.concatenate([np.cos(long_steps / 7.0), np.ones(len(short_steps))])
    keep = downsample_mask(np.array([0, 500]), steps, values, max_points=8)
    assert keep[500:].all()  # the short series, untouched by the long one's buckets
    assert keep[:500].sum() <= 3 * 8 + 1 and keep[499]


@pytest.mark.parametrize("max_points", [0, -3])
def test_max_points_below_one_means_one_bucket(max_points):
    steps = np.arange(100)
    values = np.arange(100, dtype=float)[::-1]
    keep = downsample_mask(np.array([0]), steps, values, max_points)
    assert keep.nonzero()[0].tolist() == [0, 99]  # the largest (first) and smallest (last)


def test_empty_input_keeps_nothing():
    empty = np.array([], dtype=np.int64)
    assert downsample_mask(empty, empty, np.array([], dtype=float), 10).tolist() == []
