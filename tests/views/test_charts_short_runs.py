"""Issue 13 charts: short runs (integer step axes, lone points, no NaN labels), layer names,
the x axis (step, wall-clock time, tokens seen) and Compare's preselection."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import altair as alt
import numpy as np
import pandas as pd
import pytest

from blockviz.core import spec
from blockviz.dashboard.compare.selection import preselected_runs
from blockviz.store import RunRecord, RunStore
from blockviz.views import charts
from blockviz.views.export.render import chart_spec, chart_svg
from tests.helpers import spec_dicts
from tests.real_runs import RealRuns


@pytest.fixture(scope="module")
def real(real_runs: RealRuns) -> Iterator[RunStore]:
    store = RunStore(real_runs.path)
    yield store
    store.close()


def _x_encodings(chart: alt.TopLevelMixin) -> list[dict]:
    return [n["x"] for n in spec_dicts(chart_spec(chart)) if isinstance(n.get("x"), dict)]


def _titles(chart: alt.TopLevelMixin) -> list[str]:
    found = []
    for node in spec_dicts(chart_spec(chart)):
        title = node.get("title")
        text = title.get("text") if isinstance(title, dict) else title
        if isinstance(text, str):
            found.append(text)
    return found


def _svg_texts(chart: alt.TopLevelMixin) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", chart_svg(chart))


def _svg_groups(chart: alt.TopLevelMixin, label_start: str) -> list[list[str]]:
    """The texts inside each SVG group whose aria-label starts with `label_start` (an axis
    as "X-axis titled 'step'", a legend as "Symbol legend titled 'layer'")."""
    root = ET.fromstring(chart_svg(chart))
    return [
        [t for t in element.itertext() if t.strip()]
        for element in root.iter()
        if (element.get("aria-label") or "").startswith(label_start)
    ]


def _diverged_charts(store: RunStore, run_id: int) -> dict[str, alt.TopLevelMixin]:
    """Every time-series chart of the diverged real run (non-finite from step 1)."""
    run = store.get_run(run_id)
    scalars = store.scalars(run_id)
    components = store.layer_stats(run_id, kind="component")
    taps = store.layer_stats(run_id, kind="tap")
    heads = store.layer_stats(run_id, kind="head")
    diverged = {run.name: run.diverged_step}
    return {
        "loss": charts.loss_chart(scalars, diverged=diverged),
        "grad_norm": charts.metric_chart(
            scalars, "train/grad_norm", log_scale=True, diverged=diverged
        ),
        "lr": charts.metric_chart(scalars, "train/lr"),
        "layer_lines": charts.layer_lines(components),
        "layer_heatmap": charts.layer_heatmap(components),
        "update_ratio": charts.update_ratio_chart(components),
        "tap_stats": charts.tap_stats_chart(taps),
        "entropy": charts.attention_entropy_chart(heads),
    }


# ------------------------------------------------------------------- short runs (item 3)


def test_short_run_step_axes_are_whole_numbers_and_titles_are_never_nan(
    real: RealRuns, real_runs: RealRuns
) -> None:
    run_id = real_runs.ids["diverged"]
    assert real.get_run(run_id).diverged_step is not None
    for name, chart in _diverged_charts(real, run_id).items():
        steps = [x for x in _x_encodings(chart) if x.get("field") == "step"]
        assert steps, name
        for x in steps:
            axis = x["axis"]
            assert axis["format"] == charts.STEP_AXIS.format, name
            assert "~s" not in axis["format"]  # NaN under a zero-width domain in the browser
            # A short run lists its ticks: whole steps only, each once.
            assert axis["values"] == sorted(set(axis["values"])), name
            assert all(float(v).is_integer() for v in axis["values"]), name
        assert not any("nan" in t.lower() for t in _titles(chart)), name
        texts = _svg_texts(chart)
        assert not any("NaN" in t for t in texts), (name, texts)
        # No fractional tick label on any step axis (the loss chart had 0.1 ... 2).
        for labels in _svg_groups(chart, "X-axis titled 'step'"):
            ticks = [t for t in labels if t != "step"]
            assert ticks and all(t.replace(",", "").isdigit() for t in ticks), (name, ticks)
            assert len(ticks) == len(set(ticks)), (name, ticks)


def test_long_step_axes_ask_for_whole_ticks_and_few_of_them(
    real: RealRuns, real_runs: RealRuns
) -> None:
    run_id = real_runs.ids["pre"]
    scalars = pd.concat([real.scalars(run_id).assign(step=lambda f: f["step"] * 10)])
    chart = charts.metric_chart(scalars, "train/grad_norm", log_scale=True)
    (axis,) = {str(x["axis"]): x["axis"] for x in _x_encodings(chart)}.values()
    assert axis["tickMinStep"] == 1
    assert axis["tickCount"] <= 8


def test_a_series_of_one_point_is_drawn_as_a_point(real: RealRuns, real_runs: RealRuns) -> None:
    run_id = real_runs.ids["diverged"]
    scalars = real.scalars(run_id)
    finite = scalars[np.isfinite(scalars["value"]) & (scalars["name"] == "train/grad_norm")]
    assert len(finite) == 1  # the run's only finite global gradient norm
    chart = charts.metric_chart(scalars, "train/grad_norm", log_scale=True)
    svg = chart_svg(chart)
    assert 'aria-roledescription="point"' in svg
    lines = charts.layer_lines(real.layer_stats(run_id, kind="component"))
    assert 'aria-roledescription="point"' in chart_svg(lines)


def test_a_dense_series_gets_no_points(real: RealRuns, real_runs: RealRuns) -> None:
    chart = charts.loss_chart(real.scalars(real_runs.ids["pre"]), smoothing=0.0)
    assert 'aria-roledescription="point"' not in chart_svg(chart)


# ------------------------------------------------------------------- layer names (item 9)


def test_per_layer_legends_say_embed_and_head_in_depth_order(
    real: RealRuns, real_runs: RealRuns
) -> None:
    run_id = real_runs.ids["pre"]
    n_layer = real.get_run(run_id).config["model"]["n_layer"]
    components = real.layer_stats(run_id, kind="component")
    expected = ["embed", *map(str, range(n_layer)), "head"]
    for chart in (
        charts.layer_lines(components),
        charts.layer_lines(components, n_layers=n_layer),
        charts.update_ratio_chart(components),
    ):
        data = charts.chart_data(chart)
        assert sorted(set(data["layer_name"]), key=expected.index) == expected
        (legend,) = _svg_groups(chart, "Symbol legend titled 'layer'")
        assert legend == [*expected, "layer"]
    heat = _svg_texts(charts.layer_heatmap(components))
    assert "embed" in heat and "head" in heat and "-1" not in heat


def test_grad_by_layer_axis_names_embed_and_head(real: RealRuns, real_runs: RealRuns) -> None:
    ids = [real_runs.ids["pre"], real_runs.ids["post"]]
    at_init = real.layer_stats(ids, kind="component", stat="grad_norm", step=0)
    texts = _svg_texts(charts.grad_by_layer_chart(at_init, step=0))
    assert "embed" in texts and "head" in texts and "-1" not in texts


def test_layer_names_follow_the_given_depth_per_run() -> None:
    frame = pd.DataFrame(
        {"run_id": [1, 1, 2, 2], "layer": [-1, 2, -1, 2], "component": ["norm"] * 4}
    )
    named, order = charts.with_layer_names(frame, {1: 2, 2: 4})
    assert list(named["layer_name"]) == ["embed", "head", "embed", "2"]
    assert order == ["embed", "2", "head"]


# ------------------------------------------------------------------- x axis (item 14)


def _config(batch_size: int, block_size: int, devices: int = 1, num_nodes: int = 1) -> dict:
    return {
        "model": {"block_size": block_size},
        "train": {"batch_size": batch_size, "devices": devices, "num_nodes": num_nodes},
    }


@pytest.mark.parametrize("kind", list(charts.X_AXES))
def test_x_axis_formats_never_derive_their_precision_from_the_domain(kind: str) -> None:
    # d3 derives a missing precision of an s/r/g/e/f/% format from the tick step, which a
    # one-step domain makes 0: the browser then labelled the tick "NaN".
    fmt = charts.X_AXES[kind].format
    assert fmt[-1] == "d" or re.search(r"\.\d+~?[efgprs%]$", fmt), fmt


def test_tokens_per_step_counts_every_device() -> None:
    assert charts.tokens_per_step(_config(3, 5)) == 15
    assert charts.tokens_per_step(_config(3, 5, devices=2, num_nodes=3)) == 90
    assert charts.tokens_per_step({"model": {}}) is None
    assert charts.tokens_per_step(None) is None


def _elapsed_rows(run_id: int, steps: list[int], seconds: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run_id": run_id,
            "run": f"r{run_id}",
            "step": steps,
            "name": spec.TRAIN_ELAPSED_S,
            "value": seconds,
        }
    )


def test_with_x_places_steps_in_tokens_and_interpolated_time() -> None:
    runs = [RunRecord(id=1, name="r1", config=_config(2, 4))]
    clocks = charts.run_clocks(runs, _elapsed_rows(1, [0, 10, 20], [1.0, 3.0, 7.0]))
    frame = pd.DataFrame({"run_id": 1, "run": "r1", "step": [0, 5, 20, 25], "value": 1.0})
    tokens = charts.with_x(frame, "tokens", clocks)
    assert list(tokens["tokens"]) == [s * 8 for s in frame["step"]]
    timed = charts.with_x(frame, "time", clocks)
    # step 5 lies halfway between the records at steps 0 and 10; step 25 is past the last
    assert list(timed["step"]) == [0, 5, 20]
    assert list(timed["time_s"]) == pytest.approx([1.0, 2.0, 7.0])


def test_a_resumed_runs_clock_carries_on() -> None:
    clock = charts.run_clocks(
        [RunRecord(id=1, name="r1", config=None)],
        _elapsed_rows(1, [0, 10, 20, 30], [1.0, 5.0, 0.5, 2.5]),
    ).elapsed[1]
    assert list(clock["time_s"]) == pytest.approx([1.0, 5.0, 5.5, 7.5])
    assert clock["time_s"].is_monotonic_increasing


def test_runs_without_a_clock_are_named() -> None:
    runs = [RunRecord(id=1, name="a", config=_config(1, 1)), RunRecord(id=2, name="b")]
    clocks = charts.run_clocks(runs, _elapsed_rows(1, [0], [1.0]))
    assert clocks.missing("time", [1, 2]) == [2]
    assert clocks.missing("tokens", [1, 2]) == [2]
    assert clocks.missing("step", [1, 2]) == []


def test_charts_draw_the_chosen_x_column(real: RealRuns, real_runs: RealRuns) -> None:
    run_id = real_runs.ids["pre"]
    run = real.get_run(run_id)
    scalars = real.scalars(run_id)
    clocks = charts.run_clocks([run], scalars)
    for kind in ("time", "tokens"):
        axis = charts.X_AXES[kind]
        placed = charts.with_x(scalars, kind, clocks)
        chart = charts.loss_chart(placed, x_axis=axis)
        fields = {x.get("field") for x in _x_encodings(chart)}
        assert fields == {axis.field}
        assert axis.title in str(chart_spec(chart))
        components = charts.with_x(real.layer_stats(run_id, kind="component"), kind, clocks)
        heat = charts.layer_heatmap(components, x_axis=axis)
        assert {x.get("field") for x in _x_encodings(heat)} == {axis.field}


def test_training_records_its_wall_clock_at_every_logged_step(
    real: RealRuns, real_runs: RealRuns
) -> None:
    scalars = real.scalars(real_runs.ids["pre"])
    elapsed = scalars[scalars["name"] == spec.TRAIN_ELAPSED_S].sort_values("step")
    logged = scalars[scalars["name"] == "train/step_time"]
    assert list(elapsed["step"]) == sorted(logged["step"])
    assert (elapsed["value"] > 0).all() and elapsed["value"].is_monotonic_increasing
    assert spec.scalar_label(spec.TRAIN_ELAPSED_S) != spec.TRAIN_ELAPSED_S


# ------------------------------------------------------------------- Compare preselection


def _runs(statuses: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"id": range(1, len(statuses) + 1), "status": statuses})


def test_compare_preselects_the_latest_finished_runs() -> None:
    runs = _runs(["completed", "diverged", "completed", "stopped", "failed"])
    assert preselected_runs(runs) == [2, 3]


def test_compare_fills_in_with_the_latest_others_when_too_few_finished() -> None:
    assert preselected_runs(_runs(["failed", "completed", "stopped"])) == [2, 3]
    assert preselected_runs(_runs(["failed", "stopped"])) == [1, 2]
    assert preselected_runs(_runs(["running"])) == [1]
