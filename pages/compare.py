"""Compare: overlay runs — loss and any metric, config diff, final metrics, gradient by layer.

The curves, the final-metrics table and the gradient picture refresh every 1.5 s while any
chosen run is still queued or running; when any run's status changes the whole page reruns
once, so the picker's labels show the statuses the table shows. The report button builds
the zip only when clicked (in a background thread of the download) and the page shows its
progress meanwhile. Under the gradient-by-layer charts, sentences computed from the runs
drawn (views/findings_text.py) replace any fixed text; the paper's claim is a caption of
its own, labelled as a claim.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from blockviz.core.spec import (
    ACTIVE_STATUSES,
    COMPONENTS,
    GRAD_NORM,
    LOSS_NAMES,
    TRAIN_ELAPSED_S,
    TRAIN_GRAD_NORM,
    VAL_BPC,
)
from blockviz.dashboard import store_access, tables, tag_filter, twins, ui
from blockviz.dashboard.controls import chart_controls, preselected_runs, x_axis_control
from blockviz.store import RunRecord, RunStore, StoreError
from blockviz.views import charts, findings_text, run_findings, seed_groups, summary
from blockviz.views.export.report import LABEL_ROWS, build_report, config_diff_table, report_name
from blockviz.views.export.report_job import ReportJob

REFRESH_S = 1.5
POLL_S = 0.5
MAX_POINTS = 800  # per series; the store keeps each bucket's min and max
REPORT_JOB_KEY = "compare.report_job"
PRESELECTED = 2  # runs picked when the page opens with none chosen
FINDINGS_COLUMN = st.column_config.TextColumn(
    "findings",
    help="The run's headline and each warning of its findings (Live shows them in full)",
)


# ---------------------------------------------------------------------------- curves


def _curves(store: RunStore, run_ids: list[int], seen: dict[int, str]) -> None:
    """Everything that moves while a chosen run trains; a fragment while one is active."""
    with ui.guard("Comparison"):
        _draw_curves(store, run_ids, seen)


def _draw_curves(store: RunStore, run_ids: list[int], seen: dict[int, str]) -> None:
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
    groups = seed_groups.seed_groups(stored)
    if any(len(members) > 1 for members in groups) and st.toggle(
        "Group seeds",
        key="compare.group_seeds",
        help="Runs whose configs differ only in the seed become one line: the mean at each "
        "step, with a band for its 95% t interval.",
    ):
        names_by_id = dict(zip(runs["id"].astype(int), runs["name"], strict=True))
        _grouped(store, run_ids, groups, names_by_id, smoothing, log_scale, metric, x, tag)
        _after_curves(store, stored, colors, tag)
        return
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

    _after_curves(store, stored, colors, tag)


def _grouped(
    store: RunStore,
    run_ids: list[int],
    groups: list[list[int]],
    names: dict[int, str],
    smoothing: float,
    log_scale: bool,
    metric: str | None,
    x: Any,
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


def _after_curves(store: RunStore, stored: list[RunRecord], colors: Any, tag: str) -> None:
    """Under the curves: twins, final metrics, gradient by layer (of the runs read above)."""
    run_ids = [int(run.id) for run in stored]
    with ui.guard("Twins"):
        twins.twins_section(store, stored)
    st.subheader("Final metrics", anchor=False)
    with ui.guard("Final metrics"):
        final = tables.final_table(store, run_ids)
        by_name = {
            run.name: run_findings.titles_text(run_findings.cached_findings(store, run))
            for run in stored
        }
        final["findings"] = [by_name.get(name, "") for name in final["run"]]
        config = {**tables.final_column_config(final["run"]), "findings": FINDINGS_COLUMN}
        st.dataframe(final, hide_index=True, column_config=config)

    _grad_by_layer(store, stored, colors, tag)


def _grad_by_layer(store: RunStore, stored: list[RunRecord], colors: Any, tag: str) -> None:
    """Gradient norm vs depth at step 0 and at a chosen later probe step, one line per run."""
    run_ids = [int(run.id) for run in stored]
    st.subheader("Gradient norm by layer", anchor=False)
    st.session_state.setdefault("compare.component", "block")
    # Steps first, then only the steps drawn (0, and each run's probe step nearest the
    # chosen one): reading every probe step of 20 runs would cost more than the rest of
    # the page.
    per_run = [set(store.layer_steps(i, "component", GRAD_NORM)) for i in run_ids]
    steps = sorted(set().union(*per_run) - {0})
    controls = st.columns(2, gap="large", vertical_alignment="bottom")
    component = controls[0].segmented_control(
        "Component", COMPONENTS, required=True, key="compare.component"
    )
    step = None
    if steps:
        common = sorted(set.intersection(*per_run) - {0})
        if st.session_state.get("compare.grad_step") not in steps:
            # The latest step every run has reached, so all lines compare like with like.
            st.session_state["compare.grad_step"] = (common or steps)[-1]
        if len(steps) > 1:
            step = controls[1].select_slider("Later step", steps, key="compare.grad_step")
        else:
            step = steps[0]
    # A fork's rows before its fork step are its parent's copy (another config's): drawn
    # neither at initialization nor as the fork at a later step.
    forked = twins.fork_steps(stored)
    at_init = store.layer_stats(run_ids, "component", GRAD_NORM, 0, component=component)
    at_init = at_init[~at_init["run_id"].isin(list(forked))]
    # Each run at its probe step nearest the chosen one, never step 0 (the left chart's).
    later_steps = {
        i: sorted(s for s in steps_of if s and s >= forked.get(i, 0))
        for i, steps_of in zip(run_ids, per_run, strict=True)
    }
    nearest = {} if step is None else charts.nearest_probe_steps(later_steps, step)
    later = _layer_stats_at(store, nearest, component)
    shapes = _run_shapes(stored)
    depths = {run_id: shape.n_layer for run_id, shape in shapes.items()}
    init_col, later_col = st.columns(2, gap="large")
    with init_col, ui.guard("Gradient by layer at initialization"):
        chart = charts.grad_by_layer_chart(at_init, 0, component, colors=colors, n_layers=depths)
        label = f"compare grad by layer init {tag}"
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "cmp.grad0")
        _findings(at_init, {i: s for i, s in shapes.items() if i not in forked}, 0, component)
        twins.forks_left_out(stored)
    with later_col, ui.guard("Gradient by layer later"):
        if step is None:
            st.info("Only step 0 is logged so far; later probe steps appear here.")
        else:
            chart = charts.grad_by_layer_chart(
                later, step, component, colors=colors, n_layers=depths
            )
            label = f"compare grad by layer step {step} {tag}"
            ui.chart_with_downloads(chart, charts.chart_data(chart), label, "cmp.gradN")
            _not_at_step(store, run_ids, nearest, step)
            _findings(later, shapes, step, component)
    st.caption(ui.plain(findings_text.PAPER_CLAIM))


def _layer_stats_at(store: RunStore, steps: dict[int, int], component: str) -> pd.DataFrame:
    """Each run's gradient norms by layer at its own step of `steps`: one read per step."""
    by_step: dict[int, list[int]] = {}
    for run_id, run_step in steps.items():
        by_step.setdefault(run_step, []).append(run_id)
    parts = [
        store.layer_stats(ids, "component", GRAD_NORM, s, component=component)
        for s, ids in sorted(by_step.items())
    ]
    if not parts:
        return store.layer_stats([], "component", GRAD_NORM, component=component)
    return pd.concat(parts, ignore_index=True)


