"""Charts read on a light and on a dark page (issue 35, defect 13); no run colour is pale,
the series legend shows its dash and long run names are drawn whole (defect 12).

The rule (views/charts/colours.py): every colour a chart draws a line, point, rule, text
or legend symbol in has a WCAG 2 contrast ratio >= 3:1 against Streamlit's light (#ffffff)
and dark (#171614, as chromium draws it) backgrounds. The charts are compiled to Vega by
vl-convert, so the colours Vega-Lite fills in by default (a rule's black) are checked as
well; heat-map cells (rect marks) may use a sequential scheme, read against their legend.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import altair as alt
import numpy as np
import pandas as pd
import pytest
import vl_convert as vlc

from blockviz.core import spec
from blockviz.views import charts, seed_groups
from blockviz.views.charts import base as charts_base
from blockviz.views.charts.colours import (
    BACKGROUNDS,
    DARK_BACKGROUND,
    LIGHT_BACKGROUND,
    contrast_ratio,
    depth_colours,
    readable,
    shade,
)
from blockviz.views.charts.twins import TWIN_METRICS, difference_chart
from blockviz.views.export.render import chart_spec, chart_svg, vl_version
from blockviz.views.studies import charts as study_charts
from tests.helpers import (
    attn_frame,
    hist_frame,
    layer_frame,
    params_components,
    params_layers,
    scalars_frame,
    spec_dicts,
)

TEN_RUNS = {i: f"run-{i}" for i in range(1, 11)}  # every colour of the palette
LONG_NAME = "pre-ln-300steps-lr0.003-warmup_steps30-d_model128-n_layer4-rmsnorm-gelu"
# Where a compiled Vega spec names the colour something is drawn in.
COLOUR_KEYS = ("fill", "stroke", "symbolFillColor", "symbolStrokeColor", "labelColor")
MARK_TYPES = {"arc", "area", "image", "line", "path", "rect", "rule", "shape", "symbol", "text"}
HEX = re.compile(r"^#[0-9a-fA-F]{6}$")


def compiled(chart: alt.TopLevelMixin) -> dict[str, Any]:
    return vlc.vegalite_to_vega(chart_spec(chart), vl_version=vl_version())


def unreadable_colours(vega: dict[str, Any]) -> list[str]:
    """What a compiled chart draws in a colour that fails the rule, as 'where: colour'."""
    scales = {
        s["name"]: s for d in spec_dicts(vega) for s in d.get("scales", []) if isinstance(s, dict)
    }
    problems: list[str] = []

    def literal(where: str, colour: Any) -> None:
        if colour in (None, "transparent"):
            return
        if not (isinstance(colour, str) and HEX.match(colour)) or not readable(colour):
            problems.append(f"{where}: {colour}")

    def scaled(where: str, name: str, mark: str | None) -> None:
        colour_range = scales[name].get("range")
        if isinstance(colour_range, list):
            for colour in colour_range:
                literal(f"{where} scale {name}", colour)
        elif mark != "rect":  # a scheme, or the renderer's default ("category"): unchecked
            problems.append(f"{where}: scale {name} takes {colour_range!r}")

    def value(where: str, entry: Any, mark: str | None, legend: bool) -> None:
        if isinstance(entry, list):  # production rules
            for rule in entry:
                value(where, rule, mark, legend)
        elif isinstance(entry, dict):
            if "value" in entry:
                literal(where, entry["value"])
            elif "scale" in entry and not legend:
                scaled(where, entry["scale"], mark)
        elif isinstance(entry, str) and not (legend and entry in scales):
            literal(where, entry)  # a legend's "fill": "color" names its scale: its marks say

    def visit(node: Any, mark: str | None, legend: bool) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item, mark, legend)
            return
        if not isinstance(node, dict):
            return
        if node.get("type") in MARK_TYPES and ("encode" in node or "from" in node):
            mark = node["type"]
        for key, entry in node.items():
            if key in COLOUR_KEYS:
                value(f"{mark or 'legend'}.{key}", entry, mark, legend)
            elif key != "scales":
                visit(entry, mark, legend or key == "legends")

    visit({k: v for k, v in vega.items() if k != "background"}, None, False)
    return problems


def _band_chart() -> alt.TopLevelMixin:
    scalars = scalars_frame(runs=TEN_RUNS)
    bands = seed_groups.band_frame(scalars, {i: f"group {i}" for i in TEN_RUNS}, spec.LOSS_NAMES)
    return seed_groups.band_chart(bands, "loss by seed group", "loss", loss=True)


def _study_results() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two families (norm position) of three learning rates each, two seeds: shades."""
    rows, scalars = [], []
    for index, (norm, lr, seed) in enumerate(
        (n, lr, s) for n in ("pre", "post") for lr in (1e-3, 3e-3, 1e-2) for s in (0, 1)
    ):
        variant = f"{norm} lr {lr}"
        rows.append(
            {"run_id": index, "variant": variant, "seed": seed, "norm_position": norm, "lr": lr}
            | {"status": "completed", "outcome": "converged", "val_loss": 2.0 + 0.01 * seed}
        )
        scalars += [
            {"run_id": index, "run": f"r{index}", "step": step, "name": spec.VAL_LOSS, "value": v}
            for step, v in ((0, 4.0), (100, 3.0), (300, 2.0 + 0.01 * seed))
        ]
    return pd.DataFrame(rows), pd.DataFrame(scalars)


