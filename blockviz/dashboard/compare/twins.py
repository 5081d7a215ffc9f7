"""Compare's twins section: each chosen fork or replay as its differences from its parent.

A twin trained its parent's batches from its fork step on, changed only in the fields its
fork changed (`training.fork`), so `twin - parent` per step is what those fields did.
"""

from __future__ import annotations

import streamlit as st

from blockviz.core.forks import changes_text
from blockviz.dashboard import ui
from blockviz.store import RunStore, StoreError
from blockviz.store.records import RunRecord
from blockviz.views.charts.base import chart_data
from blockviz.views.charts.twins import TWIN_METRICS, difference_chart, differences


def change_text(twin: RunRecord) -> str:
    """'norm_position pre, lr 0.003' or 'no change' (a replay: 'probes every step')."""
    if twin.fork_kind == "replay":
        return "probes every step"
    return changes_text((twin.fork_info or {}).get("changes") or {})


def fork_steps(runs: list[RunRecord]) -> dict[int, int]:
    """run id -> fork step of each fork or replay among `runs` (its rows before it are copies)."""
    return {int(run.id): int(run.fork_step) for run in runs if run.fork_step is not None}


def forks_left_out(runs: list[RunRecord]) -> None:
    """Say which forks among `runs` the initialization chart leaves out, and why."""
    forked = [run for run in runs if run.fork_step is not None]
    if not forked:
        return
    listed = "; ".join(f"{run.name} (from step {int(run.fork_step):,})" for run in forked)
    st.caption(
        ui.plain(
            f"Left out, forks whose step-0 gradients are their parent's: {listed}. "
            "A fork's rows before its fork step are a copy of its parent's."
        )
    )


def twins_section(store: RunStore, runs: list[RunRecord]) -> None:
    """The differences of each chosen twin from its parent, from the fork step on."""
    twins = [run for run in runs if run.fork_step is not None]
    if not twins:
        return
    st.subheader("Twins: differences from the parent", anchor=False)
    names = {int(run.id): f"#{run.id} {run.name}" for run in twins}
    picked = st.selectbox("Twin", list(names), format_func=names.get, key="compare.twin")
    twin = next(run for run in twins if int(run.id) == picked)
    if twin.parent_id is None:
        st.info(f"{ui.plain(str(twin.name))}'s parent was deleted: nothing to subtract.")
        return
    try:
        parent = store.get_run(int(twin.parent_id))
    except StoreError:
        st.info("This twin's parent is not in the store any more.")
        return
    labels = [metric.label for metric in TWIN_METRICS]
    label = st.segmented_control(
        "Statistic", labels, default=labels[0], required=True, key="compare.twin.metric"
    )
    metric = next(m for m in TWIN_METRICS if m.label == label)
    ids = [int(parent.id), int(twin.id)]
    if metric.kind == "scalar":
        frames = [store.scalars(i) for i in ids]
    else:
        frames = [store.layer_stats(i, kind=metric.kind, stat=metric.stat) for i in ids]
    n_layer = int(((twin.config or {}).get("model") or {}).get("n_layer") or 0)
    step = int(twin.fork_step)
    frame = differences(frames[0], frames[1], step, metric, n_layer)
    chart = difference_chart(frame, metric, str(twin.name), str(parent.name))
    label_text = f"twin {twin.id} minus {parent.id} {metric.stat}"
    ui.chart_with_downloads(chart, chart_data(chart), label_text, "cmp.twin")
    st.caption(
        ui.plain(
            f"{twin.name} is a {twin.fork_kind} of {parent.name} from step {step:,} "
            f"({change_text(twin)}): the same batches and random draws from there on, so "
            "each line is what the change did. A fork with no change draws zero everywhere."
        )
    )
    sentence = (twin.fork_info or {}).get("sentence")
    if twin.fork_kind == "replay" and sentence:
        st.markdown(ui.plain(f"Replay: {sentence}"))
