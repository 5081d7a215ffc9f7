"""Runs: every run in the store; open, compare, rename, tag, relaunch, resume, stop or delete one.

While any run is queued or running (or one was just resumed), the table is a fragment that
refreshes every REFRESH_S seconds; when the last one ends the page reruns once and stops.
"""

import time

import pandas as pd
import streamlit as st

from blockviz import runner
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.dashboard import relaunch, run_actions, store_access, tables, tag_filter, ui
from blockviz.dashboard.code_download import code_download_button
from blockviz.store import RunStore, StoreError

REFRESH_S = 2.0
FILTER_KEY = "runs.filter"
WAS_ACTIVE_KEY = "runs.was_active"


def _moving(runs: pd.DataFrame) -> bool:
    """Whether a shown run is queued or running, or one was resumed and may start soon."""
    return bool(runs["status"].isin(ACTIVE_STATUSES).any()) or relaunch.recently_resumed()


def _table(run_store: RunStore, wanted: list[str], show_auto: bool) -> None:
    """The runs table, read afresh: a fragment on a timer while a run is active."""
    with ui.guard("Run list"):
        store_access.reap_dead(run_store)
        everything = run_store.runs_frame()
        fresh = tag_filter.select_runs(everything, wanted, show_auto)
        moving = _moving(fresh)
        if st.session_state.get(WAS_ACTIVE_KEY) and not moving:
            st.session_state[WAS_ACTIVE_KEY] = False
            st.rerun(scope="app")  # the last run ended: redraw once, without the timer
        st.session_state[WAS_ACTIVE_KEY] = moving
        st.dataframe(
            tables.runs_table(fresh.iloc[::-1], time.time(), store_runs=everything),
            hide_index=True,
            width="stretch",
            column_config=tables.RUNS_COLUMN_CONFIG,
        )


store = store_access.store_or_stop()
st.title("Runs")
ui.show_flashes()
store_access.store_notice(store)
writable = store_access.writable(store)
write_help = None if writable else store_access.READONLY_NOTICE

all_runs: pd.DataFrame | None = None
with ui.guard("Run list"):
    store_access.reap_dead(store)
    all_runs = store.runs_frame()
if all_runs is None:
    st.stop()
if all_runs.empty:
    st.info("No runs yet — set up a block in the sidebar and press Launch on the Train page.")
    st.stop()

runs = tag_filter.tag_filter(all_runs, FILTER_KEY)
counts = all_runs["status"].value_counts()
hidden = len(all_runs) - len(runs)
st.caption(
    f"{len(all_runs)} run(s) in {ui.literal(store.path)}: "
    + ", ".join(f"{counts[s]} {s}" for s in counts.index)
    + (f"; {hidden} hidden by the filter above." if hidden else ".")
)
any_active = _moving(runs)
st.session_state[WAS_ACTIVE_KEY] = any_active
st.fragment(_table, run_every=REFRESH_S if any_active else None)(
    store,
    list(st.session_state.get(f"{FILTER_KEY}.tags") or []),
    bool(st.session_state.get(f"{FILTER_KEY}.auto")),
)
if runs.empty:
    st.info("No run passes the filter above.")
    st.stop()

st.subheader("Act on a run")
notice = ui.selection_notice(all_runs)  # a run hidden by the filter is not "missing"
if notice:
    st.warning(ui.plain(notice))
run_id = ui.run_picker(store, "Run", multi=False, key="runs.pick", runs=runs)
if run_id is None:
    st.stop()

with ui.guard("Run actions"):
    run = store.get_run(run_id)
    active = run["status"] in ACTIVE_STATUSES
    st.caption(f"Its files (config, log, checkpoints): {ui.literal(store.run_dir(run_id))}")
    open_col, compare_col, stop_col = st.columns(3)
    if open_col.button("Open in Live", key="runs.open", icon=":material/monitoring:"):
        ui.open_in_live(run_id)
    in_compare = run_id in st.session_state.get(ui.COMPARE_KEY, [])
    if compare_col.button(
        "In Compare" if in_compare else "Add to Compare",
        key="runs.compare",
        disabled=in_compare,
        icon=":material/compare_arrows:",
    ):
        ui.add_to_compare(run_id)
        ui.flash("success", f"Added #{run_id} {run['name']} to Compare.")
        st.rerun()
    if active and stop_col.button(
        "Stop", key="runs.stop", icon=":material/stop:", disabled=not writable, help=write_help
    ):
        ui.flash("info", f"Run #{run_id}: {runner.stop(store, run_id)}")
        st.rerun()
    code_download_button(run["config"], run["name"], key="runs.code")
    if run.get("error"):
        st.error(f"Run #{run_id} ended with: {ui.plain(run['error'])}")

    relaunch.action_row(store, run_id, "runs", writable)

    rename_col, delete_col = st.columns(2)
    with rename_col:
        run_actions.rename_box(store, run, writable, write_help)
        run_actions.labels_box(store, run, writable, write_help)
    with delete_col:
        delete_help = write_help or (
            f"Run #{run_id} is {run['status']}: stop it first (Stop above)" if active else None
        )
        confirm = st.checkbox(
            f"Delete run #{run_id} with its metrics and files",
            key=f"runs.confirm.{run_id}",
            disabled=not writable or active,
            help=delete_help,
        )
        if st.button(
            "Delete",
            key="runs.delete",
            disabled=not (confirm and writable) or active,
            icon=":material/delete:",
            help=delete_help,
        ):
            if active:  # a tab drawn before the run started: the button was still on
                st.error(
                    f"Run #{run_id} is {run['status']}; stop it first (Stop above), then delete."
                )
            else:
                try:
                    store.delete_run(run_id)
                except StoreError as exc:
                    st.error(ui.plain(exc))
                else:
                    if ui.selected_run_id() == run_id:
                        ui.select_run(None)
                    st.session_state[ui.COMPARE_KEY] = [
                        i for i in st.session_state.get(ui.COMPARE_KEY, []) if i != run_id
                    ]
                    ui.flash("success", f"Deleted run #{run_id} ({run['name']}).")
                    st.rerun()

    log = runner.log_tail(store, run_id, lines=40)
    if log:
        with st.expander("Log (last 40 lines)"):
            st.code(log, language=None)
