"""Runs that differ only in seed: grouped, and drawn as a mean line with a 95% band."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core import config as cfg
from blockviz.core.studies.stats import t_quantile
from blockviz.store import RunRecord, RunStore
from blockviz.views import seed_groups
from blockviz.views.charts import chart_data

PAGES = Path(__file__).resolve().parents[2] / "pages"


def _config(seed: int, **overrides) -> str:
    return cfg.replace(cfg.preset("tiny"), seed=seed, **overrides).to_json()


def _run(run_id: int, seed: int | None, **overrides) -> RunRecord:
    """A stored run whose config is the tiny preset with `seed` and `overrides` (None: the
    run has no readable config)."""
    config = None if seed is None else json.loads(_config(seed, **overrides))
    return RunRecord(id=run_id, name=f"r{run_id}", config=config)


def test_only_seed_differences_group() -> None:
    runs = [
        _run(1, 1),
        _run(2, 2),
        _run(3, 3, lr=2e-3),
        _run(4, 4),
        _run(5, None),
        _run(6, 5, lr=2e-3),
    ]
    assert seed_groups.seed_groups(runs) == [[1, 2, 4], [3, 6], [5]]
    names = seed_groups.group_names([[1, 2, 4], [3, 6], [5]], {1: "a", 3: "b", 5: "c"})
    assert names == {
        1: "a (3 seeds)",
        2: "a (3 seeds)",
        4: "a (3 seeds)",
        3: "b (2 seeds)",
        6: "b (2 seeds)",
        5: "c",
    }


def test_a_fork_is_no_second_seed_of_its_parent() -> None:
    """A fork with no change has its parent's config and seed: grouping them would draw one
    run twice as a 95% interval of two seeds."""
    twin = dataclasses.replace(_run(2, 1), parent_id=1, fork_step=100, fork_kind="fork")
    assert seed_groups.seed_groups([_run(1, 1), twin, _run(3, 2)]) == [[1, 3], [2]]


def _scalars(values: dict[int, list[float]], name: str = "val/loss") -> pd.DataFrame:
    rows = [(r, s, name, v) for r, vs in values.items() for s, v in enumerate(vs)]
    return pd.DataFrame(rows, columns=["run_id", "step", "name", "value"])


def test_band_numbers_by_hand() -> None:
    scalars = _scalars({1: [3.0, 2.0], 2: [3.2, 2.4], 3: [3.4, float("inf")], 9: [1.0, 1.0]})
    bands = seed_groups.band_frame(scalars, {1: "g", 2: "g", 3: "g"}, ["val/loss"])
    first, second = bands.iloc[0], bands.iloc[1]
    half = t_quantile(0.975, 2) * 0.2 / math.sqrt(3)  # values 3.0, 3.2, 3.4: sd 0.2
    assert (first["n"], first["mean"]) == (3, pytest.approx(3.2))
    assert (first["low"], first["high"]) == (pytest.approx(3.2 - half), pytest.approx(3.2 + half))
    assert second["n"] == 2 and second["mean"] == pytest.approx(2.2)  # inf left out
    lone = seed_groups.band_frame(scalars, {9: "h"}, ["val/loss"])
    assert lone["n"].tolist() == [1, 1] and lone["low"].isna().all()


def test_band_chart_carries_its_numbers_and_handles_no_data() -> None:
    bands = seed_groups.band_frame(_scalars({1: [3.0], 2: [3.4]}), {1: "g", 2: "g"})
    chart = seed_groups.band_chart(bands, "t", "loss")
    assert chart_data(chart)[["mean", "n"]].values.tolist() == [[pytest.approx(3.2), 2]]
    empty = seed_groups.band_chart(seed_groups.band_frame(pd.DataFrame(), {}), "t", "loss")
    assert chart_data(empty).empty


def test_compare_groups_seeds_when_asked() -> None:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        ids = [store.create_run(f"run{s}", _config(s), status="completed") for s in (1, 2)]
        for run_id, offset in zip(ids, (0.0, 0.2), strict=True):
            for step in range(0, 30, 10):
                store.log_metrics(run_id, step, {"train/loss": 3.0 - step / 30 + offset})
        store.flush()
    at = AppTest.from_file(str(PAGES / "compare.py"), default_timeout=60).run()
    assert not at.exception
    toggle = at.toggle(key="compare.group_seeds")
    assert toggle.value is False
    toggle.set_value(True).run()
    assert not at.exception
    captions = " ".join(c.value for c in at.caption)
    assert "1 line(s) from 2 runs (2 seeds)" in captions
    titles = [str(e.proto.spec) for e in at.get("vega_lite_chart")]
    assert any("loss by seed group" in t for t in titles)


def test_a_blown_up_group_does_not_flatten_the_grouped_loss_chart() -> None:
    blown = {1: [4.8, 3.0, 2.5], 2: [4.7, 3.1, 2.4], 3: [4.9, 7.6e6, 5e6], 4: [4.8, 3.0, 2.6]}
    groups = {1: "steady", 2: "steady", 3: "blown", 4: "blown"}
    bands = seed_groups.band_frame(_scalars(blown), groups, ["val/loss"])
    spec = seed_groups.band_chart(bands, "t", "loss", loss=True).to_dict()
    scales = [layer["encoding"]["y"].get("scale", {}) for layer in spec["layer"]]
    tops = [scale.get("domainMax") for scale in scales]
    assert tops == [pytest.approx(2 * 4.8)] * len(scales)  # twice the median starting mean
    assert all(scale.get("clamp") for scale in scales)
    subtitle = " ".join(spec["title"]["subtitle"])
    assert "blown" in subtitle and "steady" not in subtitle and "CSV" in subtitle
    assert chart_data(seed_groups.band_chart(bands, "t", "loss", loss=True))["mean"].max() > 1e6
    # A metric, or a log scale, keeps every value on the axis.
    for chart in (
        seed_groups.band_chart(bands, "t", "loss"),
        seed_groups.band_chart(bands, "t", "loss", log_scale=True, loss=True),
    ):
        assert all(
            "domainMax" not in str(layer["encoding"]["y"]) for layer in chart.to_dict()["layer"]
        )
