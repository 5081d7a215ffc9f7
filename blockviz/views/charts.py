"""Altair chart builders: a tidy DataFrame from the run store in, an `alt.Chart` out.

Pure functions: no Streamlit, no torch, no store access, so the pages, the exports and the
tests build exactly the same chart. Conventions shared by every builder:

- The frame the chart draws (after filtering and smoothing, with the smoothed column) is
  the chart's top-level `data`; `chart_data(chart)` reads it back for the CSV export. Extra
  layers that annotate (divergence rules, guide lines, "no data yet") carry their own data.
- Line charts have tooltips (run, step, value, plus layer / component where relevant), a
  legend that highlights the clicked run or layer, and zoom / pan on the x axis.
- Runs keep one colour everywhere: `run_color_scale` maps run id % 10 onto a fixed palette.
- Non-finite values (a diverged run's inf / NaN) are dropped from marks, never raised on;
  the step where they start is marked on loss and metric charts instead.
- An empty frame gives a chart that says "no data yet".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise

import altair as alt
import numpy as np
import pandas as pd

from blockviz.core import spec

# Vega's "tableau10" colours (distinguishable, colour-blind tolerable), reordered so that
# runs with neighbouring ids never get neighbouring hues (orange next to red, say) and the
# faint yellow and grey come last. A run's colour is PALETTE[run_id % 10], whatever else
# is on the chart.
PALETTE = (
    "#4c78a8",  # blue
    "#f58518",  # orange
    "#54a24b",  # green
    "#e45756",  # red
    "#b279a2",  # purple
    "#72b7b2",  # teal
    "#9d755d",  # brown
    "#ff9da6",  # pink
    "#eeca3b",  # yellow
    "#bab0ac",  # grey
)
LAYER_AXIS_TITLE = spec.LAYER_AXIS_TITLE
DIVERGED_COLOR = "#d62728"
LAYER_SCHEME = "viridis"  # sequential: depth reads as a gradient from first to last layer
WIDTH, HEIGHT = 600, 280  # pages stretch to the container; exports use this size
SMALL_WIDTH, SMALL_HEIGHT = 150, 120  # one panel of small multiples; 4 across fit a laptop
NO_DATA = "no data yet"
HEALTHY_UPDATE_RATIO = 1e-3  # Karpathy's rule of thumb for ‖Δθ‖/‖θ‖ per step


class ChartError(ValueError):
    """A chart argument is out of range; the message names it, the value and what is allowed."""


# ---------------------------------------------------------------------------------------
# Small shared pieces


def ema(values: pd.Series, smoothing: float) -> pd.Series:
    """TensorBoard-style debiased exponential moving average; 0 = no smoothing.

    Non-finite points pass through unchanged and do not enter the average, so one inf at
    divergence neither poisons every later point nor hides the finite ones before it.
    """
    if isinstance(smoothing, bool) or not (0.0 <= float(smoothing) < 1.0):
        raise ChartError(f"smoothing: {smoothing!r} is not allowed; must be in [0, 1)")
    numbers = pd.to_numeric(values, errors="coerce").astype(float)
    finite = np.isfinite(numbers.to_numpy())
    smoothed = numbers.copy()
    if smoothing > 0 and finite.any():
        # ewm(adjust=True) divides by the sum of the weights: exactly TensorBoard's debiasing
        # (accumulator / (1 - w**n)) without a Python loop.
        smoothed[finite] = numbers[finite].ewm(alpha=1.0 - smoothing, adjust=True).mean()
    return smoothed


def run_color_scale(runs: pd.DataFrame | Mapping[int, str]) -> alt.Scale:
    """Colour scale over run names: ordered by id, colour = PALETTE[run_id % 10]."""
    by_id = _run_names(runs)
    ids = sorted(by_id)
    return alt.Scale(domain=[by_id[i] for i in ids], range=[PALETTE[i % 10] for i in ids])


def _run_names(runs: pd.DataFrame | Mapping[int, str]) -> dict[int, str]:
    """run id -> name from a runs frame (id, name), a tidy frame (run_id, run) or a mapping."""
    if isinstance(runs, pd.DataFrame):
        id_col, name_col = ("id", "name") if "id" in runs.columns else ("run_id", "run")
        pairs = runs[[id_col, name_col]].drop_duplicates()
        return {int(i): str(n) for i, n in zip(pairs[id_col], pairs[name_col], strict=True)}
    return {int(i): str(n) for i, n in runs.items()}


def chart_data(chart: alt.TopLevelMixin) -> pd.DataFrame:
    """The frame a builder attached as the chart's data (what the CSV export writes)."""
    data = getattr(chart, "data", None)
    return data.copy() if isinstance(data, pd.DataFrame) else pd.DataFrame()