def _not_at_step(store: RunStore, run_ids: list[int], nearest: dict[int, int], step: int) -> None:
    """Which runs the later chart draws at another step, or leaves out, and why."""
    names = _run_names(store, run_ids)
    elsewhere = [
        f"{ui.plain(names[i])} at step {nearest[i]}"
        for i in run_ids
        if i in nearest and nearest[i] != step and i in names
    ]
    missing = [ui.plain(names[i]) for i in run_ids if i not in nearest and i in names]
    lines = []
    if elsewhere:
        lines.append(
            f"No probe at step {step}, so drawn at the nearest probe step: "
            + "; ".join(elsewhere)
            + "."
        )
    if missing:
        lines.append(
            "Left out, no probe after step 0 yet (step 0 is on the initialization chart): "
            + "; ".join(missing)
            + "."
        )
    if lines:
        st.caption("\n\n".join(lines))


def _run_names(store: RunStore, run_ids: list[int]) -> dict[int, str]:
    """run id -> name of the runs still in the store."""
    runs = store.runs_frame()
    runs = runs[runs["id"].isin(run_ids)]
    return dict(zip(runs["id"].astype(int), runs["name"].astype(str), strict=True))


def _run_shapes(stored: list[RunRecord]) -> dict[int, findings_text.RunShape]:
    """Name, depth and norm position of each run whose stored config can be read."""
    shapes = {}
    for run in stored:
        model = summary.stored_model_config(run)
        if model is not None:
            shapes[int(run.id)] = findings_text.RunShape(
                str(run.name), model.n_layer, model.norm_position
            )
    return shapes


def _findings(
    grads: pd.DataFrame, shapes: dict[int, findings_text.RunShape], step: int, component: str
) -> None:
    """What the chart above shows, in sentences computed from its numbers (as plain text)."""
    sentences = findings_text.grad_by_layer_sentences(grads, shapes, step, component)
    if sentences:
        st.caption("\n\n".join(ui.plain(sentence) for sentence in sentences))


# ---------------------------------------------------------------------------- config diff