def _init_rows() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"init": i, "norm_position": p, "depth": d, "seed": 0, "layer": la, "grad_norm": 1.0}
            for i in ("default", "xavier")
            for p in ("pre", "post")
            for d in (2, 4)
            for la in range(d)
        ]
    )


def _loss_with_marks() -> alt.TopLevelMixin:
    loss = charts.loss_chart(scalars_frame(runs=TEN_RUNS), diverged={"run-3": 12})
    return charts.with_step_mark(loss, 20, "a finding", charts.STEP_AXIS)


CHARTS: dict[str, Callable[[], alt.TopLevelMixin]] = {
    "loss, ten runs, a divergence and a finding's mark": _loss_with_marks,
    "metric": lambda: charts.metric_chart(scalars_frame(runs=TEN_RUNS), spec.TRAIN_LR),
    "no data yet": lambda: charts.loss_chart(scalars_frame().iloc[0:0]),
    "layer lines, 8 layers": lambda: charts.layer_lines(layer_frame(n_layer=8)),
    "layer heat map": lambda: charts.layer_heatmap(layer_frame(), spec.GRAD_NORM, "block"),
    "tap stats": lambda: charts.tap_stats_chart(layer_frame(), spec.RMS),
    "histogram": lambda: charts.histogram_over_time(hist_frame()),
    "update ratio": lambda: charts.update_ratio_chart(layer_frame()),
    "attention entropy": lambda: charts.attention_entropy_chart(layer_frame()),
    "attention maps": lambda: charts.attention_heatmap(attn_frame(), layer=0),
    "gradient by layer": lambda: charts.grad_by_layer_chart(layer_frame(TEN_RUNS), step=0),
    "parameters by component": lambda: charts.param_breakdown_chart(params_components()),
    "parameters by layer": lambda: charts.param_layer_chart(params_layers()),
    "twin differences": lambda: difference_chart(
        pd.DataFrame(
            {
                "step": [10, 20, 10, 20],
                "series": ["train", "train", "val", "val"],
                "parent": [2.0, 1.9, 2.1, 2.0],
                "twin": [2.1, 1.8, 2.2, 2.0],
            }
        ).assign(difference=lambda f: f["twin"] - f["parent"]),
        TWIN_METRICS[0],
        "twin",
        "parent",
    ),
    "seed-group bands": _band_chart,
    "study curves, shaded families": lambda: study_charts.curves_chart(
        _study_results()[1], _study_results()[0], ("norm_position", "lr")
    ),
    "study final loss against lr": lambda: study_charts.swept_chart(
        _study_results()[0], "lr", log_x=True, by=["norm_position"]
    ),
    "init gradients by block": lambda: charts.init_grad_profile_chart(_init_rows()),
    "init gradient ratio": lambda: charts.init_grad_ratio_chart(
        pd.DataFrame({"init": ["default", "default"], "depth": [2, 4], "ratio": [1.2, 1.5]})
    ),
}


def test_the_contrast_ratio_is_wcags() -> None:
    assert contrast_ratio("#000000", LIGHT_BACKGROUND) == pytest.approx(21.0)
    assert contrast_ratio("#777777", LIGHT_BACKGROUND) == pytest.approx(4.48, abs=0.01)
    assert contrast_ratio(DARK_BACKGROUND, DARK_BACKGROUND) == pytest.approx(1.0)


