"""Issue 23 items 4 and 8: Compare's loss axis beside a blown-up run, and the gradient
profile that names each run's own probe step."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import altair as alt
import numpy as np
import pandas as pd
import pytest

from blockviz.views import charts
from blockviz.views.export.render import chart_svg
from tests.helpers import layer_frame, scalars_frame

BLOWN_UP = 7.6e6  # the train loss a blown-up run reached in the Compare


def _svg_texts(chart: alt.TopLevelMixin) -> list[str]:
    """Every text of the rendered chart, the lines of a multi-line one joined by spaces."""
    root = ET.fromstring(chart_svg(chart))
    return [
        " ".join(t.strip() for t in element.itertext() if t.strip())
        for element in root.iter("{http://www.w3.org/2000/svg}text")
    ]


def _axis_labels(chart: alt.TopLevelMixin, axis: str) -> list[str]:
    """The tick labels of the axis whose aria-label starts with `axis` ("Y-axis")."""
    root = ET.fromstring(chart_svg(chart))
    groups = [
        [t for t in element.itertext() if t.strip()]
        for element in root.iter()
        if (element.get("aria-label") or "").startswith(axis)
    ]
    assert groups, axis
    return groups[0]


def _numbers(labels: list[str]) -> list[float]:
    return [float(t.replace(",", "")) for t in labels if re.fullmatch(r"[-\d.,e+]+", t)]


def blown_up_frame() -> pd.DataFrame:
    """run-a healthy; run-b's train loss shoots to BLOWN_UP from step 20 and stays there."""
    frame = scalars_frame()
    blown = (frame["run"] == "run-b") & (frame["step"] >= 20) & (frame["name"] == "train/loss")
    frame.loc[blown, "value"] = BLOWN_UP
    return frame


# ------------------------------------------------------------------- item 4: the loss axis


@pytest.mark.parametrize("smoothing", [0.0, 0.6])
def test_a_blown_up_run_does_not_flatten_the_others_and_the_chart_says_so(
    smoothing: float,
) -> None:
    chart = charts.loss_chart(blown_up_frame(), smoothing=smoothing)
    ticks = _numbers(_axis_labels(chart, "Y-axis"))
    # The healthy run (3.1 down to 0.2) fills the axis; millions are off it.
    assert ticks and max(ticks) < 10, ticks
    note = " ".join(t for t in _svg_texts(chart) if t not in ("run-a", "run-b"))
    assert "run-b" in note and "above it" in note  # the run that is off the chart, named
    assert "run-a" not in note
    assert "log scale" in note and "CSV" in note


def test_the_exported_data_keep_the_blown_up_values_raw() -> None:
    frame = blown_up_frame()
    data = charts.chart_data(charts.loss_chart(frame, smoothing=0.6))
    train_b = data[(data["run"] == "run-b") & (data["name"] == "train/loss")]
    assert (train_b.loc[train_b["step"] >= 20, "value"] == BLOWN_UP).all()
    assert len(data) == len(frame[frame["name"] != "train/lr"])


def test_log_scale_shows_every_value_and_needs_no_note() -> None:
    chart = charts.loss_chart(blown_up_frame(), log_scale=True)
    ticks = _numbers(_axis_labels(chart, "Y-axis"))
    assert max(ticks) >= 1e6, ticks
    assert not any("above it" in t for t in _svg_texts(chart))


def test_healthy_runs_keep_their_whole_range_and_no_note() -> None:
    chart = charts.loss_chart(scalars_frame())
    spec = chart.to_dict()
    title = spec["title"]
    assert not (isinstance(title, dict) and title.get("subtitle"))
    assert not any("above it" in t for t in _svg_texts(chart))


def test_a_single_run_that_blows_up_keeps_its_healthy_part_readable() -> None:
    # Live draws one run: its own steps before the blow-up are what it has to show.
    frame = blown_up_frame()
    one = frame[frame["run"] == "run-b"]
    chart = charts.loss_chart(one, smoothing=0.0, diverged={"run-b": 29})
    ticks = _numbers(_axis_labels(chart, "Y-axis"))
    assert ticks and max(ticks) < 10, ticks
    assert any("run-b" in t and "above it" in t for t in _svg_texts(chart))


# ------------------------------------------------------------ item 8: each run's real step


def uneven_probes() -> pd.DataFrame:
    """run-a probed at 0, 10, 20, 30; run-b at 0 and 25 only."""
    frame = layer_frame()
    a = frame[frame["run"] == "run-a"]
    b = layer_frame(runs={2: "run-b"}, steps=(0, 25))
    return pd.concat([a, b], ignore_index=True)


def test_grad_by_layer_names_the_step_of_a_run_drawn_at_another_step() -> None:
    chart = charts.grad_by_layer_chart(uneven_probes(), step=20)
    data = charts.chart_data(chart)
    steps = data.groupby("run")["step"].unique().map(list).to_dict()
    assert steps == {"run-a": [20], "run-b": [25]}
    texts = _svg_texts(chart)
    assert "run-b (step 25)" in texts  # the legend says which step that line is
    assert "run-a" in texts and "run-a (step 20)" not in texts
    assert any("no probe at step 20" in t for t in texts)


def test_grad_by_layer_keeps_each_runs_colour_when_it_relabels_it() -> None:
    colors = charts.run_color_scale({1: "run-a", 2: "run-b"})
    spec = charts.grad_by_layer_chart(uneven_probes(), step=20, colors=colors).to_dict()
    scales = [
        enc["color"]["scale"]
        for enc in _encodings(spec)
        if isinstance(enc.get("color"), dict) and "scale" in enc["color"]
    ]
    assert scales
    for scale in scales:
        by_label = dict(zip(scale["domain"], scale["range"], strict=True))
        assert by_label["run-a"] == charts.PALETTE[1]
        assert by_label["run-b (step 25)"] == charts.PALETTE[2]


def test_grad_by_layer_at_a_step_every_run_has_adds_nothing() -> None:
    chart = charts.grad_by_layer_chart(uneven_probes(), step=0)
    texts = _svg_texts(chart)
    assert "run-a" in texts and "run-b" in texts
    assert "run-a (step 0)" not in texts and "run-b (step 0)" not in texts
    assert not any("no probe" in t for t in texts)
    assert np.array_equal(sorted(charts.chart_data(chart)["step"].unique()), [0])


def _encodings(spec: object) -> list[dict]:
    found = []
    if isinstance(spec, dict):
        if isinstance(spec.get("encoding"), dict):
            found.append(spec["encoding"])
        for value in spec.values():
            found += _encodings(value)
    elif isinstance(spec, list):
        for value in spec:
            found += _encodings(value)
    return found
