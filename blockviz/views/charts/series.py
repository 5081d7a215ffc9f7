"""Scalars over steps: loss, learning rate, throughput, any metric; divergence marked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.views.charts.base import (
    DIVERGED_COLOR,
    STEP_AXIS,
    WIDTH,
    XAxis,
    check_smoothing,
    dash_legend,
    ema,
    finite_values,
    height_for_legends,
    highlight_opacity,
    is_smoothed,
    labelled_rules,
    legend_highlight,
    lone_points,
    no_data,
    run_color_scale,
    tooltips,
    value_tip,
    wrapped_legend,
    x_axis_encoding,
    x_zoom,
    y_scale_for,
)

# A linear loss axis stops at this many times the runs' starting loss (the loss of a model
# at initialisation, about ln(vocabulary size)) when some value lies above that. Training
# lowers the loss from its start; twice the start is past what core.studies.outcomes already calls
# "blew up" (one nat above a uniform guess). A blown-up run's millions (7.6e6 in issue 23)
# squashed every other curve to a flat line; now the axis ends at twice the start, values
# above it are drawn on the top edge, and the chart's subtitle names their runs.
LOSS_CEILING_FACTOR = 2.0
CLIP_NAMES_SHOWN = 3  # runs named in the clip note; further ones are counted


@dataclass(frozen=True)
class Ceiling:
    """Where a linear loss axis stops, and the runs with values above it."""

    top: float
    runs: list[str]


def loss_ceiling(
    plotted: pd.DataFrame, key: str = "run", values: Sequence[str] = ("value",)
) -> Ceiling | None:
    """LOSS_CEILING_FACTOR x the median of the `key`s' starting losses (each one's largest
    first `values` column at its first drawn step), when some drawn value (in any of the
    `values` columns) lies above it; else None. `key` is "run" on a loss chart, "group" on
    a seed-group band chart (its columns mean and high)."""
    first_values = pd.to_numeric(plotted[values[0]], errors="coerce").astype(float)
    first = plotted["step"] == plotted.groupby(key)["step"].transform("min")
    starts = first_values[first].groupby(plotted.loc[first, key]).max()
    top = LOSS_CEILING_FACTOR * float(starts.median())
    drawn = pd.concat(
        [pd.to_numeric(plotted[c], errors="coerce").astype(float) for c in values], axis=1
    ).max(axis=1)
    if not np.isfinite(top) or top <= 0 or not (drawn > top).any():
        return None
    above = plotted.loc[drawn > top, key].astype(str)
    return Ceiling(top, list(dict.fromkeys(above)))


def ceiling_note(ceiling: Ceiling, whose: str = "runs") -> list[str]:
    """The chart's subtitle: where the axis stops, who is above it, where to see them."""
    shown = ceiling.runs[:CLIP_NAMES_SHOWN]
    more = len(ceiling.runs) - len(shown)
    names = ", ".join(shown) + (f" and {more} more" if more else "")
    verb = "goes" if len(ceiling.runs) == 1 else "go"
    return [
        f"y axis stops at {ceiling.top:.3g}, twice the {whose}' starting loss: {names} {verb} "
        "above it, drawn on the top edge.",
        "A log scale shows every value; the CSV download has them raw.",
    ]


def clamped_scale(ceiling: Ceiling) -> alt.Scale:
    """A linear y scale that ends at the ceiling; values above it sit on the top edge."""
    return alt.Scale(zero=False, domainMax=ceiling.top, nice=False, clamp=True)


