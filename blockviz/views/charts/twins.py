"""A twin (a fork or a replay) drawn as its differences from its parent.

Both runs trained the same steps before the fork step on the same batches, so from the
fork step on `twin - parent` at each step they both recorded is what the changed fields
did: zero everywhere for a fork with no change (`training.fork` tests that), a growing gap
where the change matters. One line per series (the loss, or each block, or each head).
"""

from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import pandas as pd

from blockviz.core import spec
from blockviz.views.charts.base import (
    HEIGHT,
    STEP_AXIS,
    WIDTH,
    category_scale,
    legend_highlight,
    no_data,
    tooltips,
    x_zoom,
)
from blockviz.views.charts.colours import NEUTRAL

DIFFERENCE_COLUMNS = ["step", "series", "parent", "twin", "difference"]


@dataclass(frozen=True)
class TwinMetric:
    """One statistic a twin is compared on: where it is recorded and how it is named."""

    label: str
    stat: str
    kind: str  # "scalar" | a layer_stats kind
    component: str | None = None


TWIN_METRICS = (
    TwinMetric("loss", spec.TRAIN_LOSS, "scalar"),
    TwinMetric("gradient norm per block", spec.GRAD_NORM, "component", "block"),
    TwinMetric("update ratio per block", spec.UPDATE_RATIO, "component", spec.WEIGHTS_COMPONENT),
    TwinMetric("attention entropy per head", spec.ATTN_ENTROPY, "head"),
    TwinMetric("largest |attention logit| per head", spec.ATTN_LOGIT_MAX_ABS, "head"),
    TwinMetric("output logits: largest |logit|", spec.PROBE_LOGIT_MAX_ABS, "scalar"),
)


def _series_name(row: pd.Series, kind: str, n_layer: int) -> str:
    if kind == "scalar":
        return str(row["name"])
    block = spec.layer_label(int(row["layer"]), n_layer)
    return f"{block} head {row['component']}" if kind == "head" else block


def differences(
    parent: pd.DataFrame, twin: pd.DataFrame, fork_step: int, metric: TwinMetric, n_layer: int
) -> pd.DataFrame:
    """`twin - parent` at every step from `fork_step` on that both recorded, per series
    (the scalars frame for scalar metrics, layer_stats rows otherwise); DIFFERENCE_COLUMNS."""
    keys = ["step", "name"] if metric.kind == "scalar" else ["step", "layer", "component"]
    frames = []
    for frame in (parent, twin):
        rows = frame[frame["step"] >= fork_step]
        if metric.kind == "scalar":
            names = (
                [metric.stat, spec.VAL_LOSS] if metric.stat == spec.TRAIN_LOSS else [metric.stat]
            )
            rows = rows[rows["name"].isin(names)]
        else:
            rows = rows[(rows["kind"] == metric.kind) & (rows["stat"] == metric.stat)]
            if metric.component is not None:
                rows = rows[rows["component"] == metric.component]
        frames.append(rows[[*keys, "value"]])
    both = frames[0].merge(frames[1], on=keys, suffixes=("_parent", "_twin"))
    if both.empty:
        return pd.DataFrame(columns=DIFFERENCE_COLUMNS)
    both["series"] = [_series_name(row, metric.kind, n_layer) for _, row in both.iterrows()]
    both["parent"] = both["value_parent"].astype(float)
    both["twin"] = both["value_twin"].astype(float)
    both["difference"] = both["twin"] - both["parent"]
    return both[DIFFERENCE_COLUMNS].sort_values(["series", "step"]).reset_index(drop=True)


def difference_chart(
    frame: pd.DataFrame, metric: TwinMetric, twin: str, parent: str
) -> alt.TopLevelMixin:
    """Lines of `twin - parent` per series over steps, with the zero line."""
    title = f"{twin} − {parent}: {metric.label}"
    if frame.empty:
        return no_data(frame, title, "no steps recorded by both runs after the fork step yet")
    pick = legend_highlight("series")
    lines = (
        alt.Chart()
        .mark_line(point=len(frame) < 60)
        .encode(
            x=alt.X("step:Q", title=STEP_AXIS.title, axis=alt.Axis(format=STEP_AXIS.format)),
            y=alt.Y(
                "difference:Q",
                title=f"twin − parent ({metric.label})",
                axis=alt.Axis(format="~g"),
            ),
            color=alt.Color("series:N", title=None, scale=category_scale(frame["series"])),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
            tooltip=tooltips("series", "step", "parent", "twin", "difference"),
        )
        .add_params(pick, x_zoom())
    )
    zero = (
        alt.Chart(pd.DataFrame({"zero": [0.0]}))
        .mark_rule(strokeDash=[4, 4], color=NEUTRAL)
        .encode(y="zero:Q")
    )
    return alt.LayerChart(data=frame, layer=[lines, zero]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )
