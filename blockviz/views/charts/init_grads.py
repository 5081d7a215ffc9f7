"""Gradient norm at initialization by layer, and the Post-LN / Pre-LN ratio by depth.

Both read what `blockviz init-grads --json` prints: `rows` (init, norm_position, depth, seed,
layer, grad_norm) and `summary` (init, depth, post_last, pre_last, ratio, ratio_min,
ratio_max). Seeds are averaged here, the same mean the CLI's table prints.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from blockviz.core import spec
from blockviz.views.charts.base import (
    HEIGHT,
    WIDTH,
    category_scale,
    finite_values,
    neutral_legend_symbols,
    no_data,
    tooltips,
)
from blockviz.views.charts.colours import NEUTRAL

ROW_COLUMNS = ("init", "norm_position", "depth", "seed", "layer", spec.GRAD_NORM)
BLOCK_AXIS_TITLE = "block (0 = first)"
GRAD_TITLE = "gradient L2 norm of ffn.fc_out.weight"


def init_grad_means(rows: pd.DataFrame) -> pd.DataFrame:
    """Seed-mean gradient norm per (init, norm_position, depth, layer), with a variant label."""
    means = (
        rows.groupby(["init", "norm_position", "depth", "layer"], as_index=False)[spec.GRAD_NORM]
        .mean()
        .sort_values(["init", "norm_position", "depth", "layer"])
        .reset_index(drop=True)
    )
    means["variant"] = means["norm_position"] + "-LN, " + means["depth"].astype(str) + " layers"
    return means


def init_grad_profile_chart(rows: pd.DataFrame, title: str | None = None) -> alt.TopLevelMixin:
    """Gradient norm (log) vs block, one line per norm position × depth, one panel per init."""
    title = title or "Gradient norm by block at initialization (mean over seeds)"
    frame = finite_values(init_grad_means(rows), spec.GRAD_NORM, True) if len(rows) else rows
    if frame.empty:
        return no_data(frame, title)
    depths = sorted(frame["depth"].unique())
    lines = (
        alt.Chart(frame)
        .mark_line(point=True, strokeWidth=2)
        .encode(
            x=alt.X("layer:Q", title=BLOCK_AXIS_TITLE, axis=alt.Axis(tickMinStep=1, format="d")),
            y=alt.Y(f"{spec.GRAD_NORM}:Q", title=GRAD_TITLE, scale=alt.Scale(type="log")),
            # Position by colour, depth by opacity (deeper is darker): legends that every
            # renderer draws (a dashed-line legend symbol came out blank in the PNG export).
            color=alt.Color(
                "norm_position:N",
                title="norms",
                scale=alt.Scale(domain=["post", "pre"], range=["#d62728", "#1f77b4"]),
            ),
            opacity=alt.Opacity(
                "depth:O", title="depth", scale=alt.Scale(domain=depths, range=[0.35, 1.0])
            ),
            detail="variant:N",
            tooltip=tooltips(
                "init:N", "variant:N", "layer:O", alt.Tooltip(f"{spec.GRAD_NORM}:Q", format=".4g")
            ),
        )
        .properties(width=WIDTH // 2, height=HEIGHT)
    )
    # Inits differ by orders of magnitude (gpt2's N(0, 0.02) against N(0, 1)): own y per panel.
    chart = (
        lines.facet(column=alt.Column("init:N", title="init"))
        .resolve_scale(y="independent")
        .properties(title=title)
    )
    return neutral_legend_symbols(chart)  # the depths' opacity legend


def init_grad_ratio_chart(summary: pd.DataFrame, title: str | None = None) -> alt.LayerChart:
    """Post-LN / Pre-LN last-block gradient norm vs depth, one line per init, 1 marked."""
    title = title or "Last block's gradient at init, Post-LN / Pre-LN"
    frame = finite_values(summary, "ratio", True) if len(summary) else summary
    if frame.empty:
        return no_data(frame, title)
    frame = frame.sort_values(["init", "depth"]).reset_index(drop=True)
    lines = (
        alt.Chart()
        .mark_line(point=True, strokeWidth=2)
        .encode(
            x=alt.X("depth:Q", title="depth (n_layer)", axis=alt.Axis(tickMinStep=1, format="d")),
            y=alt.Y("ratio:Q", title="post / pre (ratio of seed means)"),
            color=alt.Color("init:N", title="init", scale=category_scale(frame["init"])),
            tooltip=tooltips(
                "init:N",
                "depth:Q",
                alt.Tooltip("ratio:Q", format=".2f"),
                alt.Tooltip("ratio_min:Q", title="lowest seed", format=".2f"),
                alt.Tooltip("ratio_max:Q", title="highest seed", format=".2f"),
                alt.Tooltip("post_last:Q", title="post-LN last", format=".4g"),
                alt.Tooltip("pre_last:Q", title="pre-LN last", format=".4g"),
            ),
        )
    )
    equal = (
        alt.Chart(pd.DataFrame({"ratio": [1.0]}))
        .mark_rule(color=NEUTRAL, strokeDash=[4, 4])
        .encode(y="ratio:Q")
    )
    return alt.LayerChart(data=frame, layer=[lines, equal]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )
