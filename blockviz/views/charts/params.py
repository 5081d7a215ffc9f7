"""The parameter breakdown (no training needed)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from blockviz.views.charts.base import (
    HEIGHT,
    WIDTH,
    category_scale,
    no_data,
    tooltips,
)
from blockviz.views.charts.colours import NEUTRAL, PALETTE


def param_breakdown_chart(
    components: pd.DataFrame, title: str = "Parameters by component"
) -> alt.LayerChart:
    """Horizontal bars of parameter count per component, labelled with its share."""
    frame = components.reset_index(drop=True)
    if frame.empty:
        return no_data(frame, title)
    base = alt.Chart().encode(
        y=alt.Y("component:N", title="component", sort="-x"),
        x=alt.X("count:Q", title="parameters", axis=alt.Axis(format="~s")),
        tooltip=tooltips(
            "component:N",
            alt.Tooltip("count:Q", format=","),
            alt.Tooltip("share:Q", format=".1%"),
        ),
    )
    bars = base.mark_bar(color=PALETTE[0])
    labels = base.mark_text(align="left", dx=3, color=NEUTRAL).encode(
        text=alt.Text("share:Q", format=".1%")
    )
    return alt.LayerChart(data=frame, layer=[bars, labels]).properties(
        title=title, width=WIDTH, height=alt.Step(22)
    )


def param_layer_chart(layers: pd.DataFrame, title: str = "Parameters by layer") -> alt.LayerChart:
    """Bars of parameter count per layer, stacked by component when the frame has one."""
    frame = layers.reset_index(drop=True)
    if frame.empty:
        return no_data(frame, title)
    stacked = "component" in frame.columns
    encoding = {
        "x": alt.X("layer:N", title="layer", sort=None),
        "y": alt.Y("sum(count):Q", title="parameters", axis=alt.Axis(format="~s")),
        "tooltip": tooltips(
            "layer:N", *(["component:N"] if stacked else []), alt.Tooltip("count:Q", format=",")
        ),
    }
    if stacked:
        encoding["color"] = alt.Color(
            "component:N", title="component", scale=category_scale(frame["component"])
        )
    bars = alt.Chart().mark_bar(color=PALETTE[0]).encode(**encoding)
    return alt.LayerChart(data=frame, layer=[bars]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )
