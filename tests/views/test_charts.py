"""Chart builders: valid specs with the promised encodings, empty and non-finite input, colours."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import altair as alt
import numpy as np
import pandas as pd
import pytest

from blockviz.views import charts
from tests.helpers import (
    FRAME_RUNS,
    attn_frame,
    hist_frame,
    layer_frame,
    params_components,
    params_layers,
    scalars_frame,
)


def walk(spec: Any, key: str) -> Iterator[Any]:
    """Every value stored under `key` anywhere in a nested spec."""
    if isinstance(spec, dict):
        for k, v in spec.items():
            if k == key:
                yield v
            yield from walk(v, key)
    elif isinstance(spec, list):
        for item in spec:
            yield from walk(item, key)


def encoded_fields(spec: dict) -> dict[str, set[str]]:
    """channel -> the fields it encodes, over every layer / facet of the spec."""
    found: dict[str, set[str]] = {}
    for encoding in walk(spec, "encoding"):
        for channel, definition in encoding.items():
            items = definition if isinstance(definition, list) else [definition]
            for item in items:
                if isinstance(item, dict) and "field" in item:
                    found.setdefault(channel, set()).add(item["field"])
    for facet in walk(spec, "facet"):  # a facet chart names its field outside `encoding`
        if isinstance(facet, dict) and "field" in facet:
            found.setdefault("facet", set()).add(facet["field"])
    return found


def tooltip_fields(spec: dict) -> set[str]:
    return {t["field"] for tips in walk(spec, "tooltip") if isinstance(tips, list) for t in tips}


def marks(spec: dict) -> set[str]:
    return {m["type"] if isinstance(m, dict) else m for m in walk(spec, "mark")}


def param_binds(spec: dict) -> list[Any]:
    return [p.get("bind") for params in walk(spec, "params") for p in params]


# builder, its input, the channel -> field pairs it must encode, the fields its tooltip must show
CASES: dict[str, tuple[Callable[[pd.DataFrame], alt.TopLevelMixin], Callable[[], Any], dict]] = {
    "loss": (
        lambda f: charts.loss_chart(f),
        scalars_frame,
        {"x": "step", "y": "smoothed", "color": "run", "strokeDash": "name"},
    ),
    "metric": (
        lambda f: charts.metric_chart(f, "train/lr", log_scale=True),
        scalars_frame,
        {"x": "step", "y": "smoothed", "color": "run"},
    ),
    "layer_lines": (
        lambda f: charts.layer_lines(f),
        layer_frame,
        {"x": "step", "y": "value", "color": "layer_name"},
    ),
    "layer_heatmap": (
        lambda f: charts.layer_heatmap(f, "grad_norm", "block"),
        layer_frame,
        {"x": "step", "x2": "step_end", "y": "layer_name", "color": "value"},
    ),
    "tap_stats": (
        lambda f: charts.tap_stats_chart(f, "rms"),
        layer_frame,
        {"x": "step", "y": "value", "color": "layer_name", "facet": "component"},
    ),
    "histogram": (
        lambda f: charts.histogram_over_time(f),
        hist_frame,
        {"x": "step", "y": "lo", "y2": "hi", "color": "count"},
    ),
    "update_ratio": (
        lambda f: charts.update_ratio_chart(f),
        layer_frame,
        {"x": "step", "y": "log10_update_ratio", "color": "layer_name"},
    ),
    "attention_entropy": (
        lambda f: charts.attention_entropy_chart(f),
        layer_frame,
        {"x": "step", "y": "value", "color": "head", "facet": "layer"},
    ),
    "attention_heatmap": (
        lambda f: charts.attention_heatmap(f, layer=0),
        attn_frame,
        {"x": "key", "y": "query", "color": "weight", "facet": "head"},
    ),
    "grad_by_layer": (
        lambda f: charts.grad_by_layer_chart(f, step=0),
        layer_frame,
        # `line`: the run's name, with its own step when that is not the chart's
        {"x": "layer", "y": "value", "color": "line"},
    ),
    "param_breakdown": (
        lambda f: charts.param_breakdown_chart(f),
        params_components,
        {"x": "count", "y": "component"},
    ),
    "param_layer": (
        lambda f: charts.param_layer_chart(f),
        params_layers,
        {"x": "layer", "y": "count", "color": "component"},
    ),
}
LINE_CASES = [
    "loss",
    "metric",
    "layer_lines",
    "tap_stats",
    "update_ratio",
    "attention_entropy",
    "grad_by_layer",
]


@pytest.mark.parametrize("case", list(CASES))
def test_builder_encodes_the_promised_fields_and_has_a_title(case: str) -> None:
    build, make, expected = CASES[case]
    chart = build(make())
    spec = chart.to_dict()
    fields = encoded_fields(spec)
    for channel, field in expected.items():
        assert field in fields.get(channel, set()), (channel, field, fields)
    assert charts.NO_DATA not in str(spec)
    assert chart.title and isinstance(chart.title, str)
    assert not charts.chart_data(chart).empty


@pytest.mark.parametrize("case", LINE_CASES)
def test_line_charts_have_tooltips_legend_highlight_and_x_zoom(case: str) -> None:
    build, make, _ = CASES[case]
    spec = build(make()).to_dict()
    assert {"run", "step", "value"} <= tooltip_fields(spec)
    binds = param_binds(spec)
    assert "legend" in binds
    assert "scales" in binds
    # Params are declared once; a second copy in another layer breaks Vega-Lite.
    names = [p["name"] for params in walk(spec, "params") for p in params]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("case", list(CASES))
def test_empty_frame_gives_a_no_data_chart(case: str) -> None:
    build, make, _ = CASES[case]
    empty = make().iloc[0:0]
    chart = build(empty)
    spec = chart.to_dict()
    assert charts.NO_DATA in str(spec)
    assert "text" in marks(spec)
    assert chart.title


@pytest.mark.parametrize("case", ["loss", "metric", "layer_lines", "layer_heatmap", "update_ratio"])
def test_non_finite_values_are_dropped_not_raised(case: str) -> None:
    build, make, _ = CASES[case]
    frame = make()
    frame.loc[frame.index[::7], "value"] = np.inf
    frame.loc[frame.index[3::11], "value"] = np.nan
    chart = build(frame)
    chart.to_dict()
    data = charts.chart_data(chart)
    numeric = data.select_dtypes("number")
    assert np.isfinite(numeric.to_numpy(dtype=float)).all()


def test_loss_chart_marks_divergence_at_the_first_non_finite_step() -> None:
    frame = scalars_frame()
    blown = (frame["run"] == "run-b") & (frame["step"] >= 22)
    frame.loc[blown, "value"] = np.inf
    spec = charts.loss_chart(frame).to_dict()
    rules = [layer for layer in spec["layer"] if "rule" in marks(layer)]
    assert rules, "no divergence rule"
    marked = [row for values in walk(spec, "datasets") for rows in values.values() for row in rows]
    assert {"run": "run-b", "step": 22, "label": "run-b diverged @ 22"} in marked


def test_loss_chart_uses_a_given_diverged_step() -> None:
    spec = charts.loss_chart(scalars_frame(), diverged={"run-a": 17, "elsewhere": 3}).to_dict()
    labels = [
        row.get("label") for v in walk(spec, "datasets") for rows in v.values() for row in rows
    ]
    assert "run-a diverged @ 17" in labels
    assert not any(str(label).startswith("elsewhere") for label in labels)


def test_loss_chart_data_holds_the_smoothed_values_it_draws() -> None:
    frame = scalars_frame()
    data = charts.chart_data(charts.loss_chart(frame, smoothing=0.5))
    one = data[(data["run"] == "run-a") & (data["name"] == "train/loss")].sort_values("step")
    expected = charts.ema(one["value"], 0.5)
    np.testing.assert_allclose(one["smoothed"], expected)
    assert set(data["name"]) == {"train/loss", "val/loss"}
    assert len(data) == len(frame[frame["name"] != "train/lr"])


def test_a_sparse_val_series_is_drawn_raw_and_ends_at_its_last_value() -> None:
    # Three evaluations; the train loss logged at every step is dense and gets the EMA.
    frame = scalars_frame(steps=30)
    vals = frame[frame["name"] == "val/loss"]
    assert vals.groupby("run")["step"].count().eq(3).all()
    data = charts.chart_data(charts.loss_chart(frame, smoothing=0.6))
    for _, rows in data[data["name"] == "val/loss"].groupby("run"):
        rows = rows.sort_values("step")
        np.testing.assert_allclose(rows["smoothed"], rows["value"])
        assert rows["smoothed"].iloc[-1] == rows["value"].iloc[-1]
    train = data[(data["run"] == "run-a") & (data["name"] == "train/loss")].sort_values("step")
    assert len(train) >= charts.MIN_SMOOTHED_POINTS
    np.testing.assert_allclose(train["smoothed"], charts.ema(train["value"], 0.6))
    assert not np.allclose(train["smoothed"], train["value"])


def test_only_dense_non_validation_series_are_smoothed() -> None:
    dense = charts.MIN_SMOOTHED_POINTS
    assert charts.is_smoothed("train/loss", dense)
    assert not charts.is_smoothed("train/loss", dense - 1)
    assert not charts.is_smoothed("val/loss", 10 * dense)  # even a long validation series
    short = scalars_frame(steps=dense - 1)
    data = charts.chart_data(charts.metric_chart(short, "train/loss", smoothing=0.9))
    np.testing.assert_allclose(data["smoothed"], data["value"])
    with pytest.raises(charts.ChartError, match="smoothing"):
        charts.metric_chart(short, "train/loss", smoothing=1.5)


def tensorboard_ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's loop: debiased accumulator; non-finite values pass through untouched."""
    out, last, count = [], 0.0, 0
    for value in values:
        if not math.isfinite(value):
            out.append(value)
            continue
        last = last * weight + (1 - weight) * value
        count += 1
        out.append(last / (1 - weight**count))
    return out