def _no_data(frame: pd.DataFrame, title: str, message: str = NO_DATA) -> alt.LayerChart:
    """A titled, chart-sized placeholder; its data is the (empty) frame it was given."""
    note = (
        alt.Chart(pd.DataFrame({"message": [message]}))
        .mark_text(size=14, color="gray")
        .encode(text="message:N")
    )
    return alt.LayerChart(data=frame, layer=[note]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )


def _finite(frame: pd.DataFrame, column: str, positive: bool = False) -> pd.DataFrame:
    """Rows whose `column` is finite (and > 0 for log scales)."""
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    keep = np.isfinite(values) & ((values > 0) if positive else True)
    return frame[keep]


def _sentence(text: str) -> str:
    """Capitalise the first letter only (titles built from lower-case axis titles)."""
    return text[:1].upper() + text[1:]


def _y_scale(log_scale: bool) -> alt.Scale:
    return alt.Scale(type="log") if log_scale else alt.Scale(zero=False)


def _x_step() -> alt.X:
    return alt.X("step:Q", title="step", axis=alt.Axis(format="~s"))


def _tooltip(*fields: str | alt.Tooltip) -> list[alt.Tooltip]:
    """Tooltips, with numbers shown to 4 significant digits."""
    return [alt.Tooltip(f) if isinstance(f, str) else f for f in fields]


def _value_tip(field: str = "value", title: str = "value") -> alt.Tooltip:
    return alt.Tooltip(f"{field}:Q", title=title, format=".4~g")


def _legend_highlight(field: str) -> alt.Parameter:
    """Click a legend entry to highlight that run / layer; click again (or empty) for all."""
    return alt.selection_point(fields=[field], bind="legend")


def _x_zoom() -> alt.Parameter:
    """Drag to pan, scroll to zoom, on the x axis only (y stays fitted to the data)."""
    return alt.selection_interval(bind="scales", encodings=["x"])


def _highlight(param: alt.Parameter, on: float = 1.0, off: float = 0.12) -> alt.Parameter:
    return alt.when(param).then(alt.value(on)).otherwise(alt.value(off))


def _step_spans(frame: pd.DataFrame) -> pd.DataFrame:
    """Add `step_end`: the next logged step, so heat-map cells tile the step axis."""
    steps = np.sort(frame["step"].unique())
    gap = float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0
    following = dict(pairwise(steps))
    out = frame.copy()
    out["step_end"] = [following.get(s, s + gap) for s in out["step"]]
    return out


def _select(frame: pd.DataFrame, **equals: object) -> pd.DataFrame:
    """Rows where every given column equals the given value (None = any)."""
    mask = np.ones(len(frame), dtype=bool)
    for column, wanted in equals.items():
        if wanted is not None:
            mask &= (frame[column] == wanted).to_numpy()
    return frame[mask]


