"""The chart controls Live and Compare share: smoothing, log scale, a metric to plot, and
what the x axis of every time-series chart shows (step, wall-clock time, tokens seen)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import streamlit as st

from blockviz.store import RunRecord
from blockviz.views import charts

SMOOTHING_DEFAULT = 0.6  # TensorBoard's default weight: noise damped, trends still sharp
SMOOTHING_LABEL = "Smoothing (EMA, as in TensorBoard)"


@dataclass(frozen=True)
class ChartControls:
    """What the controls are set to."""

    smoothing: float
    log_scale: bool
    metric: str | None  # None when there is no metric to choose


def chart_controls(
    key_prefix: str,
    metrics: Sequence[str],
    *,
    preferred: Sequence[str],
    metric_label: str = "Metric",
    widths: Sequence[int] = (3, 1, 3),
    gap: Literal["small", "medium", "large"] = "small",
) -> ChartControls:
    """One row: smoothing slider, log-scale toggle, metric picker; state under `key_prefix.*`.

    Each page passes its own prefix, so its controls keep their own values. The metric
    falls back to the first of `preferred` on offer (else the first metric) whenever the
    chosen one is not among `metrics`.
    """
    smoothing_key, log_key, metric_key = (
        f"{key_prefix}.smoothing",
        f"{key_prefix}.log_scale",
        f"{key_prefix}.metric",
    )
    # Defaults go into session state rather than the widgets' `value`: a page may have
    # set the key already (to keep it while the controls are not drawn), and Streamlit
    # logs a warning for a widget given both.
    st.session_state.setdefault(smoothing_key, SMOOTHING_DEFAULT)
    st.session_state.setdefault(log_key, False)
    if metrics and st.session_state.get(metric_key) not in metrics:
        offered = [name for name in preferred if name in metrics]
        st.session_state[metric_key] = (offered or list(metrics))[0]
    columns = st.columns(list(widths), vertical_alignment="bottom", gap=gap)
    smoothing = columns[0].slider(SMOOTHING_LABEL, 0.0, 0.99, step=0.01, key=smoothing_key)
    log_scale = columns[1].toggle("Log scale", key=log_key)
    metric = columns[2].selectbox(metric_label, metrics, key=metric_key) if metrics else None
    return ChartControls(float(smoothing), bool(log_scale), metric)


@dataclass(frozen=True)
class XChoice:
    """The x axis the charts use, and the note to show when a run could not follow it."""

    kind: str  # a key of charts.X_AXES
    axis: charts.XAxis
    clocks: charts.RunClocks
    note: str | None  # why the charts fell back to steps; None when they did not

    def place(self, frame: Any) -> Any:
        """The frame with the x column this axis draws (charts.with_x)."""
        return charts.with_x(frame, self.kind, self.clocks)


def x_axis_widget(key_prefix: str) -> None:
    """The x-axis control alone: step / wall-clock time / tokens seen (Live draws it in
    the sidebar, outside the part that refreshes; `x_axis_choice` reads it there)."""
    key = f"{key_prefix}.x_axis"
    st.session_state.setdefault(key, "step")
    st.segmented_control(
        "x axis",
        list(charts.X_AXES),
        format_func=charts.X_AXIS_LABELS.__getitem__,
        required=True,
        key=key,
    )


def x_axis_choice(key_prefix: str, runs: Sequence[RunRecord], scalars: Any) -> XChoice:
    """The x axis chosen under `key_prefix`, for these runs.

    `runs` are the runs drawn (rows with id, name and config) and `scalars` hold their
    train/elapsed_s records. When a run cannot be placed on the chosen axis (no elapsed
    time logged, no readable config) every chart falls back to steps, with a note naming
    the runs, so the runs stay on one common axis.
    """
    kind = st.session_state.get(f"{key_prefix}.x_axis", "step")
    kind = kind if kind in charts.X_AXES else "step"
    clocks = charts.run_clocks(runs, scalars)
    missing = clocks.missing(kind, [int(r.id) for r in runs])
    note = None
    if missing:
        names = {int(r.id): str(r.name) for r in runs}
        whose = "this run" if len(runs) == 1 else "run " + ", ".join(names[i] for i in missing)
        if kind == "time":
            what = charts.NO_TIME_NOTE.replace("this run", whose)
        else:
            what = f"the tokens per step of {whose} could not be read from its stored config"
        note = f"{what[:1].upper()}{what[1:]}; the charts show steps."
        kind = "step"
    return XChoice(kind, charts.X_AXES[kind], clocks, note)


def x_axis_control(key_prefix: str, runs: Sequence[RunRecord], scalars: Any) -> XChoice:
    """One segmented control for the whole page (`x_axis_widget`) and what it chose for
    these runs (`x_axis_choice`)."""
    x_axis_widget(key_prefix)
    return x_axis_choice(key_prefix, runs, scalars)