@pytest.mark.parametrize("weight", [0.0, 0.3, 0.6, 0.99])
def test_ema_matches_tensorboard(weight: float) -> None:
    values = [3.0, 2.5, float("nan"), 2.7, 1.0, float("inf"), 0.5, 0.4]
    got = charts.ema(pd.Series(values), weight).tolist()
    want = tensorboard_ema(values, weight)
    np.testing.assert_allclose(got, want, equal_nan=True)


def test_ema_is_not_poisoned_by_inf() -> None:
    smoothed = charts.ema(pd.Series([1.0, np.inf, 1.0, 1.0]), 0.9)
    assert np.isinf(smoothed[1])
    assert np.isfinite(smoothed[[0, 2, 3]]).all()
    assert smoothed[0] == 1.0  # debiased: the first point is not pulled towards zero


@pytest.mark.parametrize("smoothing", [-0.1, 1.0, 2.0, True])
def test_ema_rejects_bad_smoothing(smoothing: float) -> None:
    with pytest.raises(charts.ChartError, match="smoothing"):
        charts.ema(pd.Series([1.0]), smoothing)


def colour_of(scale: alt.Scale, name: str) -> str:
    return dict(zip(scale.domain, scale.range, strict=True))[name]


def test_run_colours_are_stable_whatever_else_is_shown() -> None:
    alone = charts.run_color_scale({7: "run-7"})
    crowded = charts.run_color_scale({12: "b", 1: "a", 7: "run-7", 3: "c"})
    assert colour_of(alone, "run-7") == colour_of(crowded, "run-7")
    assert crowded.domain == ["a", "c", "run-7", "b"]  # ordered by id
    runs_frame = pd.DataFrame({"id": [7, 2], "name": ["run-7", "x"]})
    assert colour_of(charts.run_color_scale(runs_frame), "run-7") == colour_of(alone, "run-7")
    ten = charts.run_color_scale({i: f"r{i}" for i in range(1, 11)})
    assert len(set(ten.range)) == 10


