"""Compare's gradient norm by layer: at initialization and at a chosen later probe step, one
line per run, with sentences computed from the numbers drawn."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from blockviz.core.spec import COMPONENTS, GRAD_NORM
from blockviz.dashboard import ui
from blockviz.dashboard.compare import twins
from blockviz.store import RunRecord, RunStore
from blockviz.views import charts, grad_by_layer_text, run_facts


def grad_by_layer(store: RunStore, stored: list[RunRecord], colors: alt.Scale, tag: str) -> None:
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
    st.caption(ui.plain(grad_by_layer_text.PAPER_CLAIM))


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


def _run_shapes(stored: list[RunRecord]) -> dict[int, grad_by_layer_text.RunShape]:
    """Name, depth and norm position of each run whose stored config can be read."""
    shapes = {}
    for run in stored:
        model = run_facts.stored_model_config(run)
        if model is not None:
            shapes[int(run.id)] = grad_by_layer_text.RunShape(
                str(run.name), model.n_layer, model.norm_position
            )
    return shapes


def _findings(
    grads: pd.DataFrame, shapes: dict[int, grad_by_layer_text.RunShape], step: int, component: str
) -> None:
    """What the chart above shows, in sentences computed from its numbers (as plain text)."""
    sentences = grad_by_layer_text.grad_by_layer_sentences(grads, shapes, step, component)
    if sentences:
        st.caption("\n\n".join(ui.plain(sentence) for sentence in sentences))
