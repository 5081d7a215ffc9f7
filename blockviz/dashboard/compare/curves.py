"""Compare's curves: the loss and a chosen metric of every chosen run, or of each seed group
as its mean and band."""

from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import streamlit as st

from blockviz.core.spec import LOSS_NAMES, TRAIN_ELAPSED_S, TRAIN_GRAD_NORM, VAL_BPC
from blockviz.dashboard import store_access, ui
from blockviz.dashboard.controls import XChoice, chart_controls, x_axis_control
from blockviz.store import RunRecord, RunStore
from blockviz.views import charts, seed_groups

MAX_POINTS = 800  # per series; the store keeps each bucket's min and max


@dataclass(frozen=True)
class Drawn:
    """The runs the curves were drawn from (read once, for the sections under them), their
    colour scale and the tag that names their downloads."""

    runs: list[RunRecord]
    colors: alt.Scale
    tag: str


def curves(store: RunStore, run_ids: list[int], seen: dict[int, str]) -> Drawn:
    """The loss and metric charts; reruns the page when a run was deleted or changed status."""
    store_access.reap_dead(store)
    all_runs = store.runs_frame()
    runs = all_runs[all_runs["id"].isin(run_ids)]
    if len(runs) < len(run_ids):
        ui.flash("warning", "A compared run was deleted; it was taken out of the comparison.")
        st.rerun()
    if ui.run_statuses(all_runs) != seen:
        # A status changed (finished, started, reaped): redraw the page once, so the
        # picker's labels and the refresh timer follow.
        st.rerun()
    colors = charts.run_color_scale(runs[["id", "name"]])
    tag = "-".join(str(i) for i in run_ids)

    st.subheader("Loss and metrics", anchor=False)
    names = store.scalar_names(run_ids)
    others = [n for n in names if n not in (*LOSS_NAMES, TRAIN_ELAPSED_S)] or list(names)
    chosen = chart_controls("compare", others, preferred=(VAL_BPC, TRAIN_GRAD_NORM))
    smoothing, log_scale, metric = chosen.smoothing, chosen.log_scale, chosen.metric
    elapsed = store.scalars(run_ids, names=TRAIN_ELAPSED_S)
    stored = [store.get_run(i) for i in run_ids]
    x = x_axis_control("compare", stored, elapsed)
    if x.note:
        st.caption(ui.plain(x.note))
    drawn = Drawn(stored, colors, tag)
    groups = seed_groups.seed_groups(stored)
    if any(len(members) > 1 for members in groups) and st.toggle(
        "Group seeds",
        key="compare.group_seeds",
        help="Runs whose configs differ only in the seed become one line: the mean at each "
        "step, with a band for its 95% t interval.",
    ):
        names_by_id = dict(zip(runs["id"].astype(int), runs["name"], strict=True))
        _grouped(store, run_ids, groups, names_by_id, smoothing, log_scale, metric, x, tag)
        return drawn
    loss_col, metric_col = st.columns(2, gap="large")
    with loss_col, ui.guard("Loss chart"):
        scalars = x.place(store.scalars(run_ids, names=LOSS_NAMES, max_points=MAX_POINTS))
        chart = charts.loss_chart(
            scalars, smoothing, log_scale, colors=colors, diverged=runs, x_axis=x.axis
        )
        ui.chart_with_downloads(chart, charts.chart_data(chart), f"compare loss {tag}", "cmp.loss")
    if metric is not None:
        with metric_col, ui.guard("Metric chart"):
            scalars = x.place(store.scalars(run_ids, names=metric, max_points=MAX_POINTS))
            chart = charts.metric_chart(
                scalars, metric, smoothing, log_scale, colors=colors, diverged=runs, x_axis=x.axis
            )
            label = f"compare {metric} {tag}"
            ui.chart_with_downloads(chart, charts.chart_data(chart), label, "cmp.metric")
    return drawn


def _grouped(
    store: RunStore,
    run_ids: list[int],
    groups: list[list[int]],
    names: dict[int, str],
    smoothing: float,
    log_scale: bool,
    metric: str | None,
    x: XChoice,
    tag: str,
) -> None:
    """The loss and metric charts with each seed group as one mean line and its band."""
    label_of = seed_groups.group_names(groups, names)
    sizes = [len(m) for m in groups]
    st.caption(
        f"{len(groups)} line(s) from {len(run_ids)} runs ("
        + ", ".join(f"{n} seed{'s' if n > 1 else ''}" for n in sizes)
        + "): each line is the mean over its runs at each step (after smoothing), the band "
        "its 95% t interval where two or more runs reached the step."
        + ("" if x.axis.field == "step" else " Grouped lines are drawn against steps.")
    )
    loss_col, metric_col = st.columns(2, gap="large")
    with loss_col, ui.guard("Grouped loss chart"):
        scalars = store.scalars(run_ids, names=LOSS_NAMES)
        bands = seed_groups.band_frame(scalars, label_of, LOSS_NAMES, smoothing)
        title = seed_groups.series_title(LOSS_NAMES)
        chart = seed_groups.band_chart(bands, "loss by seed group", title, log_scale, loss=True)
        ui.chart_with_downloads(chart, bands, f"compare loss groups {tag}", "cmp.gloss")
    if metric is not None:
        with metric_col, ui.guard("Grouped metric chart"):
            scalars = store.scalars(run_ids, names=metric)
            bands = seed_groups.band_frame(scalars, label_of, [metric], smoothing)
            title = seed_groups.series_title([metric])
            chart = seed_groups.band_chart(bands, f"{title} by seed group", title, log_scale)
            ui.chart_with_downloads(chart, bands, f"compare {metric} groups {tag}", "cmp.gmetric")
