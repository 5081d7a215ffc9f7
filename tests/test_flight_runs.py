"""The flight recorder's analysis on the frames a real tiny run stores (tests/real_runs.py:
30 steps, probed at 0, 10, 20 and 29)."""

from __future__ import annotations

import pytest

from blockviz.core import flight, spec
from blockviz.store import RunStore


@pytest.fixture(scope="module")
def frames(real_runs):
    with RunStore(real_runs.path, readonly=True) as store:
        run = real_runs.ids["pre"]
        n_layer = store.get_run(run).config["model"]["n_layer"]
        return store.scalars(run), store.layer_stats(run), n_layer


def test_every_scanned_statistic_of_a_real_run_is_a_series(frames):
    scalars, layers, n_layer = frames
    rows = flight.series_rows(scalars, layers)
    assert set(rows["scope"]) == {flight.SCALAR, *flight.SCANNED_KINDS}
    assert set(rows.loc[rows["scope"] == flight.SCALAR, "stat"]) == set(flight.SCANNED_SCALARS)
    assert set(rows["stat"]) <= set(spec.METRICS)
    heads = rows[rows["scope"] == "head"]
    assert set(heads["stat"]) == set(spec.HEAD_STATS)
    assert set(heads["layer"]) == set(range(n_layer))
    # per-tensor rows are left out; every other stored row of a scanned kind is kept
    kept = layers[layers["kind"].isin(flight.SCANNED_KINDS)]
    assert len(rows) == len(kept) + scalars["name"].isin(flight.SCANNED_SCALARS).sum()


def test_a_real_run_probed_too_rarely_has_no_range(frames):
    scalars, layers, n_layer = frames
    ranges = flight.healthy_ranges(scalars, layers, 20)  # probes at 10 and 20 only
    assert ranges.empty
    with pytest.raises(flight.ShortHistory):
        flight.first_break(ranges, scalars, layers, 29, "loss spike", n_layer)
