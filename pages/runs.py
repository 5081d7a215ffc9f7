"""Runs: every run in the store; click a row to open, compare, rename, tag, relaunch, resume,
stop or delete that run.

The summary line and the table refresh as a fragment while a run moves, and the page
notices a run launched elsewhere while none does (`runs_panel`).
"""

import pandas as pd
import streamlit as st

from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.dashboard import relaunch, run_actions, runs_panel, store_access, tag_filter, ui
from blockviz.dashboard.code_download import code_download_button
from blockviz.launch import runner
from blockviz.store import StoreError

FILTER_KEY = "runs.filter"


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

disk_warning = runs_panel.disk_warning(store)
if disk_warning:
    st.warning(ui.plain(disk_warning), icon=":material/hard_drive:")
notice = ui.selection_notice(all_runs)  # before the table replaces a bad choice
if notice:
    st.warning(ui.plain(notice))
runs = tag_filter.tag_filter(all_runs, FILTER_KEY)
runs_panel.show(
    store,
    all_runs,
    list(st.session_state.get(f"{FILTER_KEY}.tags") or []),
    bool(st.session_state.get(f"{FILTER_KEY}.auto")),
)
if runs.empty:
    st.info("No run passes the filter above.")
    st.stop()

st.subheader("Act on the selected run")
run_id = runs_panel.selected_run()
if run_id is None:
    st.info(ui.plain(runs_panel.no_row_hint(all_runs)), icon=":material/touch_app:")
    st.stop()

with ui.guard("Run actions"):
    run = store.get_run(run_id)
    active = run.status in ACTIVE_STATUSES
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
        ui.flash("success", f"Added #{run_id} {run.name} to Compare.")
        st.rerun()
    if active and stop_col.button(
        "Stop", key="runs.stop", icon=":material/stop:", disabled=not writable, help=write_help
    ):
        ui.flash("info", f"Run #{run_id}: {runner.stop(store, run_id)}")
        st.rerun()
    code_download_button(run.config, run.name, key="runs.code")
    if run.error:
        st.error(f"Run #{run_id} ended with: {ui.plain(run.error)}")

    relaunch.action_row(store, run, "runs", writable)

    rename_col, delete_col = st.columns(2)
    with rename_col:
        run_actions.rename_box(store, run, writable, write_help)
        run_actions.labels_box(store, run, writable, write_help)
    with delete_col:
        delete_help = write_help or (
            f"Run #{run_id} is {run.status}: stop it first (Stop above)" if active else None
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
                st.error(f"Run #{run_id} is {run.status}; stop it first (Stop above), then delete.")
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
                    ui.flash("success", f"Deleted run #{run_id} ({run.name}).")
                    st.rerun()

    log = runner.log_tail(store, run_id, lines=40)
    if log:
        with st.expander("Log (last 40 lines)"):
            st.code(log, language=None)
