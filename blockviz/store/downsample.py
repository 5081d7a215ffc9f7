"""Min/max bucket downsampling: about N points per series, spikes and NaNs kept.

Pure numpy over rows sorted by series, then step; the store applies it to what SQL
returns, and a chart never sees a smoothed-away divergence.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def series_starts(keys: Sequence[np.ndarray]) -> np.ndarray:
    """Row indices where a new series begins, for rows sorted by the key columns."""
    size = len(keys[0]) if keys else 0
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    changed = np.zeros(size, dtype=bool)
    changed[0] = True
    for column in keys:
        changed[1:] |= column[1:] != column[:-1]
    return np.flatnonzero(changed)


def downsample_mask(
    starts: np.ndarray, steps: np.ndarray, values: np.ndarray, max_points: int
) -> np.ndarray:
    """Which rows to keep so each series has about max_points points, extremes intact.

    Rows are sorted by series, then step; `starts` are the series' first rows. A series
    of more than 2N+1 rows (N = max_points) is cut into N step buckets,
    bucket = (step - first step) * N // (span + 1), and keeps per bucket the row with the
    smallest and the one with the largest value, plus one NaN row where the bucket has
    one; every series keeps its last row. Shorter series are kept whole.
    """
    buckets = max(1, int(max_points))
    size = len(steps)
    lengths = np.diff(np.append(starts, size))  # (S,)
    if size == 0 or lengths.max() <= 2 * buckets + 1:
        return np.ones(size, dtype=bool)  # every series is short: nothing to thin
    lasts = starts + lengths - 1
    first_step = np.repeat(steps[starts], lengths)  # (n,)
    span = np.repeat(steps[lasts], lengths) - first_step + 1  # (n,)
    is_long = np.repeat(lengths > 2 * buckets + 1, lengths)  # (n,)
    bucket = (steps - first_step) * buckets // span  # (n,)
    keep = ~is_long
    keep[lasts] = True
    # Buckets are contiguous: steps only grow within a series. Number them in row order.
    series_id = np.repeat(np.arange(len(starts)), lengths)
    new_group = np.ones(size, dtype=bool)
    new_group[1:] = (bucket[1:] != bucket[:-1]) | (series_id[1:] != series_id[:-1])
    group_starts = np.flatnonzero(new_group)
    group = np.cumsum(new_group) - 1
    # Sort by value inside each group (numpy puts NaN last); the groups stay where they were.
    by_value = np.lexsort((values, group))
    non_nan_count = np.add.reduceat((~np.isnan(values)).astype(np.int64), group_starts)
    group_sizes = np.diff(np.append(group_starts, size))
    lowest = by_value[group_starts]
    highest = by_value[group_starts + np.maximum(non_nan_count, 1) - 1]
    last_by_value = by_value[group_starts + group_sizes - 1]  # a NaN if the group has one
    for picked in (lowest, highest, last_by_value):
        keep[picked[is_long[picked]]] = True
    return keep