def _diverged_frame(
    raw: pd.DataFrame, diverged: Mapping[str, int] | pd.DataFrame | None
) -> pd.DataFrame:
    """run, step of each divergence: given (runs_frame or name->step) or first non-finite."""
    found: dict[str, int] = {}
    bad = raw[~np.isfinite(pd.to_numeric(raw["value"], errors="coerce").to_numpy(dtype=float))]
    for run, rows in bad.groupby("run", sort=False):
        found[str(run)] = int(rows["step"].min())
    if isinstance(diverged, pd.DataFrame):
        known = diverged.dropna(subset=["diverged_step"])
        given = dict(zip(known["name"], known["diverged_step"], strict=True))
    else:
        given = dict(diverged or {})
    shown = set(raw["run"].astype(str))
    found.update({str(r): int(s) for r, s in given.items() if str(r) in shown})
    rows = [{"run": r, "step": s, "label": f"{r} diverged @ {s}"} for r, s in found.items()]
    return pd.DataFrame(rows, columns=["run", "step", "label"])


def _place_marks(marks: pd.DataFrame, raw: pd.DataFrame, x_axis: XAxis) -> pd.DataFrame:
    """The divergence marks with their x on `x_axis` (the diverged row's own x); a mark
    whose step has no x there is left out."""
    if x_axis.field == "step":
        return marks
    if x_axis.field not in raw.columns:
        return marks.iloc[0:0].assign(**{x_axis.field: pd.Series(dtype=float)})
    placed = raw[["run", "step", x_axis.field]].astype({"run": str})
    placed = placed.drop_duplicates(["run", "step"])
    return marks.merge(placed, on=["run", "step"], how="inner")


def _divergence_layers(marks: pd.DataFrame, x: alt.X) -> list[alt.Chart]:
    """A red dashed rule and label at each diverged step (`x`: the chart's x encoding, so
    the layers agree on one axis)."""
    base = alt.Chart(marks).encode(
        x=x,
        tooltip=tooltips("run:N", alt.Tooltip("step:Q", title="diverged at step")),
    )
    return labelled_rules(base, DIVERGED_COLOR, [4, 3], 1.5, label_y=4)


def _series_chart(
    scalars: pd.DataFrame,
    names: Sequence[str],
    smoothing: float,
    log_scale: bool,
    colors: alt.Scale | None,
    title: str,
    y_title: str,
    diverged: Mapping[str, int] | pd.DataFrame | None,
    x_axis: XAxis = STEP_AXIS,
    ceiling: bool = False,
) -> alt.LayerChart:
    """A line per run x series (EMA-smoothed where is_smoothed, else raw), raw values faint
    behind, divergence marked; with `ceiling`, a linear y axis stops at loss_ceiling."""
    raw = scalars[scalars["name"].isin(list(names))].sort_values(["run_id", "name", "step"])
    plotted = finite_values(raw, "value", positive=log_scale).reset_index(drop=True)
    if plotted.empty:
        return no_data(plotted.assign(smoothed=pd.Series(dtype=float)), title)
    check_smoothing(smoothing)  # refused even when no series here is dense enough to use it
    # Sparse and validation series keep their values (see is_smoothed): each drawn line
    # then ends at its real last value.
    smoothed = pd.to_numeric(plotted["value"], errors="coerce").astype(float)
    for (_, name), rows in plotted.groupby(["run_id", "name"], sort=False):
        if is_smoothed(str(name), len(rows)):
            smoothed[rows.index] = ema(rows["value"], smoothing)
    plotted["smoothed"] = smoothed
    colors = colors or run_color_scale(plotted)
    runs = legend_highlight("run")
    zoom = x_zoom()
    # train solid, val dashed; further names get further patterns. Only the lines carry
    # the dash: the legend then draws each pattern as a stroke (with the points' layer in
    # it, Vega-Lite drew every series as the same black dot), in a grey both pages read.
    dash_scale = alt.Scale(domain=list(names), range=[[1, 0], [6, 3], [2, 2], [8, 2, 2, 2]])
    dash = alt.StrokeDash(
        "name:N",
        title="series",
        sort=list(names),
        scale=dash_scale,
        legend=dash_legend() if len(names) > 1 else None,
    )
    marks = _place_marks(_diverged_frame(raw, diverged), raw, x_axis)
    drawn_x = pd.concat([plotted[[x_axis.field]], marks[[x_axis.field]]], ignore_index=True)
    x = x_axis_encoding(x_axis, drawn_x)
    # The frame keeps every value (the CSV is raw); only the axis stops. Clamped, not
    # clipped: a value above the top is drawn on the top edge by every layer that shares
    # the axis (one a caller adds too), and no mark is placed millions of pixels away,
    # which the PNG renderer dropped whole.
    cut = loss_ceiling(plotted) if ceiling and not log_scale else None
    y_scale = y_scale_for(log_scale)
    if cut is not None:
        y_scale = clamped_scale(cut)
    base = alt.Chart().encode(
        x=x,
        # The faint raw layer draws first; without this its opacity would fade the legend.
        color=alt.Color("run:N", title="run", scale=colors, legend=wrapped_legend()),
    )
    smooth_line = (
        base.mark_line(strokeWidth=2)
        .encode(
            y=alt.Y("smoothed:Q", title=y_title, scale=y_scale),
            strokeDash=dash,
            opacity=highlight_opacity(runs),
            tooltip=tooltips(
                "run:N", "name:N", "step:Q", value_tip(), value_tip("smoothed", "smoothed")
            ),
        )
        .add_params(runs, zoom)
    )
    lone = lone_points(
        base.encode(
            y=alt.Y("smoothed:Q"), tooltip=tooltips("run:N", "name:N", "step:Q", value_tip())
        ),
        ["run", "name"],
    )
    layers: list[alt.Chart] = [smooth_line, lone]
    if smoothing > 0:
        raw_line = base.mark_line(strokeWidth=1).encode(
            y="value:Q",
            strokeDash=dash,
            opacity=highlight_opacity(runs, on=0.2, off=0.04),
        )
        layers.insert(0, raw_line)
    if not marks.empty:
        layers += _divergence_layers(marks, x)
    heading: str | alt.TitleParams = title
    if cut is not None:
        heading = alt.TitleParams(title, subtitle=ceiling_note(cut))
    run_labels = colors.domain if isinstance(colors.domain, list) else plotted["run"].unique()
    height = height_for_legends(run_labels, list(names) if len(names) > 1 else [])
    return alt.LayerChart(data=plotted, layer=layers).properties(
        title=heading, width=WIDTH, height=height
    )


