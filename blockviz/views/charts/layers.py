"""Per-layer statistics of one run.

Layers are named as core.spec.layer_tick names them ('embed', '0', ..., 'head') in
legends, axes and tooltips, in depth order; `n_layers` (the model's n_layer, one int or
per run id) says which number is the head, else the rows do (see base.with_layer_names).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import altair as alt
import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.views.charts.base import (
    HEIGHT,
    LAYER_SCHEME,
    NO_DATA,
    SMALL_HEIGHT,
    SMALL_WIDTH,
    STEP_AXIS,
    UPDATE_RATIO_GUIDE,
    UPDATE_RATIO_GUIDE_LABEL,
    UPDATE_RATIO_GUIDE_TIP,
    WIDTH,
    XAxis,
    finite_values,
    first_run,
    highlight_opacity,
    legend_highlight,
    no_data,
    select_rows,
    sentence_case,
    step_spans,
    tooltips,
    value_tip,
    with_layer_names,
    x_axis_encoding,
    x_zoom,
    y_scale_for,
)
from blockviz.views.charts.colours import NEUTRAL, depth_colours

Layers = int | Mapping[int, int] | None


def layer_stat_rows(
    layer_stats: pd.DataFrame, kind: str, component: str | None, stat: str
) -> pd.DataFrame:
    rows = select_rows(layer_stats, kind=kind, component=component, stat=stat)
    return rows.sort_values(["run_id", "layer", "component", "step"]).reset_index(drop=True)


def _lines_by_layer(
    y: str,
    y_title: str,
    log_scale: bool,
    order: list[str],
    extra_tips: Iterable[str | alt.Tooltip] = (),
    x_axis: XAxis = STEP_AXIS,
    points: bool = False,
    frame: pd.DataFrame | None = None,
) -> alt.Chart:
    """One line per layer over x, legend-highlight by layer, x zoom; data left to caller.

    `order` is the layer names in depth order (colour runs along it, blue to orange);
    `points` marks each value too (a line of one point draws nothing); `frame` is the
    data, for the x ticks.
    """
    layers = legend_highlight("layer_name")
    return (
        alt.Chart()
        .mark_line(strokeWidth=1.5, point=points)
        .encode(
            x=x_axis_encoding(x_axis, frame),
            y=alt.Y(f"{y}:Q", title=y_title, scale=y_scale_for(log_scale)),
            color=alt.Color(
                "layer_name:O",
                title="layer",
                sort=order,
                scale=alt.Scale(domain=order, range=depth_colours(len(order))),
            ),
            detail="run:N",
            opacity=highlight_opacity(layers),
            tooltip=tooltips(
                "run:N",
                alt.Tooltip("layer_name:N", title="layer"),
                *extra_tips,
                "step:Q",
                value_tip(y, y_title),
            ),
        )
        .add_params(layers, x_zoom())
    )


def _one_step(frame: pd.DataFrame) -> bool:
    return bool(frame["step"].nunique() == 1)


def layer_lines(
    layer_stats: pd.DataFrame,
    stat: str = spec.GRAD_NORM,
    component: str = "block",
    log_scale: bool = True,
    kind: str = "component",
    title: str | None = None,
    x_axis: XAxis = STEP_AXIS,
    n_layers: Layers = None,
) -> alt.LayerChart:
    """One run: one line per layer of `stat` for `component` over steps, coloured by depth."""
    frame = layer_stat_rows(layer_stats, kind, component, stat)
    frame = finite_values(frame, "value", positive=log_scale)
    if frame.empty:
        return no_data(frame, title or sentence_case(f"{stat} per layer ({component})"))
    frame, run = first_run(frame)
    frame, order = with_layer_names(frame, n_layers)
    title = title or sentence_case(f"{spec.stat_label(stat)} per layer ({component}) — {run}")
    chart = _lines_by_layer(
        "value",
        spec.stat_label(stat),
        log_scale,
        order,
        x_axis=x_axis,
        points=_one_step(frame),
        frame=frame,
    )
    return alt.LayerChart(data=frame, layer=[chart]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )


def layer_heatmap(
    layer_stats: pd.DataFrame,
    stat: str = spec.GRAD_NORM,
    component: str = "block",
    kind: str = "component",
    title: str | None = None,
    x_axis: XAxis = STEP_AXIS,
    n_layers: Layers = None,
) -> alt.LayerChart:
    """One run: layer (y) x step (x) heat map of `stat`, log colour when all values are > 0."""
    frame = finite_values(layer_stat_rows(layer_stats, kind, component, stat), "value")
    if frame.empty:
        return no_data(frame, title or sentence_case(f"{stat} by layer and step ({component})"))
    frame, run = first_run(frame)
    frame, order = with_layer_names(frame, n_layers)
    frame = step_spans(frame, x_axis.field).reset_index(drop=True)
    stat_title = spec.stat_label(stat)
    log_color = bool((frame["value"] > 0).all())
    heat = (
        alt.Chart()
        .mark_rect()
        .encode(
            x=x_axis_encoding(x_axis, frame, f"{x_axis.field}_end"),
            x2=f"{x_axis.field}_end:Q",
            y=alt.Y("layer_name:O", title="layer", sort=order[::-1]),
            color=alt.Color(
                "value:Q",
                title=stat_title,
                scale=alt.Scale(type="log" if log_color else "linear", scheme=LAYER_SCHEME),
            ),
            tooltip=tooltips(
                "run:N",
                alt.Tooltip("layer_name:N", title="layer"),
                "component:N",
                "step:Q",
                value_tip(),
            ),
        )
        .add_params(x_zoom())
    )
    title = title or sentence_case(f"{stat_title} by layer and step ({component}) — {run}")
    return alt.LayerChart(data=frame, layer=[heat]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )


def tap_stats_chart(
    layer_stats: pd.DataFrame,
    stat: str = spec.RMS,
    log_scale: bool = False,
    title: str | None = None,
    x_axis: XAxis = STEP_AXIS,
    n_layers: Layers = None,
) -> alt.FacetChart | alt.LayerChart:
    """One run: a panel per tap (in block order), lines by layer of an activation statistic."""
    frame = finite_values(
        layer_stat_rows(layer_stats, "tap", None, stat), "value", positive=log_scale
    )
    stat_title = spec.stat_label(stat)
    if frame.empty:
        return no_data(frame, title or sentence_case(f"{stat_title} per tap"))
    frame, run = first_run(frame)
    frame, order = with_layer_names(frame, n_layers)
    taps = [t for t in spec.TAPS if t in set(frame["component"])]
    taps += sorted(set(frame["component"]) - set(taps))
    panel = _lines_by_layer(
        "value",
        stat_title,
        log_scale,
        order,
        extra_tips=["component:N"],
        x_axis=x_axis,
        points=_one_step(frame),
        frame=frame,
    )
    return (
        panel.properties(width=SMALL_WIDTH, height=SMALL_HEIGHT)
        .facet(data=frame, facet=alt.Facet("component:N", title=None, sort=taps), columns=4)
        .resolve_scale(y="independent")
        .properties(title=title or sentence_case(f"{stat_title} per tap and layer — {run}"))
    )


def _percent(fraction: float) -> str:
    """A share of values in words: 0.021 -> "2.1%", a trace -> "<0.001%"."""
    if fraction == 0:
        return "0%"
    if fraction < 1e-5:
        return "<0.001%"
    return f"{100 * fraction:.2g}%"


def _outside_shares(
    tap_stats: pd.DataFrame, run_id: object, layer: object, tap: object
) -> pd.DataFrame:
    """Per probe step, the fractions of one tap's values below and above the histogram range."""
    rows = select_rows(tap_stats, run_id=run_id, layer=layer, kind="tap", component=tap)
    rows = rows[rows["stat"].isin([spec.BELOW_RANGE, spec.ABOVE_RANGE])]
    shares = rows.pivot_table(index="step", columns="stat", values="value", aggfunc="last")
    return shares.reindex(columns=[spec.BELOW_RANGE, spec.ABOVE_RANGE]).dropna().reset_index()