def _config_section(store: RunStore, run_ids: list[int]) -> None:
    st.subheader("Config differences", anchor=False)
    if len(run_ids) < 2:
        st.info("Pick a second run to see which config fields differ.")
        return
    runs = []
    for run_id in run_ids:
        try:
            runs.append(store.get_run(run_id))
        except StoreError:
            continue  # deleted meanwhile; the curves above say so
    headers, rows = config_diff_table(runs)
    compared = len(headers) - 1  # runs whose config could be read
    if compared < len(runs):
        st.warning("Some runs are left out of the diff: their stored config is unreadable.")
    if compared >= 2 and all(row[0] in LABEL_ROWS for row in rows):
        ids = {int(run.id) for run in runs}
        if any(run.parent_id in ids for run in runs):
            st.success(
                "These runs have identical configs, and one is a fork of another with no "
                "change: from its fork step on it repeats its parent exactly (the twins "
                "section draws the difference)."
            )
        else:
            st.success("These runs have identical configs: any difference is run-to-run noise.")
    if rows:
        st.caption("Only the fields whose values are not the same in every chosen run.")
        st.dataframe(pd.DataFrame(rows, columns=headers), hide_index=True, key="compare.diff")


# ---------------------------------------------------------------------------- report


def _report_job() -> ReportJob:
    """This session's report job (shared with the download's worker thread)."""
    job = st.session_state.get(REPORT_JOB_KEY)
    if not isinstance(job, ReportJob):
        job = ReportJob()
        st.session_state[REPORT_JOB_KEY] = job
    return job


def _report_progress(
    job: ReportJob, run_ids: list[int], file_name: str, was_building: bool
) -> None:
    """Progress of the report being built (polled while it builds), then the built zip.

    Once built, the zip is also offered as an ordinary download of the same bytes, name and
    type. Besides letting a user save it again without a rebuild, that keeps the click's
    own file alive: Streamlit drops a generated download that no element of the session
    refers to after two script runs (this timer's and the redraw's), and identical bytes,
    name and type are one file to it.
    """
    status = job.status()
    if status.building:
        text = f"Building the report… {ui.plain(status.message)}".strip()
        st.progress(status.fraction, text=text)
        return
    if status.error:
        st.error(f"The report could not be built: {ui.plain(status.error)}")
    built = job.result(run_ids)
    if built is not None:
        st.success(f"Report built ({len(built) / 1e6:.1f} MB); your browser saves the zip.")
        st.download_button(
            "Save the report again",
            data=built,
            file_name=file_name,
            mime="application/zip",
            key="compare.report.saved",
            icon=":material/download:",
            on_click="ignore",
        )
    if was_building:
        st.rerun()  # done: redraw once without the timer


def _report_section(store: RunStore, run_ids: list[int], names: list[str]) -> None:
    st.subheader("Report", anchor=False)
    st.caption(
        "One zip: every chart as PNG and SVG (each run's attention maps at its latest "
        "recorded step included), the configs, the generated samples, all scalars as CSV, "
        "the final metrics as CSV, Markdown and LaTeX, and a self-contained HTML report."
    )
    job = _report_job()
    st.download_button(
        "Download report (zip)",
        data=job.builder(lambda progress: build_report(store, run_ids, progress=progress), run_ids),
        file_name=report_name(names),
        mime="application/zip",
        key="compare.report",
        type="primary",
        icon=":material/folder_zip:",
        on_click=job.request,
    )
    building = job.building()
    st.fragment(_report_progress, run_every=POLL_S if building else None)(
        job, run_ids, report_name(names), building
    )


# ---------------------------------------------------------------------------- the page


def _choose_runs(store: RunStore) -> tuple[pd.DataFrame, dict[int, str]] | None:
    """The chosen runs' rows (default: `controls.preselected_runs`) and every run's status, as the
    picker shows them; a word when there are none."""
    store_access.reap_dead(store)
    all_runs = store.runs_frame()
    if all_runs.empty:
        st.info(
            "No runs to compare yet — train two runs that differ in one choice (Pre-LN vs "
            "Post-LN, say): set each up in the sidebar and press Launch, then come back here."
        )
        return None
    # Tags: the picker offers only the runs with every chosen tag; auto-runs on request.
    shown = tag_filter.tag_filter(all_runs, "compare.filter")
    if ui.COMPARE_KEY not in st.session_state:
        st.session_state[ui.COMPARE_KEY] = preselected_runs(shown, PRESELECTED)
    chosen = ui.run_picker(
        store, "Runs to compare", multi=True, key="compare.runs", runs=shown, every_run=all_runs
    )
    if not chosen:
        st.info("Pick one or more runs above to overlay them.")
        return None
    # In the order picked, so tables and the report list runs as the user chose them.
    return all_runs.set_index("id").loc[chosen].reset_index(), ui.run_statuses(all_runs)


store = store_access.store_or_stop()
st.title("Compare")
ui.show_flashes()
store_access.store_notice(store)
picked: pd.DataFrame | None = None
seen: dict[int, str] = {}
with ui.guard("Reading the run store"):
    choice = _choose_runs(store)
    if choice is not None:
        picked, seen = choice
if picked is not None:
    chosen = [int(i) for i in picked["id"]]
    any_active = bool(picked["status"].isin(ACTIVE_STATUSES).any())
    st.fragment(_curves, run_every=REFRESH_S if any_active else None)(store, chosen, seen)
    with ui.guard("Config differences"):
        _config_section(store, chosen)
    with ui.guard("Report"):
        _report_section(store, chosen, [str(name) for name in picked["name"]])
