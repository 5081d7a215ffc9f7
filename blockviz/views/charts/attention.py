"""Attention of one run: entropy per head over steps, and query x key weight maps."""

from __future__ import annotations

import altair as alt
import pandas as pd

from blockviz.core import spec
from blockviz.views.charts.base import (
    SMALL_HEIGHT,
    SMALL_WIDTH,
    STEP_AXIS,
    XAxis,
    _finite,
    _first_run,
    _highlight,
    _legend_highlight,
    _no_data,
    _select,
    _tooltip,
    _value_tip,
    _x_axis,
    _x_zoom,
)


def attention_entropy_chart(
    layer_stats: pd.DataFrame,
    title: str | None = None,
    x_axis: XAxis = STEP_AXIS,
    stat: str = "attn_entropy",
    log_scale: bool = False,
) -> alt.FacetChart | alt.LayerChart:
    """One run: a panel per layer, a per-head statistic (spec.HEAD_STATS: the attention
    entropy, or the largest pre-softmax logit) of each head over steps."""
    rows = _select(layer_stats, kind="head", stat=stat)
    rows = rows.sort_values(["run_id", "layer", "component", "step"]).reset_index(drop=True)
    frame = _finite(rows, "value", positive=log_scale)
    label = spec.stat_label(stat)
    heading = label[:1].upper() + label[1:]
    if frame.empty:
        return _no_data(frame.assign(head=pd.Series(dtype=int)), title or heading)
    frame, run = _first_run(frame)
    frame = frame.assign(head=pd.to_numeric(frame["component"], errors="coerce"))
    heads = _legend_highlight("head")
    scale = alt.Scale(type="log") if log_scale else alt.Scale(zero=False)
    panel = (
        alt.Chart()
        # With one logged step a line draws nothing: points then.
        .mark_line(strokeWidth=1.5, point=bool(frame["step"].nunique() == 1))
        .encode(
            x=_x_axis(x_axis, frame),
            y=alt.Y("value:Q", title=label, scale=scale),
            color=alt.Color("head:O", title="head", scale=alt.Scale(scheme="category10")),
            opacity=_highlight(heads),
            tooltip=_tooltip("run:N", "layer:O", "head:O", "step:Q", _value_tip()),
        )
        .add_params(heads, _x_zoom())
        .properties(width=SMALL_WIDTH, height=SMALL_HEIGHT)
    )
    return panel.facet(data=frame, facet=alt.Facet("layer:O", title="layer"), columns=4).properties(
        title=title or f"{heading} per head — {run}"
    )


def attention_heatmap(
    attn: pd.DataFrame, layer: int, title: str | None = None
) -> alt.FacetChart | alt.LayerChart:
    """One step, one layer: a query x key weight map per head (causal: key <= query)."""
    frame = _select(attn, layer=layer)
    frame = frame[frame["key"] <= frame["query"]]  # the masked triangle is always 0
    if frame.empty:
        return _no_data(frame, title or f"Attention weights — layer {layer}")
    frame = _select(frame, run_id=frame["run_id"].min())
    frame = _select(frame, step=frame["step"].max()).reset_index(drop=True)
    step = int(frame["step"].iloc[0])
    panel = (
        alt.Chart()
        .mark_rect()
        .encode(
            x=alt.X("key:O", title="key position", axis=alt.Axis(labelOverlap=True)),
            y=alt.Y("query:O", title="query position", axis=alt.Axis(labelOverlap=True)),
            color=alt.Color(
                "weight:Q", title="weight", scale=alt.Scale(scheme="viridis", domain=[0, 1])
            ),
            tooltip=_tooltip(
                "head:O",
                "query:O",
                alt.Tooltip("query_char:N", title="query char"),
                "key:O",
                alt.Tooltip("key_char:N", title="key char"),
                alt.Tooltip("weight:Q", format=".3f"),
            ),
        )
        .properties(width=SMALL_WIDTH, height=SMALL_WIDTH)
    )
    return panel.facet(data=frame, facet=alt.Facet("head:O", title="head"), columns=4).properties(
        title=title or f"Attention weights — layer {layer}, step {step}"
    )