def _outside_note(shares: pd.DataFrame, lo: float, hi: float) -> str:
    """The subtitle saying how much of the tap lies outside [lo, hi] and is not drawn."""
    lo_text, hi_text = spec.number_label(lo), spec.number_label(hi)
    if shares.empty:  # a run recorded before the probes counted them apart
        return (
            f"Recorded before values outside [{lo_text}, {hi_text}] were counted apart: "
            "the end bins may include them."
        )
    below, above = shares[spec.BELOW_RANGE].max(), shares[spec.ABOVE_RANGE].max()
    if below == 0 and above == 0:
        return f"Every value lay inside [{lo_text}, {hi_text}] at every probe step."
    return (
        f"Not drawn: values outside [{lo_text}, {hi_text}], at most {_percent(below)} below "
        f"{lo_text} and {_percent(above)} above {hi_text} at a probe step (each step's in the "
        "tooltip)."
    )


def histogram_over_time(
    hist: pd.DataFrame,
    layer: int | None = None,
    tap: str | None = None,
    title: str | None = None,
    tap_stats: pd.DataFrame | None = None,
    x_axis: XAxis = STEP_AXIS,
) -> alt.LayerChart:
    """One run, one layer and tap: step (x) x value bin (y) heat map of counts (log colour).

    The bins hold only the values inside the histogram's range [lo, hi]. `tap_stats` (the
    run's layer statistics of kind "tap") adds the fractions below and above it: the
    subtitle states the largest, each cell's tooltip its step's.
    """
    recorded = select_rows(hist, layer=layer, tap=tap)
    frame = recorded[pd.to_numeric(recorded["count"], errors="coerce") > 0]  # 0 = blank, as TB
    if frame.empty:
        inside = "No value inside the histogram's range" if len(recorded) else NO_DATA
        return no_data(frame, title or "Activation histogram over time", inside)
    first = frame.sort_values(["run_id", "layer", "tap"]).iloc[0]
    frame = select_rows(frame, run_id=first["run_id"], layer=first["layer"], tap=first["tap"])
    frame = step_spans(frame.sort_values(["step", "bin"]), x_axis.field).reset_index(drop=True)
    drawn = select_rows(recorded, run_id=first["run_id"], layer=first["layer"], tap=first["tap"])
    lo, hi = float(drawn["lo"].min()), float(drawn["hi"].max())  # empty end bins included
    tips: list[str | alt.Tooltip] = [
        "step:Q",
        alt.Tooltip("lo:Q", format=".3~g"),
        alt.Tooltip("hi:Q", format=".3~g"),
        "count:Q",
    ]
    title = title or f"Activation histogram over time — layer {first['layer']}, {first['tap']}"
    heading: str | alt.TitleParams = title
    if tap_stats is not None:
        shares = _outside_shares(tap_stats, first["run_id"], first["layer"], first["tap"])
        frame = frame.merge(shares, on="step", how="left")
        heading = alt.TitleParams(title, subtitle=_outside_note(shares, lo, hi))
        tips += [
            alt.Tooltip(
                f"{spec.BELOW_RANGE}:Q",
                title=spec.stat_label(spec.BELOW_RANGE),
                format=".3~%",
            ),
            alt.Tooltip(
                f"{spec.ABOVE_RANGE}:Q",
                title=spec.stat_label(spec.ABOVE_RANGE),
                format=".3~%",
            ),
        ]
    heat = (
        alt.Chart()
        .mark_rect()
        .encode(
            x=x_axis_encoding(x_axis, frame, f"{x_axis.field}_end"),
            x2=f"{x_axis.field}_end:Q",
            y=alt.Y("lo:Q", title=f"{first['tap']} value"),
            y2="hi:Q",
            color=alt.Color("count:Q", title="count", scale=alt.Scale(type="log", scheme="blues")),
            tooltip=tooltips(*tips),
        )
        .add_params(x_zoom())
    )
    return alt.LayerChart(data=frame, layer=[heat]).properties(
        title=heading, width=WIDTH, height=HEIGHT
    )


