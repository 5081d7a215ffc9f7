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


# A healthy tiny run replayed `--around` steps fixed before it ran (issue 39: replays of
# healthy runs named breaks "N steps before the loss spike" though there was none).
HEALTHY = (
    *("--preset", "tiny", "--dataset", "pydocs", "--max_steps", "120", "--probe_interval", "5"),
    *("--ckpt_interval", "20", "--threads", "1", "--no_progress"),
)
AROUND_STEPS = (70, 110)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    from blockviz import cli

    store = tmp_path_factory.mktemp("healthy") / "runs.db"
    assert cli.main(["train", *HEALTHY, "--store", str(store)]) == 0
    for step in AROUND_STEPS:
        flags = ["--store", str(store), "--threads", "1", "--no_progress", "--after", "0"]
        assert cli.main(["replay", "1", "--around", str(step), *flags]) == 0
    with RunStore(store, readonly=True) as runs:
        return [runs.get_run(run_id).fork_info for run_id in (2, 3)]


@pytest.mark.slow
def test_replays_of_a_healthy_run_are_windows_that_name_no_break(healthy):
    for step, info in zip(AROUND_STEPS, healthy, strict=True):
        assert info["event"] == flight.AROUND and info["event_step"] == step
        assert info["break"] is None, info["sentence"]
        assert "loss spike" not in info["sentence"].split("no loss spike")[0]
        assert "before the" not in info["sentence"]
        assert "window" in info["sentence"]