def test_charts_default_to_the_stable_run_colours() -> None:
    only_second = scalars_frame(runs={2: "run-b"})
    spec = charts.loss_chart(only_second).to_dict()
    ranges = [enc["color"]["scale"]["range"] for enc in walk(spec, "encoding") if "color" in enc]
    assert ranges and all(
        r == [colour_of(charts.run_color_scale(FRAME_RUNS), "run-b")] for r in ranges
    )


@pytest.mark.parametrize(("step", "shown"), [(0, 0), (25, 20), (12, 10), (1000, 30)])
def test_grad_by_layer_shows_each_runs_nearest_probe_step(step: int, shown: int) -> None:
    data = charts.chart_data(charts.grad_by_layer_chart(layer_frame(), step=step))
    assert set(data["step"]) == {shown}
    assert set(data["run"]) == set(FRAME_RUNS.values())
    assert set(data["component"]) == {"block"}


def test_attention_heatmap_keeps_only_the_causal_triangle() -> None:
    data = charts.chart_data(charts.attention_heatmap(attn_frame(), layer=0))
    assert (data["key"] <= data["query"]).all()
    assert len(data) == 2 * (4 * 5 // 2)


def test_histogram_leaves_empty_bins_blank() -> None:
    data = charts.chart_data(charts.histogram_over_time(hist_frame()))
    assert (data["count"] > 0).all()
    assert (data["step_end"] > data["step"]).all()


def outside_frame(below: float, above: float, steps=(0, 10, 20)) -> pd.DataFrame:
    """Tap statistics below_range / above_range of hist_frame's tap: `above` at step 10 only."""
    rows = [
        (1, "run-a", step, 0, "tap", "resid_post", stat, value if step == 10 else 0.0)
        for step in steps
        for stat, value in (("below_range", below), ("above_range", above))
    ]
    columns = ["run_id", "run", "step", "layer", "kind", "component", "stat", "value"]
    return pd.DataFrame(rows, columns=columns)


def _subtitle(chart) -> str | None:
    title = chart.to_dict()["title"]
    return title.get("subtitle") if isinstance(title, dict) else None


def test_histogram_states_the_share_outside_its_range() -> None:
    chart = charts.histogram_over_time(hist_frame(), tap_stats=outside_frame(0.003, 0.021))
    # hist_frame's bins span [-1, 1]
    assert _subtitle(chart) == (
        "Not drawn: values outside [−1, 1], at most 0.3% below −1 and 2.1% above 1 at a "
        "probe step (each step's in the tooltip)."
    )
    data = charts.chart_data(chart)
    assert data.groupby("step")["above_range"].first().to_dict() == {0: 0.0, 10: 0.021, 20: 0.0}


def test_histogram_says_when_every_value_lay_inside_its_range() -> None:
    chart = charts.histogram_over_time(hist_frame(), tap_stats=outside_frame(0.0, 0.0))
    assert _subtitle(chart) == "Every value lay inside [−1, 1] at every probe step."


def test_histogram_of_an_older_run_warns_its_end_bins_may_hold_outliers() -> None:
    chart = charts.histogram_over_time(hist_frame(), tap_stats=outside_frame(0.1, 0.1).iloc[:0])
    assert "end bins may include them" in _subtitle(chart)
    assert _subtitle(charts.histogram_over_time(hist_frame())) is None  # nothing to go on


def test_histogram_with_every_value_outside_its_range_says_so() -> None:
    empty = hist_frame().assign(count=0)
    chart = charts.histogram_over_time(empty, tap_stats=outside_frame(0.0, 1.0))
    assert "No value inside the histogram's range" in json.dumps(chart.to_dict())


def _guide_rows(chart) -> list[dict]:
    spec = chart.to_dict()
    return [
        row for v in walk(spec, "datasets") for rows in v.values() for row in rows if "y" in row
    ]


def test_update_ratio_guide_says_it_is_a_rule_for_another_quantity() -> None:
    chart = charts.update_ratio_chart(layer_frame())
    (guide,) = _guide_rows(chart)
    assert guide["y"] == -3.0
    # Named as the rule of thumb it is (std(lr·grad)/std(θ)), never as "healthy".
    assert "std(lr·grad)/std(θ)" in guide["label"] and "not this ratio" in guide["label"]
    assert "healthy" not in (guide["label"] + guide["about"]).lower()
    assert "‖Δθ‖/‖θ‖" in guide["about"]
    np.testing.assert_allclose(charts.chart_data(chart)["log10_update_ratio"], -3.0)


def _with_weights(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` plus a "weights" group with its own update ratio (2e-3)."""
    ratios = frame[(frame["component"] == "block") & (frame["stat"] == "update_ratio")]
    return pd.concat([frame, ratios.assign(component="weights", value=2e-3)], ignore_index=True)


def test_update_ratio_chart_defaults_to_the_weight_matrices() -> None:
    chart = charts.update_ratio_chart(_with_weights(layer_frame()))
    data = charts.chart_data(chart)
    assert set(data["component"]) == {"weights"}
    np.testing.assert_allclose(data["value"], 2e-3)
    assert "weight matrices only" in chart.to_dict()["title"]
    # Any other group on request; a run recorded without "weights" rows shows "block".
    block = charts.chart_data(charts.update_ratio_chart(_with_weights(layer_frame()), "block"))
    assert set(block["component"]) == {"block"}
    older = charts.chart_data(charts.update_ratio_chart(layer_frame()))
    assert set(older["component"]) == {"block"}


def test_one_run_charts_show_one_run() -> None:
    data = charts.chart_data(charts.layer_lines(layer_frame()))
    assert set(data["run"]) == {"run-a"}
