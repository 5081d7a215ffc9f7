"""A step marked on a chart that is already built: where a finding points.

Any time-series chart (a layer chart or small multiples) gets a dashed rule at the step
with a short label, on its own x axis: for the wall-clock or tokens axis the step's x comes
from the chart's own rows (the nearest drawn step at or before it).
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from blockviz.views.charts.base import XAxis, chart_data, labelled_rules

# Purple, apart from the runs' palette and the divergence red; readable on both pages
# (colours.readable: the darker #7b3294 was 2.3:1 on the dark one).
MARK_COLOR = "#9c4fc0"
STEP_PICK = "step_pick"  # the click selection of `with_step_picker`: {"step": [...]}


def _mark_x(chart: alt.TopLevelMixin, step: int, axis: XAxis) -> float | None:
    """The mark's x: the step itself, or the x of the chart's nearest drawn step at or
    before it on another axis (None when the chart has no such row)."""
    if axis.field == "step":
        return float(step)
    rows = chart_data(chart)
    if axis.field not in rows.columns or "step" not in rows.columns or rows.empty:
        return None
    rows = rows[["step", axis.field]].dropna().sort_values("step")
    before = rows[rows["step"] <= step]
    if before.empty:
        return None
    value = float(before[axis.field].iloc[-1])
    return value if np.isfinite(value) else None


def _mark_layers(x: float, label: str, axis: XAxis) -> list[alt.Chart]:
    data = pd.DataFrame({axis.field: [x], "label": [label]})
    base = alt.Chart(data).encode(
        x=alt.X(f"{axis.field}:Q"), tooltip=[alt.Tooltip("label:N", title="finding")]
    )
    # The label sits lower than a divergence's (y=4), so both read when they share a step.
    return labelled_rules(base, MARK_COLOR, [2, 2], 2, label_y=14)


def with_step_mark(
    chart: alt.TopLevelMixin, step: int, label: str, axis: XAxis
) -> alt.TopLevelMixin:
    """`chart` with a dashed rule and `label` at `step` (unchanged if it cannot be placed)."""
    x = _mark_x(chart, step, axis)
    if x is None:
        return chart
    layers = _mark_layers(x, label, axis)
    marked = chart.copy(deep=True)
    if isinstance(marked, alt.LayerChart):
        marked.layer = [*marked.layer, *layers]
        return marked
    if isinstance(marked, alt.FacetChart):
        # The rule has its own data: every panel draws it.
        marked.spec = alt.LayerChart(layer=[marked.spec, *layers])
        return marked
    return chart


def with_step_picker(chart: alt.TopLevelMixin, axis: XAxis) -> alt.TopLevelMixin:
    """`chart` with a click selection (STEP_PICK) of the drawn step nearest the cursor: an
    invisible point per row, so a click anywhere near the curve picks its step."""
    rows = chart_data(chart)
    if not isinstance(chart, alt.LayerChart) or rows.empty or axis.field not in rows.columns:
        return chart
    points = rows[["step", axis.field]].drop_duplicates() if axis.field != "step" else None
    picks = pd.DataFrame({"step": rows["step"].unique()}) if points is None else points
    pick = alt.selection_point(name=STEP_PICK, fields=["step"], on="click", nearest=True)
    layer = (
        alt.Chart(picks)
        .mark_point(opacity=0, size=60)
        .encode(x=alt.X(f"{axis.field}:Q", title=axis.title))
        .add_params(pick)
    )
    picked = chart.copy(deep=True)
    picked.layer = [*picked.layer, layer]
    return picked


def defines_param(chart: alt.TopLevelMixin, name: str) -> bool:
    """Whether `chart` (or one of its layers, or a facet's inner chart) declares the
    parameter `name`: Streamlit refuses a selection mode the spec does not define."""
    params = getattr(chart, "params", alt.Undefined)
    if params is not alt.Undefined and any(getattr(p, "name", None) == name for p in params):
        return True
    inner = getattr(chart, "layer", alt.Undefined)
    inner = [] if inner is alt.Undefined else list(inner)
    spec = getattr(chart, "spec", alt.Undefined)
    if spec is not alt.Undefined:
        inner.append(spec)
    return any(defines_param(part, name) for part in inner)


def picked_step(event: object) -> int | None:
    """The step a STEP_PICK click chose, from `st.altair_chart`'s selection event."""
    selection = getattr(event, "selection", None) or {}
    chosen = selection.get(STEP_PICK) if isinstance(selection, dict) else None
    if isinstance(chosen, list) and chosen and isinstance(chosen[0], dict):
        step = chosen[0].get("step")
        return int(step) if isinstance(step, int | float) else None
    return None