def update_ratio_chart(
    layer_stats: pd.DataFrame,
    component: str | None = None,
    title: str | None = None,
    x_axis: XAxis = STEP_AXIS,
    n_layers: Layers = None,
) -> alt.LayerChart:
    """One run: log10 ‖Δθ‖/‖θ‖ per step, one line per layer, with a 1e-3 reference line.

    ‖Δθ‖/‖θ‖ is the norm of one optimizer step's change of the component's tensors over
    their norm. `component` None: the layer's weight matrices ("weights"), or the whole
    layer ("block") for a run recorded before the probes summed the matrices alone.
    """
    if component is None:
        recorded = select_rows(layer_stats, kind="component", stat=spec.UPDATE_RATIO)["component"]
        component = (
            spec.WEIGHTS_COMPONENT if (recorded == spec.WEIGHTS_COMPONENT).any() else "block"
        )
    frame = finite_values(
        layer_stat_rows(layer_stats, "component", component, spec.UPDATE_RATIO), "value"
    )
    frame = frame[frame["value"] > 0].copy()
    what = spec.component_label(component)
    fallback = title or f"Update ratio ‖Δθ‖/‖θ‖ per layer ({what})"
    if frame.empty:
        return no_data(frame.assign(log10_update_ratio=pd.Series(dtype=float)), fallback)
    frame, run = first_run(frame)
    frame = frame.assign(log10_update_ratio=np.log10(frame["value"].astype(float)))
    frame, order = with_layer_names(frame, n_layers)
    lines = _lines_by_layer(
        "log10_update_ratio",
        f"log10 {spec.stat_label(spec.UPDATE_RATIO)}",
        log_scale=False,
        order=order,
        extra_tips=["component:N", value_tip("value", spec.stat_label(spec.UPDATE_RATIO))],
        x_axis=x_axis,
        points=_one_step(frame),
        frame=frame,
    )
    guide_data = pd.DataFrame(
        {
            "y": [np.log10(UPDATE_RATIO_GUIDE)],
            "label": [UPDATE_RATIO_GUIDE_LABEL],
            "about": [UPDATE_RATIO_GUIDE_TIP],
        }
    )
    guide = alt.Chart(guide_data).encode(
        y="y:Q", tooltip=[alt.Tooltip("about:N", title="dashed line")]
    )
    rule = guide.mark_rule(color=NEUTRAL, strokeDash=[5, 4])
    label = guide.mark_text(align="left", baseline="bottom", x=4, dy=-2, color=NEUTRAL).encode(
        text="label:N"
    )
    title = title or f"Update ratio ‖Δθ‖/‖θ‖ per step, by layer ({what}) — {run}"
    return alt.LayerChart(data=frame, layer=[lines, rule, label]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )
