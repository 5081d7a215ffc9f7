"""Live: one run as it trains — findings, status, loss, gradients, activations, updates,
attention, samples.

While the run is queued or running, everything below the run picker is a fragment that
reruns every 1.5 s on its own (the rest of the page and the sidebar stay put). Only the open
tab reads and draws; the per-step series are kept in session state and extended with the
rows logged since the last refresh instead of being read whole every time. When any run's
status changes (queued -> running, a dead run reaped as failed) the whole page reruns once,
so the picker's labels and the header always show the same status.

Under the header, the findings panel says in words what the series show (core.findings),
evaluated again at most every 5 s while it trains; Show opens the tab that draws a finding and
marks its step on every chart of the page. The page lays out; its parts live in
`blockviz.dashboard.live` (state and session keys, header and findings, the tabs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pandas as pd
import streamlit as st

from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.dashboard import relaunch, store_access, ui
from blockviz.dashboard.code_download import code_download_button
from blockviz.dashboard.controls import x_axis_choice, x_axis_widget
from blockviz.dashboard.findings_panel import scroll_token
from blockviz.dashboard.fork_panel import fork_caption, fork_panel, started_notice
from blockviz.dashboard.live.header import (
    facts_sidebar,
    findings_block,
    header,
    status_message,
)
from blockviz.dashboard.live.state import (
    CHARTS_KEY,
    FIRST_POINT_REFRESH_S,
    FIRST_SEEN_KEY,
    PREFERENCES,
    REFRESH_S,
    TAB_KEY,
    TABS,
    has_loss,
    reader,
)
from blockviz.dashboard.live.tabs import (
    activations_tab,
    attention_tab,
    gradients_tab,
    loss_tab,
    samples_tab,
    updates_tab,
)
from blockviz.launch import runner
from blockviz.store import RunStore, StoreError


def _live(store: RunStore, run_id: int, seen: dict[int, str], waiting_first: bool = False) -> None:
    """Everything that changes while the run trains; a fragment while it is active.

    `seen` is the status of every run as the picker above shows it. When the store says
    otherwise, the whole page reruns, so the picker's labels, the header and the refresh
    timer follow the change.
    """
    store_access.reap_dead(store)
    try:
        run = store.get_run(run_id)
    except StoreError:
        ui.flash("warning", f"Run #{run_id} was deleted while it was open here.")
        ui.select_run(None)
        st.rerun()
    runs = store.runs_frame()
    fresh = ui.run_statuses(runs)
    if fresh != seen:
        st.rerun()
    run = replace(run, status=fresh[run_id])  # what the picker shows, unchanged since read
    shown = runner.shown_in(runs)[run_id]  # the word the picker shows: queued -> starting
    for key, default in PREFERENCES.items():
        # Re-assigning keeps a control's value while its tab is closed (Streamlit would
        # otherwise forget the state of widgets that were not drawn).
        st.session_state[key] = st.session_state.get(key, default)
    scalars: pd.DataFrame | None = None
    with ui.guard("Run header"):
        scalars = reader().scalars(store, run_id)
        header(store, run, scalars, shown)
        fork_caption(store, run)
        status_message(store, run, scalars, shown)
    if scalars is not None:
        with ui.guard("Findings"):
            findings_block(run, store, scalars)
    if scalars is None:
        return  # the store could not be read; the message above says why
    if waiting_first and has_loss(scalars):
        # The first loss is here: once per run, rerun at the ordinary refresh.
        st.session_state.setdefault(FIRST_SEEN_KEY, set()).add(run_id)
        st.rerun()
    x = x_axis_choice("live", [run], scalars)
    if x.note:
        st.caption(ui.plain(x.note))
    charts_box = st.container(key=CHARTS_KEY)
    if (token := scroll_token()) is not None:  # a finding's Show: its tab is open
        ui.scroll_into_view(CHARTS_KEY, token)  # brought into view once per click
    tabs = charts_box.tabs(TABS, key=TAB_KEY, on_change="rerun")
    renderers: dict[str, Callable[[], None]] = {
        "Loss": lambda: loss_tab(run, scalars, x),
        "Gradients": lambda: gradients_tab(store, run, scalars, x),
        "Activations": lambda: activations_tab(store, run, x),
        "Updates": lambda: updates_tab(store, run, x),
        "Attention": lambda: attention_tab(store, run, x),
        "Samples": lambda: samples_tab(store, run),
    }
    for label, tab in zip(TABS, tabs, strict=True):
        if tab.open is False:
            continue  # only the open tab reads and draws
        with tab, ui.guard(f"{label} tab"):
            renderers[label]()


def _pick_run(store: RunStore) -> tuple[int, dict[int, str]] | None:
    """The run to show (picked in the sidebar) and every run's status as the picker shows
    it; a word when there is none."""
    store_access.reap_dead(store)
    runs = store.runs_frame()
    if runs.empty:
        st.title("Live")
        st.info(
            "No runs yet — set up a block in the sidebar and press Launch on the Train page. "
            "The run appears here and updates as it trains."
        )
        return None
    notice = ui.selection_notice(runs)
    if notice:
        st.warning(ui.plain(notice))
    with st.sidebar:
        selected = ui.run_picker(store, "Run", multi=False, key="live.run", runs=runs)
    if selected is None:
        st.title("Live")
        st.info("Pick a run in the sidebar.")
        return None
    if runs.loc[runs["id"] == selected, "train_loss"].notna().any():
        st.session_state.setdefault(FIRST_SEEN_KEY, set()).add(selected)
    return selected, ui.run_statuses(runs)


def _sidebar(store: RunStore, run_id: int) -> None:
    """Under the picker: Edit & relaunch, Resume, Export as code, Fork or replay, the run's
    fixed facts and the x axis, so the page itself opens on the run's charts."""
    x_axis_widget("live")
    # Edit & relaunch / Resume (as on Runs); a just-resumed run refreshes until it starts.
    with ui.guard("Run actions"):
        run = store.get_run(run_id)
        relaunch.action_row(store, run, "live", store_access.writable(store))
        code_download_button(run.config, str(run.name), key="live.code")
    with ui.guard("Fork or replay"):
        fork_panel(store, run, store_access.writable(store))
    with ui.guard("Run facts"):
        facts_sidebar(run, store)


store = store_access.store_or_stop()
ui.show_flashes()
store_access.store_notice(store)
picked: tuple[int, dict[int, str]] | None = None
with ui.guard("Reading the run store"):
    picked = _pick_run(store)
if picked is not None:
    run_id, seen = picked
    active = seen.get(run_id) in ACTIVE_STATUSES
    with st.sidebar:
        _sidebar(store, run_id)
    active = active or relaunch.recently_resumed()
    with ui.guard("New twin"):
        started_notice(store, run_id)
    # Quick looks until the first loss arrives (then `_live` reruns the page at REFRESH_S).
    waiting_first = active and run_id not in st.session_state.get(FIRST_SEEN_KEY, set())
    every = FIRST_POINT_REFRESH_S if waiting_first else REFRESH_S
    st.fragment(_live, run_every=every if active else None)(store, run_id, seen, waiting_first)
