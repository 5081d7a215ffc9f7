"""Attention of one run: entropy per head over steps, and query x key weight maps."""

from __future__ import annotations

import json

import altair as alt
import pandas as pd

from blockviz.core import spec
from blockviz.views.charts.base import (
    SMALL_HEIGHT,
    SMALL_WIDTH,
    STEP_AXIS,
    XAxis,
    category_scale,
    finite_values,
    first_run,
    highlight_opacity,
    legend_highlight,
    no_data,
    select_rows,
    tooltips,
    value_tip,
    x_axis_encoding,
    x_zoom,
)

# Attention maps: a cell per (query, key), big enough that its row and column can carry the
# character (Transformer Explainer's way). The probe records at most 48 characters
# (BlockProbe.attention_chars), 672 px a side at 14 px; a longer map is cut to its start.
CELL_PX = 14
MIN_CELL_PX = 12  # below this a character label no longer fits its row
LABEL_FONT_PX = 13
MAX_POSITIONS = 64
# Live's main column is about 980 px wide at a 1440 px window with the sidebar open; the
# heads' panels wrap to fit it. Besides its cells a panel takes its y labels and title and
# the gap to the next (measured in chromium with Streamlit's theme); the weight legend sits
# above the panels, so it takes no width from them.
ATTENTION_MAX_WIDTH = 960
PANEL_MARGIN_PX = 65
_PICTURES = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"}
# Per-head scores with fixed bounds keep the whole range on their axis, so a head at 0.9
# reads as near the top and one at 0.01 as near nothing, whatever the others do.
SCORE_DOMAINS = {spec.PREFIX_SCORE: (0.0, 1.0), spec.COPY_SCORE: (-1.0, 1.0)}


def attention_entropy_chart(
    layer_stats: pd.DataFrame,
    title: str | None = None,
    x_axis: XAxis = STEP_AXIS,
    stat: str = spec.ATTN_ENTROPY,
    log_scale: bool = False,
) -> alt.FacetChart | alt.LayerChart:
    """One run: a panel per layer, a per-head statistic (spec.HEAD_STATS: the attention
    entropy, the largest pre-softmax logit, the induction scores) of each head over steps;
    a bounded score (SCORE_DOMAINS) on its whole range."""
    rows = select_rows(layer_stats, kind="head", stat=stat)
    rows = rows.sort_values(["run_id", "layer", "component", "step"]).reset_index(drop=True)
    frame = finite_values(rows, "value", positive=log_scale)
    label = spec.stat_label(stat)
    heading = label[:1].upper() + label[1:]
    if frame.empty:
        return no_data(frame.assign(head=pd.Series(dtype=int)), title or heading)
    frame, run = first_run(frame)
    frame = frame.assign(head=pd.to_numeric(frame["component"], errors="coerce"))
    heads = legend_highlight("head")
    if log_scale:
        scale = alt.Scale(type="log")
    elif stat in SCORE_DOMAINS:
        scale = alt.Scale(domain=list(SCORE_DOMAINS[stat]))
    else:
        scale = alt.Scale(zero=False)
    panel = (
        alt.Chart()
        # With one logged step a line draws nothing: points then.
        .mark_line(strokeWidth=1.5, point=bool(frame["step"].nunique() == 1))
        .encode(
            x=x_axis_encoding(x_axis, frame),
            y=alt.Y("value:Q", title=label, scale=scale),
            color=alt.Color(
                "head:O", title="head", scale=category_scale(sorted(frame["head"].unique()))
            ),
            opacity=highlight_opacity(heads),
            tooltip=tooltips("run:N", "layer:O", "head:O", "step:Q", value_tip()),
        )
        .add_params(heads, x_zoom())
        .properties(width=SMALL_WIDTH, height=SMALL_HEIGHT)
    )
    return panel.facet(data=frame, facet=alt.Facet("layer:O", title="layer"), columns=4).properties(
        title=title or f"{heading} per head — {run}"
    )


def visible_char(text: str) -> str:
    """`text` as visible plain glyphs: space, newline, tab and carriage return as their
    Unicode pictures, any other invisible character (control, format, separator) as its
    Python escape (a zero-width space reads \\u200b)."""
    return "".join(
        _PICTURES.get(char) or (char if char.isprintable() else repr(char)[1:-1]) for char in text
    )