def _first_run(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """One-run charts show the lowest run id present; return its rows and its name."""
    run_id = frame["run_id"].min()
    rows = frame[frame["run_id"] == run_id]
    return rows, str(rows["run"].iloc[0])


# ---------------------------------------------------------------------------------------
# Scalars over steps: loss, lr, throughput, any metric


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


def _divergence_layers(marks: pd.DataFrame) -> list[alt.Chart]:
    """A red dashed rule and label at each diverged step."""
    base = alt.Chart(marks).encode(
        x="step:Q", tooltip=_tooltip("run:N", alt.Tooltip("step:Q", title="diverged at step"))
    )
    rule = base.mark_rule(color=DIVERGED_COLOR, strokeDash=[4, 3], strokeWidth=1.5)
    label = base.mark_text(
        color=DIVERGED_COLOR, align="left", baseline="top", dx=3, y=4, fontSize=11
    ).encode(text="label:N")
    return [rule, label]


def _series_chart(
    scalars: pd.DataFrame,
    names: Sequence[str],
    smoothing: float,
    log_scale: bool,
    colors: alt.Scale | None,
    title: str,
    y_title: str,
    diverged: Mapping[str, int] | pd.DataFrame | None,
) -> alt.LayerChart:
    """Smoothed line per run x series, raw series faint behind, divergence marked."""
    raw = scalars[scalars["name"].isin(list(names))].sort_values(["run_id", "name", "step"])
    plotted = _finite(raw, "value", positive=log_scale).copy()
    if plotted.empty:
        return _no_data(plotted.assign(smoothed=pd.Series(dtype=float)), title)
    plotted["smoothed"] = plotted.groupby(["run_id", "name"])["value"].transform(
        lambda series: ema(series, smoothing)
    )
    plotted = plotted.reset_index(drop=True)
    colors = colors or run_color_scale(plotted)
    runs = _legend_highlight("run")
    zoom = _x_zoom()
    # train solid, val dashed; further names get further patterns.
    dash_scale = alt.Scale(domain=list(names), range=[[1, 0], [6, 3], [2, 2], [8, 2, 2, 2]])
    dash = alt.StrokeDash(
        "name:N",
        title="series",
        sort=list(names),
        scale=dash_scale,
        legend=alt.Legend(symbolOpacity=1) if len(names) > 1 else None,
    )
    base = alt.Chart().encode(
        x=_x_step(),
        # The faint raw layer draws first; without this its opacity would fade the legend.
        color=alt.Color("run:N", title="run", scale=colors, legend=alt.Legend(symbolOpacity=1)),
        strokeDash=dash,
    )
    smooth_line = (
        base.mark_line(strokeWidth=2)
        .encode(
            y=alt.Y("smoothed:Q", title=y_title, scale=_y_scale(log_scale)),
            opacity=_highlight(runs),
            tooltip=_tooltip(
                "run:N", "name:N", "step:Q", _value_tip(), _value_tip("smoothed", "smoothed")
            ),
        )
        .add_params(runs, zoom)
    )
    layers: list[alt.Chart] = [smooth_line]
    if smoothing > 0:
        raw_line = base.mark_line(strokeWidth=1).encode(
            y="value:Q",
            opacity=_highlight(runs, on=0.2, off=0.04),
        )
        layers.insert(0, raw_line)
    marks = _diverged_frame(raw, diverged)
    if not marks.empty:
        layers += _divergence_layers(marks)
    return alt.LayerChart(data=plotted, layer=layers).properties(
        title=title, width=WIDTH, height=HEIGHT
    )


def loss_chart(
    scalars: pd.DataFrame,
    smoothing: float = 0.6,
    log_scale: bool = False,
    names: Sequence[str] = ("train/loss", "val/loss"),
    colors: alt.Scale | None = None,
    diverged: Mapping[str, int] | pd.DataFrame | None = None,
    title: str = "Loss",
) -> alt.LayerChart:
    """Train (solid) and val (dashed) loss per run, EMA-smoothed over faint raw lines.

    `diverged` is a runs frame (name, diverged_step) or {run name: step}; the first
    non-finite value of a run is marked even without it.
    """
    return _series_chart(
        scalars, names, smoothing, log_scale, colors, title, "loss (nats/char)", diverged
    )


def metric_chart(
    scalars: pd.DataFrame,
    name: str,
    smoothing: float = 0.0,
    log_scale: bool = False,
    colors: alt.Scale | None = None,
    title: str | None = None,
    diverged: Mapping[str, int] | pd.DataFrame | None = None,
) -> alt.LayerChart:
    """Any one scalar (lr, tokens/s, grad norm, val metric) over steps, coloured by run."""
    y_title = spec.scalar_label(name)
    return _series_chart(
        scalars, [name], smoothing, log_scale, colors, title or name, y_title, diverged
    )


# ---------------------------------------------------------------------------------------
# Per-layer statistics of one run


def _layer_frame(
    layer_stats: pd.DataFrame, kind: str, component: str | None, stat: str
) -> pd.DataFrame:
    rows = _select(layer_stats, kind=kind, component=component, stat=stat)
    return rows.sort_values(["run_id", "layer", "component", "step"]).reset_index(drop=True)


def _lines_by_layer(
    y: str,
    y_title: str,
    log_scale: bool,
    extra_tips: Iterable[str | alt.Tooltip] = (),
) -> alt.Chart:
    """One line per layer over steps, legend-highlight by layer, x zoom; data left to caller."""
    layers = _legend_highlight("layer")
    return (
        alt.Chart()
        .mark_line(strokeWidth=1.5)
        .encode(
            x=_x_step(),
            y=alt.Y(f"{y}:Q", title=y_title, scale=_y_scale(log_scale)),
            color=alt.Color("layer:O", title="layer", scale=alt.Scale(scheme=LAYER_SCHEME)),
            detail="run:N",
            opacity=_highlight(layers),
            tooltip=_tooltip("run:N", "layer:O", *extra_tips, "step:Q", _value_tip(y, y_title)),
        )
        .add_params(layers, _x_zoom())
    )


def layer_lines(
    layer_stats: pd.DataFrame,
    stat: str = "grad_norm",
    component: str = "block",
    log_scale: bool = True,
    kind: str = "component",
    title: str | None = None,
) -> alt.LayerChart:
    """One run: one line per layer of `stat` for `component` over steps, coloured by depth."""
    frame = _layer_frame(layer_stats, kind, component, stat)
    frame = _finite(frame, "value", positive=log_scale)
    if frame.empty:
        return _no_data(frame, title or _sentence(f"{stat} per layer ({component})"))
    frame, run = _first_run(frame)
    title = title or _sentence(f"{spec.stat_label(stat)} per layer ({component}) — {run}")
    chart = _lines_by_layer("value", spec.stat_label(stat), log_scale)
    return alt.LayerChart(data=frame, layer=[chart]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )


def layer_heatmap(
    layer_stats: pd.DataFrame,
    stat: str = "grad_norm",
    component: str = "block",
    kind: str = "component",
    title: str | None = None,
) -> alt.LayerChart:
    """One run: layer (y) x step (x) heat map of `stat`, log colour when all values are > 0."""
    frame = _finite(_layer_frame(layer_stats, kind, component, stat), "value")
    if frame.empty:
        return _no_data(frame, title or _sentence(f"{stat} by layer and step ({component})"))
    frame, run = _first_run(frame)
    frame = _step_spans(frame).reset_index(drop=True)
    stat_title = spec.stat_label(stat)
    log_color = bool((frame["value"] > 0).all())
    heat = (
        alt.Chart()
        .mark_rect()
        .encode(
            x=_x_step(),
            x2="step_end:Q",
            y=alt.Y("layer:O", title="layer", sort="descending"),
            color=alt.Color(
                "value:Q",
                title=stat_title,
                scale=alt.Scale(type="log" if log_color else "linear", scheme=LAYER_SCHEME),
            ),
            tooltip=_tooltip("run:N", "layer:O", "component:N", "step:Q", _value_tip()),
        )
        .add_params(_x_zoom())
    )
    title = title or _sentence(f"{stat_title} by layer and step ({component}) — {run}")
    return alt.LayerChart(data=frame, layer=[heat]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )


def tap_stats_chart(
    layer_stats: pd.DataFrame, stat: str = "rms", log_scale: bool = False, title: str | None = None
) -> alt.FacetChart | alt.LayerChart:
    """One run: a panel per tap (in block order), lines by layer of an activation statistic."""
    frame = _finite(_layer_frame(layer_stats, "tap", None, stat), "value", positive=log_scale)
    stat_title = spec.stat_label(stat)
    if frame.empty:
        return _no_data(frame, title or _sentence(f"{stat_title} per tap"))
    frame, run = _first_run(frame)
    taps = [t for t in spec.TAPS if t in set(frame["component"])]
    taps += sorted(set(frame["component"]) - set(taps))
    panel = _lines_by_layer("value", stat_title, log_scale, extra_tips=["component:N"])
    return (
        panel.properties(width=SMALL_WIDTH, height=SMALL_HEIGHT)
        .facet(data=frame, facet=alt.Facet("component:N", title=None, sort=taps), columns=4)
        .resolve_scale(y="independent")
        .properties(title=title or _sentence(f"{stat_title} per tap and layer — {run}"))
    )


def histogram_over_time(
    hist: pd.DataFrame, layer: int | None = None, tap: str | None = None, title: str | None = None
) -> alt.LayerChart:
    """One run, one layer and tap: step (x) x value bin (y) heat map of counts (log colour)."""
    frame = _select(hist, layer=layer, tap=tap)
    frame = frame[pd.to_numeric(frame["count"], errors="coerce") > 0]  # 0 = blank, as in TB
    if frame.empty:
        return _no_data(frame, title or "Activation histogram over time")
    first = frame.sort_values(["run_id", "layer", "tap"]).iloc[0]
    frame = _select(frame, run_id=first["run_id"], layer=first["layer"], tap=first["tap"])
    frame = _step_spans(frame.sort_values(["step", "bin"])).reset_index(drop=True)
    heat = (
        alt.Chart()
        .mark_rect()
        .encode(
            x=_x_step(),
            x2="step_end:Q",
            y=alt.Y("lo:Q", title=f"{first['tap']} value"),
            y2="hi:Q",
            color=alt.Color("count:Q", title="count", scale=alt.Scale(type="log", scheme="blues")),
            tooltip=_tooltip(
                "step:Q",
                alt.Tooltip("lo:Q", format=".3~g"),
                alt.Tooltip("hi:Q", format=".3~g"),
                "count:Q",
            ),
        )
        .add_params(_x_zoom())
    )
    title = title or f"Activation histogram over time — layer {first['layer']}, {first['tap']}"
    return alt.LayerChart(data=frame, layer=[heat]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )


def update_ratio_chart(
    layer_stats: pd.DataFrame, component: str = "block", title: str | None = None
) -> alt.LayerChart:
    """One run: log10 ‖Δθ‖/‖θ‖ per layer over steps with the ≈1e-3 guide line."""
    frame = _finite(_layer_frame(layer_stats, "component", component, "update_ratio"), "value")
    frame = frame[frame["value"] > 0].copy()
    if frame.empty:
        return _no_data(frame.assign(log10_update_ratio=pd.Series(dtype=float)), title or "Update")
    frame, run = _first_run(frame)
    frame = frame.assign(log10_update_ratio=np.log10(frame["value"].astype(float)))
    lines = _lines_by_layer(
        "log10_update_ratio",
        "log10 ‖Δθ‖/‖θ‖",
        log_scale=False,
        extra_tips=[_value_tip("value", "‖Δθ‖/‖θ‖")],
    )
    guide_data = pd.DataFrame({"y": [np.log10(HEALTHY_UPDATE_RATIO)], "label": ["≈1e-3 healthy"]})
    guide = alt.Chart(guide_data).encode(y="y:Q")
    rule = guide.mark_rule(color="gray", strokeDash=[5, 4])
    label = guide.mark_text(align="left", baseline="bottom", x=4, dy=-2, color="gray").encode(
        text="label:N"
    )
    title = title or f"Update-to-data ratio per layer ({component}) — {run}"
    return alt.LayerChart(data=frame, layer=[lines, rule, label]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )


def attention_entropy_chart(
    layer_stats: pd.DataFrame, title: str | None = None
) -> alt.FacetChart | alt.LayerChart:
    """One run: a panel per layer, attention entropy of each head over steps."""
    frame = _finite(_layer_frame(layer_stats, "head", None, "attn_entropy"), "value")
    if frame.empty:
        return _no_data(frame.assign(head=pd.Series(dtype=int)), title or "Attention entropy")
    frame, run = _first_run(frame)
    frame = frame.assign(head=pd.to_numeric(frame["component"], errors="coerce"))
    heads = _legend_highlight("head")
    panel = (
        alt.Chart()
        .mark_line(strokeWidth=1.5)
        .encode(
            x=_x_step(),
            y=alt.Y("value:Q", title="attention entropy (nats)", scale=alt.Scale(zero=False)),
            color=alt.Color("head:O", title="head", scale=alt.Scale(scheme="category10")),
            opacity=_highlight(heads),
            tooltip=_tooltip("run:N", "layer:O", "head:O", "step:Q", _value_tip()),
        )
        .add_params(heads, _x_zoom())
        .properties(width=SMALL_WIDTH, height=SMALL_HEIGHT)
    )
    return panel.facet(data=frame, facet=alt.Facet("layer:O", title="layer"), columns=4).properties(
        title=title or f"Attention entropy per head — {run}"
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


# ---------------------------------------------------------------------------------------
# Across runs


def grad_by_layer_chart(
    layer_stats: pd.DataFrame,
    step: int = 0,
    component: str = "block",
    colors: alt.Scale | None = None,
    title: str | None = None,
) -> alt.LayerChart:
    """Many runs: gradient norm (log) vs layer at `step` — the Pre-LN vs Post-LN picture.

    Each run shows its probe step nearest to `step` (ties to the earlier), named in the tip.
    """
    where = "initialization (step 0)" if step == 0 else f"step {step}"
    title = title or f"Gradient norm by layer at {where}"
    frame = _finite(_layer_frame(layer_stats, "component", component, "grad_norm"), "value", True)
    if frame.empty:
        return _no_data(frame, title)
    distance = (frame["step"] - step).abs()
    nearest = frame.assign(distance=distance).groupby("run_id")["distance"].transform("min")
    frame = frame[distance == nearest]
    frame = frame[frame["step"] == frame.groupby("run_id")["step"].transform("min")]
    frame = frame.sort_values(["run_id", "layer"]).reset_index(drop=True)
    runs = _legend_highlight("run")
    lines = (
        alt.Chart()
        .mark_line(point=True, strokeWidth=2)
        .encode(
            x=alt.X("layer:Q", title=LAYER_AXIS_TITLE, axis=alt.Axis(tickMinStep=1, format="d")),
            y=alt.Y("value:Q", title="gradient L2 norm", scale=alt.Scale(type="log")),
            color=alt.Color("run:N", title="run", scale=colors or run_color_scale(frame)),
            opacity=_highlight(runs),
            tooltip=_tooltip("run:N", "layer:O", "component:N", "step:Q", _value_tip()),
        )
        .add_params(runs, _x_zoom())
    )
    return alt.LayerChart(data=frame, layer=[lines]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )


# ---------------------------------------------------------------------------------------
# Parameter breakdown (no training needed)


def param_breakdown_chart(
    components: pd.DataFrame, title: str = "Parameters by component"
) -> alt.LayerChart:
    """Horizontal bars of parameter count per component, labelled with its share."""
    frame = components.reset_index(drop=True)
    if frame.empty:
        return _no_data(frame, title)
    base = alt.Chart().encode(
        y=alt.Y("component:N", title="component", sort="-x"),
        x=alt.X("count:Q", title="parameters", axis=alt.Axis(format="~s")),
        tooltip=_tooltip(
            "component:N",
            alt.Tooltip("count:Q", format=","),
            alt.Tooltip("share:Q", format=".1%"),
        ),
    )
    bars = base.mark_bar(color=PALETTE[0])
    labels = base.mark_text(align="left", dx=3).encode(text=alt.Text("share:Q", format=".1%"))
    return alt.LayerChart(data=frame, layer=[bars, labels]).properties(
        title=title, width=WIDTH, height=alt.Step(22)
    )


def param_layer_chart(layers: pd.DataFrame, title: str = "Parameters by layer") -> alt.LayerChart:
    """Bars of parameter count per layer, stacked by component when the frame has one."""
    frame = layers.reset_index(drop=True)
    if frame.empty:
        return _no_data(frame, title)
    stacked = "component" in frame.columns
    encoding = {
        "x": alt.X("layer:N", title="layer", sort=None),
        "y": alt.Y("sum(count):Q", title="parameters", axis=alt.Axis(format="~s")),
        "tooltip": _tooltip(
            "layer:N", *(["component:N"] if stacked else []), alt.Tooltip("count:Q", format=",")
        ),
    }
    if stacked:
        encoding["color"] = alt.Color("component:N", title="component")
    bars = alt.Chart().mark_bar(color=PALETTE[0]).encode(**encoding)
    return alt.LayerChart(data=frame, layer=[bars]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )
