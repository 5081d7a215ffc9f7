"""A study's charts: loss curves by variant with seed bands, and final loss against the
swept value with each run's outcome marked (Altair; tidy frames in, charts out).

Every variant has one colour and one dash (`variant_styles`), written into each chart as
an explicit scale in the study's variant order (the run palette, `charts.colours`: every
colour and shade readable on a light and a dark page), so the page (whatever its theme) and the
zip draw a variant alike, and a variant keeps its colour while the study fills in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

import altair as alt
import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.views.charts.base import WIDTH, neutral_legend_symbols, no_data, x_axis_encoding
from blockviz.views.charts.colours import PALETTE, shade
from blockviz.views.seed_groups import BAND_NOTE, MANY_GROUPS, band_frame

OUTCOME_SHAPES = {
    "converged": "circle",
    "stalled": "square",
    "diverged": "cross",
    "blew up": "triangle-up",
}
OUTCOME_FILLED = {"converged": True, "stalled": False, "diverged": True, "blew up": True}
# Drawn at the top of the plot, off the scale of the other runs: a diverged run has no
# finite loss, and a blown-up run's (above ln V + 1) would squash everyone else's.
OFF_SCALE = ("diverged", "blew up")

DASHES = ((1, 0), (6, 3), (2, 2), (8, 3, 2, 3))  # solid, dashed, dotted, dash-dot
# The page fits title, axes and legend into a chart's height (280 left ~140 px of plot);
# a curves chart grows so that its legend fits beside the plot: a row per variant (20 px
# in Streamlit's theme) below the titles.
STUDY_HEIGHT = 360
LEGEND_ROW, LEGEND_TOP = 21, 80

Style = tuple[str, tuple[int, ...]]  # a colour (#rrggbb) and a stroke dash


def _shade(colour: str, index: int, count: int) -> str:
    """The `index`-th of `count` shades of a hue, light to dark (one alone: the hue),
    each one readable on a light and on a dark page (`colours.shade`)."""
    if count < 2:
        return colour
    span = min(1.0, 0.55 + 0.15 * (count - 1))
    return shade(colour, span * (2 * index / (count - 1) - 1))  # -1 lightest .. +1 darkest


def _ordered(values: pd.Series) -> bool:
    """Numbers, not booleans: a swept field that orders its variants (lr, depth)."""
    return all(isinstance(v, Real) and not isinstance(v, bool | np.bool_) for v in values)


def _label(values: Sequence[object]) -> str:
    return " · ".join(str(v) for v in values)


def variant_styles(results: pd.DataFrame, swept: Sequence[str] = ()) -> dict[str, Style]:
    """Each variant's colour and dash, in the study's variant order.

    Where the study crosses a named swept field (norm position, residual on/off) with a
    numeric one (lr, depth), each value of the named fields is a family: one hue and one
    dash, its variants in shades light to dark in their order; of two numeric fields, the
    one with fewer values names the families. Otherwise each variant is a
    colour of PALETTE in turn (a dash of its own once the colours repeat).
    """
    first = results.drop_duplicates("variant").set_index("variant")
    variants = [str(v) for v in first.index]
    varied = [f for f in swept if f in first.columns and first[f].nunique(dropna=False) > 1]
    named = [f for f in varied if not _ordered(first[f])]
    if not named and len(varied) > 1:  # two numeric fields (soft-cap × lr): the one of
        named = [min(varied, key=lambda f: first[f].nunique(dropna=False))]  # fewer values
    if not named or len(named) == len(varied):
        return {
            v: (PALETTE[i % len(PALETTE)], DASHES[i // len(PALETTE) % len(DASHES)])
            for i, v in enumerate(variants)
        }
    family_of = {v: _label(first.loc[v, named].tolist()) for v in variants}
    styles: dict[str, Style] = {}
    for index, family in enumerate(dict.fromkeys(family_of.values())):
        members = [v for v in variants if family_of[v] == family]
        hue, dash = PALETTE[index % len(PALETTE)], DASHES[index % len(DASHES)]
        for rank, variant in enumerate(members):
            styles[variant] = (_shade(hue, rank, len(members)), dash)
    return {v: styles[v] for v in variants}


def _scales(styles: dict[str, Style]) -> tuple[alt.Scale, alt.Scale]:
    """The colour and dash scales of `styles`: domain the variants, range their styles."""
    domain = list(styles)
    return (
        alt.Scale(domain=domain, range=[colour for colour, _ in styles.values()]),
        alt.Scale(domain=domain, range=[list(dash) for _, dash in styles.values()]),
    )


def curves_chart(
    scalars: pd.DataFrame,
    results: pd.DataFrame,
    swept: Sequence[str] = (),
    metric: str = spec.VAL_LOSS,
) -> alt.TopLevelMixin:
    """The metric against step, one line per variant (the mean over its seeds) in its
    colour and dash, over a faint band (the 95% t interval of that mean where two or more
    seeds reached the step)."""
    label = spec.SCALARS.get(metric, metric)
    title = f"{label} by variant"
    variant_of = {
        int(r): str(v) for r, v in zip(results["run_id"], results["variant"], strict=True)
    }
    bands = band_frame(scalars, variant_of, [metric])
    if bands.empty:
        return no_data(bands, title)
    styles = variant_styles(results, swept)
    colours, dashes = _scales(styles)
    legend = alt.Legend(
        title="variant", symbolOpacity=1, symbolLimit=0, symbolType="stroke", labelLimit=300
    )
    color = alt.Color("group:N", scale=colours, legend=legend)
    dash = alt.StrokeDash("group:N", scale=dashes, legend=legend)
    x = x_axis_encoding(frame=bands)
    y_band = alt.Y("low:Q", title=label, scale=alt.Scale(zero=False))
    base = alt.Chart(bands)
    band = (
        base.transform_filter("isValid(datum.low) && isFinite(datum.low)")
        .mark_area(opacity=0.06 if len(styles) > MANY_GROUPS else 0.12)
        .encode(x=x, y=y_band, y2="high:Q", color=color)
    )
    tooltip = [
        alt.Tooltip("group:N", title="variant"),
        alt.Tooltip("step:Q", format=",d"),
        *(alt.Tooltip(f"{column}:Q", format=".4f") for column in ("mean", "low", "high")),
        alt.Tooltip("n:Q", title="runs"),
    ]
    y = alt.Y("mean:Q", title=label, scale=alt.Scale(zero=False))
    line = base.mark_line(strokeWidth=2, opacity=1).encode(
        x=x, y=y, color=color, strokeDash=dash, tooltip=tooltip
    )
    points = base.mark_point(filled=True, size=30, opacity=1).encode(
        x=x, y=y, color=color, tooltip=tooltip
    )
    height = max(STUDY_HEIGHT, LEGEND_TOP + LEGEND_ROW * len(styles))
    return alt.layer(band, line, points, data=bands).properties(
        title=alt.Title(title, subtitle=BAND_NOTE), width=WIDTH, height=height
    )


def swept_points(results: pd.DataFrame, field: str) -> pd.DataFrame:
    """One point per finished run: the swept value, the loss it is drawn at (diverged and
    blown-up runs at the top of the plot), its final val loss, outcome, and its group."""
    columns = ["run_id", "seed", field, "loss", "val_loss", "outcome", "group"]
    done = results[results["outcome"] != ""].copy()
    if done.empty:
        return pd.DataFrame(columns=columns)
    finite = done["val_loss"].map(lambda v: isinstance(v, float) and math.isfinite(v))
    on_scale = finite & ~done["outcome"].isin(OFF_SCALE)
    scale = on_scale if on_scale.any() else finite
    ceiling = float(done.loc[scale, "val_loss"].max()) if scale.any() else 1.0
    top = ceiling + 0.05 * max(abs(ceiling), 1.0)
    done["loss"] = np.where(on_scale, done["val_loss"], top)
    others = [c for c in results.columns if c.startswith("swept:")]
    done["group"] = done[others].astype(str).agg(" · ".join, axis=1) if others else "runs"
    return done[columns].reset_index(drop=True)


def swept_chart(
    results: pd.DataFrame, field: str, log_x: bool = False, by: Sequence[str] = ()
) -> alt.TopLevelMixin:
    """Final val loss against a swept value: each run a point shaped by its outcome
    (converged filled, stalled hollow, diverged a cross and blown-up a triangle at the
    top), a line through the mean of the converged and stalled runs at each value over a
    faint band from their lowest to their highest (the seeds' spread), one line per
    combination of the `by` fields' values (each a colour and dash of its own, in the
    order of the study's variants: a family's hue where `variant_styles` gives the same
    fields families)."""
    title_text = f"final val loss against {field}"
    frame = results.copy()
    by = [f for f in by if f in frame.columns and f != field]
    frame["swept:group"] = frame[by].astype(str).agg(" · ".join, axis=1) if by else "runs"
    points = swept_points(frame, field)
    if points.empty:
        return no_data(points, title_text)
    groups = list(dict.fromkeys(frame["swept:group"]))
    colours, dashes = _scales(
        {g: (PALETTE[i % len(PALETTE)], DASHES[i % len(DASHES)]) for i, g in enumerate(groups)}
    )
    title = _label(by)
    kind = "Q"
    x_scale = alt.Scale(type="log") if log_x else alt.Scale(zero=False)
    x = alt.X(f"{field}:{kind}", title=field, scale=x_scale)
    y_title, y_scale = "final val loss (nats)", alt.Scale(zero=False)
    y = alt.Y("loss:Q", title=y_title, scale=y_scale)
    legend = alt.Legend(title=title, symbolOpacity=1, symbolType="stroke") if by else None
    color = alt.Color("group:N", scale=colours, legend=legend)
    dash = alt.StrokeDash("group:N", scale=dashes, legend=legend)
    shape = alt.Shape(
        "outcome:N",
        title="outcome",
        scale=alt.Scale(domain=list(OUTCOME_SHAPES), range=list(OUTCOME_SHAPES.values())),
    )
    tooltip = [
        alt.Tooltip("run_id:Q", title="run"),
        alt.Tooltip("seed:Q"),
        alt.Tooltip(f"{field}:Q"),
        alt.Tooltip("val_loss:Q", title="final val loss", format=".4f"),
        alt.Tooltip("outcome:N"),
        alt.Tooltip("group:N", title=title or "group"),
    ]
    base = alt.Chart(points)
    filled = (
        base.transform_filter("datum.outcome != 'stalled'")
        .mark_point(filled=True, size=60, opacity=0.9)
        .encode(x=x, y=y, color=color, shape=shape, tooltip=tooltip)
    )
    hollow = (
        base.transform_filter("datum.outcome == 'stalled'")
        .mark_point(filled=False, size=60, strokeWidth=2)
        .encode(x=x, y=y, color=color, shape=shape, tooltip=tooltip)
    )
    on_scale = base.transform_filter(
        " && ".join(f"datum.outcome != '{outcome}'" for outcome in OFF_SCALE)
    )
    means = (
        on_scale.transform_aggregate(loss="mean(loss)", groupby=[field, "group"])
        .mark_line(opacity=0.8, strokeWidth=2)
        .encode(x=x, y=y, color=color, strokeDash=dash)
    )
    spread = (
        on_scale.transform_aggregate(low="min(loss)", high="max(loss)", groupby=[field, "group"])
        .mark_area(opacity=0.12)
        .encode(x=x, y=alt.Y("low:Q", title=y_title, scale=y_scale), y2="high:Q", color=color)
    )
    subtitle = [  # two lines: one would run past the plot's width
        "line: the mean of the runs that trained, band: their lowest to highest seed",
        "diverged runs: crosses at the top (no finite loss); blew up: triangles at the top "
        "(above the uniform guess); stalled: hollow",
    ]
    chart = alt.layer(spread, means, filled, hollow, data=points).properties(
        title=alt.Title(title_text, subtitle=subtitle), width=WIDTH, height=STUDY_HEIGHT
    )
    return neutral_legend_symbols(chart)  # the outcomes' shapes
