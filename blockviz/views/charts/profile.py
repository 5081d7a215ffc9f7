"""Gradient norm by layer across runs: the Pre-LN vs Post-LN picture."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import altair as alt
import pandas as pd

from blockviz.core import spec
from blockviz.views.charts.base import (
    LAYER_AXIS_TITLE,
    WIDTH,
    finite_values,
    height_for_legends,
    highlight_opacity,
    legend_highlight,
    no_data,
    run_color_scale,
    tooltips,
    value_tip,
    with_layer_names,
    wrapped_legend,
    x_zoom,
)
from blockviz.views.charts.layers import Layers, layer_stat_rows


def _head_numbers(frame: pd.DataFrame) -> set[int]:
    return {int(n) for n in frame.loc[frame["layer_name"] == "head", "layer"]}


def _layer_axis(frame: pd.DataFrame) -> alt.Axis:
    """Whole layer numbers; -1 reads 'embed', and the head's number 'head' when it is one."""
    heads = _head_numbers(frame)
    head = f"datum.value == {heads.pop()} ? 'head' : " if len(heads) == 1 else ""
    expr = f"datum.value == {spec.EMBED_LAYER} ? 'embed' : {head}datum.label"
    return alt.Axis(tickMinStep=1, format="d", labelExpr=expr)


def _layer_axis_title(frame: pd.DataFrame) -> str:
    """'layer', or the general title when runs of several depths put their heads apart."""
    return "layer" if len(_head_numbers(frame)) <= 1 else LAYER_AXIS_TITLE


def nearest_probe_steps(steps: Mapping[int, Iterable[int]], step: int) -> dict[int, int]:
    """run id -> its step nearest to `step` (ties to the earlier); a run with none is left out."""
    return {
        int(run_id): int(min(run_steps, key=lambda s: (abs(s - step), s)))
        for run_id, run_steps in steps.items()
        if len(run_steps)
    }


def grad_by_layer_chart(
    layer_stats: pd.DataFrame,
    step: int = 0,
    component: str = "block",
    colors: alt.Scale | None = None,
    title: str | None = None,
    n_layers: Layers = None,
) -> alt.LayerChart:
    """Many runs: gradient norm (log) vs layer at `step` — the Pre-LN vs Post-LN picture.

    Each run shows its probe step nearest to `step` (ties to the earlier). A run drawn at
    another step says so in its legend entry ('run-b (step 250)', the `line` column) and
    the subtitle says why, so no run passes for one probed at `step`. The axis says
    'embed' at -1 and 'head' at the head's number when every run has it at the same number
    (runs of one depth); the tooltip names each run's own layers.
    """
    where = "initialization (step 0)" if step == 0 else f"step {step}"
    title = title or f"Gradient norm by layer at {where}"
    frame = finite_values(
        layer_stat_rows(layer_stats, "component", component, spec.GRAD_NORM), "value", True
    )
    if frame.empty:
        return no_data(frame, title)
    drawn = nearest_probe_steps(frame.groupby("run_id")["step"].unique(), step)
    frame = frame[frame["step"] == frame["run_id"].map(drawn)]
    frame = frame.sort_values(["run_id", "layer"]).reset_index(drop=True)
    frame, _ = with_layer_names(frame, n_layers)
    elsewhere = frame["step"] != step
    names = frame["run"].astype(str)
    frame["line"] = names.where(~elsewhere, names + " (step " + frame["step"].astype(str) + ")")
    scale = _relabelled(colors or run_color_scale(frame), frame)
    heading: str | alt.TitleParams = title
    if elsewhere.any():
        heading = alt.TitleParams(title, subtitle=_elsewhere_note(step))
    runs = legend_highlight("line")
    lines = (
        alt.Chart()
        .mark_line(point=True, strokeWidth=2)
        .encode(
            x=alt.X("layer:Q", title=_layer_axis_title(frame), axis=_layer_axis(frame)),
            y=alt.Y("value:Q", title=spec.stat_label(spec.GRAD_NORM), scale=alt.Scale(type="log")),
            color=alt.Color("line:N", title="run", scale=scale, legend=wrapped_legend()),
            opacity=highlight_opacity(runs),
            tooltip=tooltips(
                "run:N",
                alt.Tooltip("layer_name:N", title="layer"),
                "component:N",
                "step:Q",
                value_tip(),
            ),
        )
        .add_params(runs, x_zoom())
    )
    entries = scale.domain if isinstance(scale.domain, list) else frame["line"].unique()
    return alt.LayerChart(data=frame, layer=[lines]).properties(
        title=heading, width=WIDTH, height=height_for_legends(entries)
    )


def _relabelled(colors: alt.Scale, frame: pd.DataFrame) -> alt.Scale:
    """The run colour scale over the legend entries: each run keeps its colour under the
    name that says its step."""
    if not isinstance(colors.domain, list):
        return colors  # a scheme, not a list of runs: nothing to rename
    label_of = dict(zip(frame["run"].astype(str), frame["line"], strict=False))
    domain = [label_of.get(str(name), name) for name in colors.domain]
    return alt.Scale(domain=domain, range=colors.range)


def _elsewhere_note(step: int) -> str:
    return (
        f"A run with no probe at step {step} is drawn at its nearest probe step, "
        "which its legend entry names."
    )