def _position_axis(title: str, labels: list[str], **options: object) -> alt.Axis:
    """An axis over positions 0..n-1 that shows the character at each one: the field stays
    the position, so a repeated character keeps its own row or column."""
    # A Vega expression indexing a literal array; JSON strings are valid literals in it,
    # and the labels are drawn as plain text, so '<b>' shows as those three characters.
    lookup = json.dumps(labels, ensure_ascii=False)
    return alt.Axis(
        title=title,
        labelExpr=f"{lookup}[datum.value]",
        labelOverlap=False,
        labelFontSize=LABEL_FONT_PX,
        labelFont="monospace",
        ticks=False,
        **options,
    )


def _panel_grid(size: int, heads: int, max_width: int) -> tuple[int, int]:
    """(columns, cell px) for `heads` panels of `size` x `size` cells within `max_width`:
    as many heads side by side as fit with cells of at least MIN_CELL_PX (comparing heads
    is the point of showing them all), each cell as large as fits up to CELL_PX."""

    def fitting_cell(columns: int) -> int:
        return (max_width // columns - PANEL_MARGIN_PX) // size

    columns = max([1, *(n for n in range(1, heads + 1) if fitting_cell(n) >= MIN_CELL_PX)])
    return columns, max(MIN_CELL_PX, min(CELL_PX, fitting_cell(columns)))


def attention_heatmap(
    attn: pd.DataFrame, layer: int, title: str | None = None, max_width: int = ATTENTION_MAX_WIDTH
) -> alt.FacetChart | alt.LayerChart:
    """One step, one layer: a query x key weight map per head (causal: key <= query), each
    row and column labelled with its character of the probe text.

    The heads' panels wrap to as many columns as fit in `max_width` pixels with cells of
    MIN_CELL_PX to CELL_PX a side, so every character stays legible. A probe longer than
    MAX_POSITIONS shows its first MAX_POSITIONS characters, and the title says so.
    """
    frame = select_rows(attn, layer=layer)
    frame = frame[frame["key"] <= frame["query"]]  # the masked triangle is always 0
    heading = title or f"Attention weights — layer {layer}"
    if frame.empty:
        return no_data(frame, heading)
    frame = select_rows(frame, run_id=frame["run_id"].min())
    frame = select_rows(frame, step=frame["step"].max())
    step = int(frame["step"].iloc[0])
    heading = title or f"{heading}, step {step}"
    size = int(frame["query"].max()) + 1
    if size > MAX_POSITIONS:
        # The first positions close their own causal triangle: every key they attend to
        # is shown too, which the last ones would not.
        frame = frame[frame["query"] < MAX_POSITIONS]
        heading = f"{heading} — first {MAX_POSITIONS} of {size} characters"
        size = MAX_POSITIONS
    frame = frame.reset_index(drop=True).assign(
        query_label=lambda f: f["query_char"].map(visible_char),
        key_label=lambda f: f["key_char"].map(visible_char),
    )
    # Every query row holds its own character; the longest row holds every key's.
    by_row = frame.drop_duplicates("query").set_index("query")["query_label"]
    labels = [str(by_row.get(position, "")) for position in range(size)]
    columns, cell = _panel_grid(size, int(frame["head"].nunique()), max_width)
    panel = (
        alt.Chart()
        .mark_rect()
        .encode(
            x=alt.X(
                "key:O",
                scale=alt.Scale(domain=list(range(size))),
                axis=_position_axis("key", labels, labelAngle=0),
            ),
            y=alt.Y(
                "query:O",
                scale=alt.Scale(domain=list(range(size))),
                axis=_position_axis("query", labels),
            ),
            color=alt.Color(
                "weight:Q",
                title="weight",
                scale=alt.Scale(scheme="viridis", domain=[0, 1]),
                legend=alt.Legend(orient="top", direction="horizontal"),
            ),
            tooltip=tooltips(
                "head:O",
                alt.Tooltip("query:O", title="query position"),
                alt.Tooltip("query_label:N", title="query char"),
                alt.Tooltip("key:O", title="key position"),
                alt.Tooltip("key_label:N", title="key char"),
                alt.Tooltip("weight:Q", format=".3f"),
            ),
        )
        .properties(width=alt.Step(cell), height=alt.Step(cell))
    )
    faceted = panel.facet(
        data=frame,
        facet=alt.Facet("head:O", header=alt.Header(title=None, labelExpr="'head ' + datum.value")),
        columns=columns,
    )
    # Every panel carries its own characters, not just the first column and the last row.
    return faceted.resolve_axis(x="independent", y="independent").properties(title=heading)
