"""Which runs Compare shows: the tag filter, the picker and its preselection."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from blockviz.core.spec import FINISHED_STATUSES
from blockviz.dashboard import store_access, tag_filter, ui
from blockviz.store import RunStore

PRESELECTED = 2  # runs picked when the page opens with none chosen


def preselected_runs(runs: pd.DataFrame, count: int = PRESELECTED) -> list[int]:
    """The runs Compare opens with: the latest finished ones (completed or diverged); runs
    cut short (stopped, failed) or still going fill in only when too few have finished."""
    finished = runs[runs["status"].isin(FINISHED_STATUSES)]
    picked = [int(i) for i in finished["id"].tail(count)]
    others = [int(i) for i in runs["id"] if int(i) not in picked]
    need = count - len(picked)
    fill = others[-need:] if need > 0 else []  # the latest of the rest
    return sorted(fill + picked)


def choose_runs(store: RunStore) -> tuple[pd.DataFrame, dict[int, str]] | None:
    """The chosen runs' rows (default: `preselected_runs`) and every run's status, as the
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
        st.session_state[ui.COMPARE_KEY] = preselected_runs(shown)
    chosen = ui.run_picker(
        store, "Runs to compare", multi=True, key="compare.runs", runs=shown, every_run=all_runs
    )
    if not chosen:
        st.info("Pick one or more runs above to overlay them.")
        return None
    # In the order picked, so tables and the report list runs as the user chose them.
    return all_runs.set_index("id").loc[chosen].reset_index(), ui.run_statuses(all_runs)
