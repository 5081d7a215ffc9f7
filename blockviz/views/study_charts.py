"""A study's charts: loss curves by variant with seed bands, and final loss against the
swept value with each run's outcome marked (Altair; tidy frames in, charts out)."""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.views.charts.base import HEIGHT, WIDTH, _no_data
from blockviz.views.seed_groups import band_chart, band_frame

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


def curves_chart(
    scalars: pd.DataFrame, results: pd.DataFrame, metric: str = "val/loss"
) -> alt.TopLevelMixin:
    """The metric against step, one line per variant (the mean over its seeds) with a
    band (the 95% t interval of that mean where two or more seeds reached the step)."""
    label = spec.SCALARS.get(metric, metric)
    variant_of = {
        int(r): str(v) for r, v in zip(results["run_id"], results["variant"], strict=True)
    }
    bands = band_frame(scalars, variant_of, [metric])
    return band_chart(bands, f"{label} by variant", label)


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
    results: pd.DataFrame, field: str, log_x: bool = False, by: str | None = None
) -> alt.TopLevelMixin:
    """Final val loss against a swept value: each run a point shaped by its outcome
    (converged filled, stalled hollow, diverged a cross and blown-up a triangle at the
    top), a line through the mean of the converged and stalled runs at each value, one
    line per value of `by`."""
    title_text = f"final val loss against {field}"
    frame = results.copy()
    by = by if by and by in frame.columns and by != field else None
    frame["swept:group"] = frame[by].astype(str) if by else "runs"
    points = swept_points(frame, field)
    if points.empty:
        return _no_data(points, title_text)
    kind = "Q"
    x_scale = alt.Scale(type="log") if log_x else alt.Scale(zero=False)
    x = alt.X(f"{field}:{kind}", title=field, scale=x_scale)
    y = alt.Y("loss:Q", title="final val loss (nats)", scale=alt.Scale(zero=False))
    color = alt.Color("group:N", title=by or "", legend=None if not by else alt.Legend())
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
        alt.Tooltip("group:N", title=by or "group"),
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
    means = (
        base.transform_filter(" && ".join(f"datum.outcome != '{outcome}'" for outcome in OFF_SCALE))
        .transform_aggregate(loss="mean(loss)", groupby=[field, "group"])
        .mark_line(opacity=0.7)
        .encode(x=x, y=y, color=color)
    )
    subtitle = (
        "diverged runs: crosses at the top (no finite loss); blew up: triangles at the top "
        "(above the uniform guess); stalled: hollow"
    )
    return alt.layer(means, filled, hollow, data=points).properties(
        title=alt.Title(title_text, subtitle=subtitle), width=WIDTH, height=HEIGHT
    )