def loss_chart(
    scalars: pd.DataFrame,
    smoothing: float = 0.6,
    log_scale: bool = False,
    names: Sequence[str] = spec.LOSS_NAMES,
    colors: alt.Scale | None = None,
    diverged: Mapping[str, int] | pd.DataFrame | None = None,
    title: str = "Loss",
    x_axis: XAxis = STEP_AXIS,
) -> alt.LayerChart:
    """Train (solid) and val (dashed) loss per run: train EMA-smoothed over a faint raw line
    once it has MIN_SMOOTHED_POINTS points, val always raw (its line ends at its last value).

    `diverged` is a runs frame (name, diverged_step) or {run name: step}; the first
    non-finite value of a run is marked even without it. `x_axis` names the frame's
    column for x (see charts.xaxis.with_x); the default is the step.
    """
    return _series_chart(
        scalars,
        names,
        smoothing,
        log_scale,
        colors,
        title,
        spec.scalar_label(spec.TRAIN_LOSS),
        diverged,
        x_axis,
        ceiling=True,
    )


def metric_chart(
    scalars: pd.DataFrame,
    name: str,
    smoothing: float = 0.0,
    log_scale: bool = False,
    colors: alt.Scale | None = None,
    title: str | None = None,
    diverged: Mapping[str, int] | pd.DataFrame | None = None,
    x_axis: XAxis = STEP_AXIS,
) -> alt.LayerChart:
    """Any one scalar (lr, tokens/s, grad norm, val metric) over steps, coloured by run;
    smoothed only where is_smoothed (dense, not val/*)."""
    y_title = spec.scalar_label(name)
    return _series_chart(
        scalars, [name], smoothing, log_scale, colors, title or name, y_title, diverged, x_axis
    )
