"""IncrementalReader: read once downsampled, then only the steps logged since."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from blockviz.store import RunStore
from blockviz.views.incremental import IncrementalReader

KEY = "test.cache"


@pytest.fixture
def store(tmp_path) -> Iterator[RunStore]:
    opened = RunStore(tmp_path / "runs.db")
    yield opened
    opened.close()


def log_loss(store: RunStore, run_id: int, steps: range, value: float = 1.0) -> None:
    store.log_scalars(run_id, [(step, "train/loss", value + step) for step in steps])
    store.flush()


class Recorder:
    """A store read that records its (after_step, max_points) and serves a fixed frame."""

    def __init__(self, store: RunStore, run_id: int) -> None:
        self.store, self.run_id = store, run_id
        self.calls: list[tuple[int | None, int | None]] = []

    def __call__(self, after: int | None, points: int | None) -> pd.DataFrame:
        self.calls.append((after, points))
        return self.store.scalars(self.run_id, after_step=after, max_points=points)


def test_the_first_read_is_downsampled_and_later_reads_fetch_only_new_steps(
    store: RunStore,
) -> None:
    run_id = store.create_run("a", {}, status="running")
    log_loss(store, run_id, range(0, 100))
    state: dict[str, Any] = {}
    reader = IncrementalReader(state, KEY, max_points=10)
    fetch = Recorder(store, run_id)
    first = reader.read("scalars", run_id, fetch, ("run_id", "name"))
    assert fetch.calls == [(None, 10)]
    assert len(first) < 100  # downsampled
    log_loss(store, run_id, range(100, 130))
    grown = reader.read("scalars", run_id, fetch, ("run_id", "name"))
    last_cached = int(first["step"].max())
    assert fetch.calls[1] == (last_cached - 1, None)  # only what came after, whole
    assert grown["step"].max() == 129
    assert set(range(100, 130)) <= set(grown["step"])
    assert not grown.duplicated(["name", "step"]).any()
    assert grown["step"].is_monotonic_increasing
    assert state[KEY]["scalars"] is grown  # kept in the caller's mapping


def test_the_newest_cached_step_is_read_again(store: RunStore) -> None:
    # A writer's flush can land one step in parts: a row of the last drawn step arrives late.
    run_id = store.create_run("a", {}, status="running")
    log_loss(store, run_id, range(0, 5))
    reader = IncrementalReader({}, KEY)
    reader.scalars(store, run_id)
    store.log_scalars(run_id, [(4, "val/loss", 2.5), (5, "train/loss", 0.5)])
    store.flush()
    frame = reader.scalars(store, run_id)
    assert ((frame["name"] == "val/loss") & (frame["step"] == 4)).sum() == 1
    assert ((frame["name"] == "train/loss") & (frame["step"] == 4)).sum() == 1
    assert not frame.duplicated(["name", "step"]).any()
    assert frame[frame["name"] == "train/loss"]["step"].tolist() == list(range(6))


def test_nothing_new_keeps_the_cached_frame(store: RunStore) -> None:
    run_id = store.create_run("a", {}, status="running")
    log_loss(store, run_id, range(0, 5))
    reader = IncrementalReader({}, KEY)
    first = reader.scalars(store, run_id)
    again = reader.scalars(store, run_id)
    pd.testing.assert_frame_equal(first, again)


def test_switching_run_drops_the_cache(store: RunStore) -> None:
    one = store.create_run("one", {}, status="running")
    two = store.create_run("two", {}, status="running")
    log_loss(store, one, range(0, 5))
    log_loss(store, two, range(0, 3))
    state: dict[str, Any] = {}
    reader = IncrementalReader(state, KEY)
    reader.scalars(store, one)
    reader.layer_stats(store, one, "component")
    assert set(state[KEY]) == {"run_id", "scalars", "layer_stats.component"}
    frame = reader.scalars(store, two)
    assert state[KEY]["run_id"] == two
    assert set(state[KEY]) == {"run_id", "scalars"}  # the other run's frames are gone
    assert set(frame["run_id"]) == {two} and frame["step"].max() == 2


def test_a_series_grown_too_long_is_read_again_downsampled(store: RunStore) -> None:
    run_id = store.create_run("a", {}, status="running")
    log_loss(store, run_id, range(0, 10))
    reader = IncrementalReader({}, KEY, max_points=4, reread_factor=2)
    fetch = Recorder(store, run_id)
    reader.read("scalars", run_id, fetch, ("run_id", "name"))
    assert fetch.calls == [(None, 4)]
    log_loss(store, run_id, range(10, 20))
    grown = reader.read("scalars", run_id, fetch, ("run_id", "name"))
    assert fetch.calls[1][1] is None  # still within 2 x 4 rows before this read
    assert len(grown) > 8
    reader.read("scalars", run_id, fetch, ("run_id", "name"))
    assert fetch.calls[2] == (None, 4)  # past 8 rows: one downsampled read of everything


def test_layer_stats_grow_per_kind(store: RunStore) -> None:
    run_id = store.create_run("a", {}, status="running")
    rows = [
        (step, layer, "component", "block", "grad_norm", 0.1)
        for step in (0, 10)
        for layer in (0, 1)
    ]
    store.log_layer_stats(run_id, rows)
    store.flush()
    reader = IncrementalReader({}, KEY)
    assert len(reader.layer_stats(store, run_id, "component")) == 4
    assert reader.layer_stats(store, run_id, "tap").empty
    store.log_layer_stats(run_id, [(20, 0, "component", "block", "grad_norm", 0.2)])
    store.flush()
    grown = reader.layer_stats(store, run_id, "component")
    assert sorted(grown["step"].unique()) == [0, 10, 20] and len(grown) == 5