@pytest.mark.parametrize("colour", [*charts.PALETTE, charts.DIVERGED_COLOR, charts.MARK_COLOR])
def test_every_run_and_marker_colour_reads_on_both_pages(colour: str) -> None:
    ratios = [round(contrast_ratio(colour, bg), 2) for bg in BACKGROUNDS]
    assert min(ratios) >= 3.0, f"{colour}: {ratios} against {BACKGROUNDS}"


def test_depth_colours_and_family_shades_read_on_both_pages() -> None:
    for count in range(1, 13):
        colours = depth_colours(count)
        assert len(set(colours)) == count and all(map(readable, colours)), colours
    for colour in charts.PALETTE:
        shades = [shade(colour, p) for p in np.linspace(-1, 1, 7)]
        assert len(set(shades)) == 7 and all(map(readable, shades)), shades


@pytest.mark.parametrize("name", list(CHARTS))
def test_no_chart_draws_in_a_colour_either_page_loses(name: str) -> None:
    assert unreadable_colours(compiled(CHARTS[name]())) == []


def test_the_check_finds_pale_default_and_scheme_colours() -> None:
    frame = pd.DataFrame({"x": [0, 1], "y": [1, 2], "name": ["a", "b"]})
    pale = alt.Chart(frame).mark_line(color="#eeca3b").encode(x="x:Q", y="y:Q")
    black_rule = alt.Chart(frame).mark_rule().encode(y="y:Q")  # Vega-Lite's default black
    by_scheme = alt.Chart(frame).mark_line().encode(x="x:Q", y="y:Q", color="name:N")
    heat = alt.Chart(frame).mark_rect().encode(x="x:O", y="name:N", color="y:Q")
    found = unreadable_colours(compiled(alt.layer(pale, black_rule, by_scheme)))
    assert any("#eeca3b" in p for p in found)
    assert any("black" in p for p in found)
    assert any("takes" in p for p in found)  # the renderer's default category scheme
    assert unreadable_colours(compiled(heat)) == []


def test_the_series_legend_draws_train_solid_and_val_dashed_as_strokes() -> None:
    vega = compiled(charts.loss_chart(scalars_frame()))
    (legend,) = [leg for leg in vega["legends"] if "strokeDash" in leg]
    assert legend["symbolType"] == "stroke"
    # Nothing overrides the symbols with a fill (Vega-Lite's "black dot" for each series).
    assert "encode" not in legend or "fill" not in str(legend["encode"])
    assert readable(legend["symbolStrokeColor"])
    (dashes,) = [s for s in vega["scales"] if s["name"] == legend["strokeDash"]]
    shown = dict(zip(dashes["domain"], dashes["range"], strict=False))
    assert shown[spec.TRAIN_LOSS] != shown[spec.VAL_LOSS]
    # In the drawn legend the val symbol is a dashed stroke and the train one is not.
    svg = chart_svg(charts.loss_chart(scalars_frame()))
    symbols = re.findall(r'<g class="mark-symbol role-legend-symbol"[^>]*>(.*?)</g>', svg, re.S)
    dashes = [re.search(r'stroke-dasharray="([^"]*)"', symbol) for symbol in symbols]
    assert [d.group(1) if d else None for d in dashes] == ["1,0", "6,3"]


def test_a_long_run_name_is_drawn_whole_in_the_legend() -> None:
    svg = chart_svg(charts.loss_chart(scalars_frame(runs={1: LONG_NAME, 2: "short"})))
    assert "…" not in svg
    labels = re.findall(r'<g class="mark-text role-legend-label[^"]*"[^>]*>(.*?)</g>', svg, re.S)
    # A wrapped label is one <text> of <tspan> lines; a short one is the text itself.
    texts = ["".join(re.findall(r"<tspan[^>]*>([^<]*)</tspan>", label)) for label in labels]
    texts = [t or re.sub(r"<[^>]+>", "", label) for t, label in zip(texts, labels, strict=True)]
    assert LONG_NAME in texts and "short" in texts


def test_a_chart_grows_to_hold_its_legends_whole() -> None:
    """Streamlit cuts a legend taller than its chart: with ten long-named runs the series
    legend under the runs' was not drawn at all."""
    few = charts.loss_chart(scalars_frame()).to_dict()
    many = charts.loss_chart(scalars_frame(runs={i: f"{LONG_NAME}-{i}" for i in TEN_RUNS}))
    assert few["height"] == charts_base.HEIGHT
    # each name on four lines: a legend about three times the default height
    assert many.to_dict()["height"] > 2 * charts_base.HEIGHT
