"""Runs that differ only in their seed, grouped; a series per group as mean and 95% band.

Compare's "Group seeds" and a study's curves both draw one line per group: at each step,
the mean over the group's runs of the (optionally smoothed) value, with the 95% t interval
of that mean as a band where two or more runs reached the step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import altair as alt
import pandas as pd

from blockviz.core import spec
from blockviz.core.config import RunConfig
from blockviz.core.fields import ConfigError
from blockviz.core.studies.stats import mean_interval
from blockviz.views.charts.base import (
    HEIGHT,
    WIDTH,
    category_scale,
    dash_legend,
    ema,
    is_smoothed,
    no_data,
    wrapped_legend,
    x_axis_encoding,
)
from blockviz.views.charts.series import ceiling_note, clamped_scale, loss_ceiling

if TYPE_CHECKING:
    from blockviz.store import RunRecord

BAND_NOTE = "line: mean over seeds; band: 95% t interval of that mean"
BAND_COLUMNS = ["group", "name", "step", "mean", "low", "high", "n"]
MANY_GROUPS = 6  # more lines than this: fainter bands, the legend under the chart


def seed_groups(runs: Sequence[RunRecord]) -> list[list[int]]:
    """Run ids grouped by config with the seed left out, in the order first seen.

    A run whose config cannot be read is a group of its own; so is a run with no partner,
    and a fork or replay (it shares its parent's data and seed, so it is no second seed).
    """
    groups: dict[str, list[int]] = {}
    for run in runs:
        if getattr(run, "fork_step", None) is not None:  # a twin repeats its parent's seed
            groups[f"twin {run.id}"] = [int(run.id)]
            continue
        try:
            parsed = RunConfig.from_dict(run.config)  # type: ignore[arg-type]  # None: refused
        except (ConfigError, TypeError, ValueError):
            groups[f"unreadable {run.id}"] = [int(run.id)]
            continue
        parsed.train.seed = 0
        parsed.model.vocab_size = 0  # set from the data when the run starts
        groups.setdefault(parsed.to_json(), []).append(int(run.id))
    return list(groups.values())


def group_names(groups: list[list[int]], names: Mapping[int, str]) -> dict[int, str]:
    """Run id -> its group's label: the first run's name, and "(n seeds)" for a group."""
    out = {}
    for members in groups:
        first = names.get(members[0], str(members[0]))
        label = f"{first} ({len(members)} seeds)" if len(members) > 1 else first
        out.update({run_id: label for run_id in members})
    return out


def band_frame(
    scalars: pd.DataFrame,
    label_of: Mapping[int, str],
    names: Sequence[str] | None = None,
    smoothing: float = 0.0,
) -> pd.DataFrame:
    """Per group, series name and step: mean, low and high of the 95% t interval (NaN with
    one run), and n. Each run's series is smoothed first (`ema`, not val/* series); values
    that are not finite are left out, so a diverged run counts until it blew up."""
    if scalars.empty:
        return pd.DataFrame(columns=BAND_COLUMNS)
    rows = scalars if names is None else scalars[scalars["name"].isin(names)]
    rows = rows[rows["run_id"].isin(list(label_of))].copy()
    if rows.empty:
        return pd.DataFrame(columns=BAND_COLUMNS)
    if smoothing:
        parts = []
        for (_, name), series in rows.groupby(["run_id", "name"], sort=False):
            series = series.sort_values("step")
            if is_smoothed(str(name), len(series)):
                series = series.assign(value=ema(series["value"], smoothing))
            parts.append(series)
        rows = pd.concat(parts, ignore_index=True)
    rows["group"] = rows["run_id"].map(label_of)
    out = []
    for (group, name, step), at in rows.groupby(["group", "name", "step"], sort=False):
        interval = mean_interval(at["value"])
        if interval is None:
            continue
        spread = interval.n > 1
        low = interval.low if spread else math.nan
        high = interval.high if spread else math.nan
        out.append((group, name, int(step), interval.mean, low, high, interval.n))
    order = {g: i for i, g in enumerate(dict.fromkeys(label_of.values()))}
    frame = pd.DataFrame(out, columns=BAND_COLUMNS)
    frame["_order"] = frame["group"].map(order)
    frame = frame.sort_values(["_order", "name", "step"]).drop(columns="_order")
    return frame.reset_index(drop=True)


def band_chart(
    bands: pd.DataFrame, title: str, y_title: str, log_scale: bool = False, loss: bool = False
) -> alt.TopLevelMixin:
    """One line per group (dashed for a second series name), a band where n >= 2. For a
    `loss` chart on a linear axis, the axis stops short of a group that blew up (as the
    loss chart does for a run) and the subtitle says so; the frame (the CSV) stays raw."""
    if bands.empty:
        return no_data(bands, title)
    groups = list(dict.fromkeys(bands["group"]))
    y_scale = alt.Scale(type="log") if log_scale else alt.Scale(zero=False)
    cut = None if log_scale or not loss else loss_ceiling(bands, "group", ("mean", "high"))
    subtitle = [BAND_NOTE]
    if cut is not None:
        y_scale = clamped_scale(cut)
        subtitle += ceiling_note(cut, "groups")
    x = x_axis_encoding(frame=bands)
    base = alt.Chart(bands)
    series = sorted(bands["name"].unique())
    dash = alt.StrokeDash(
        "name:N", title="series", sort=series, legend=None if len(series) < 2 else dash_legend()
    )
    many = len(groups) > MANY_GROUPS
    # One colour encoding for band and line, so Vega-Lite draws one legend (a layer with
    # legend=None hides the merged one); its symbols opaque, whatever the band's opacity.
    color = alt.Color(
        "group:N",
        title="group",
        sort=groups,
        scale=category_scale(groups),
        legend=wrapped_legend(symbolLimit=40),
    )
    band = (
        base.transform_filter("isValid(datum.low) && isFinite(datum.low)")
        .mark_area(opacity=0.07 if many else 0.2)
        .encode(
            x=x,
            y=alt.Y("low:Q", title=y_title, scale=y_scale),
            y2="high:Q",
            color=color,
            detail="name:N",
        )
    )
    tooltip = [
        alt.Tooltip("group:N"),
        alt.Tooltip("name:N", title="series"),
        alt.Tooltip("step:Q", format=",d"),
        alt.Tooltip("mean:Q", format=".4f"),
        alt.Tooltip("low:Q", format=".4f"),
        alt.Tooltip("high:Q", format=".4f"),
        alt.Tooltip("n:Q", title="runs"),
    ]
    line = base.mark_line().encode(
        x=x,
        y=alt.Y("mean:Q", title=y_title, scale=y_scale),
        color=color,
        strokeDash=dash,
        tooltip=tooltip,
    )
    # The points without the dash: the dash legend then draws strokes (see dash_legend).
    points = base.mark_point(filled=True, size=25).encode(
        x=x, y=alt.Y("mean:Q", title=y_title, scale=y_scale), color=color, tooltip=tooltip
    )
    return alt.layer(band, line, points, data=bands).properties(
        title=alt.Title(title, subtitle=subtitle), width=WIDTH, height=HEIGHT
    )


def series_title(names: Sequence[str]) -> str:
    """The y title of a grouped chart: the series' axis title, or "loss" for loss pairs."""
    if all(n in spec.LOSS_NAMES for n in names):
        return spec.scalar_label(spec.VAL_LOSS)
    return spec.SCALARS.get(names[0], names[0]) if names else "value"
