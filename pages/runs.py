"""Runs: every run in the store; open, compare, rename, stop or delete one."""

import time

import streamlit as st

from blockviz import runner
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.dashboard import store_access, tables, ui
from blockviz.dashboard.code_download import code_download_button
from blockviz.store import StoreError

store = store_access.store_or_stop()
st.title("Runs")
ui.show_flashes()
store_access.store_notice(store)
writable = store_access.writable(store)
write_help = None if writable else store_access.READONLY_NOTICE

runs = None
with ui.guard("Run list"):
    store_access.reap_dead(store)
    runs = store.runs_frame()
if runs is None:
    st.stop()
if runs.empty:
    st.info("No runs yet — set up a block in the sidebar and press Launch on the Train page.")
    st.stop()

counts = runs["status"].value_counts()
st.caption(
    f"{len(runs)} run(s) in {ui.literal(store.path)}: "
    + ", ".join(f"{counts[s]} {s}" for s in counts.index)
    + "."
)
st.dataframe(
    tables.runs_table(runs.iloc[::-1], time.time()),
    hide_index=True,
    width="stretch",
    column_config={
        "id": st.column_config.NumberColumn("id", format="%d"),
        "val loss": st.column_config.NumberColumn("val loss", format="%.4f"),
    },
)

st.subheader("Act on a run")
notice = ui.selection_notice(runs)
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

    rename_col, delete_col = st.columns(2)
    with rename_col:
        new_name = st.text_input("New name", value=run["name"], key=f"runs.name.{run_id}")
        if st.button(
            "Rename",
            key="runs.rename",
            icon=":material/edit:",
            disabled=not writable,
            help=write_help,
        ):
            try:
                stored = store.rename_run(run_id, new_name)
            except StoreError as exc:
                st.error(ui.plain(exc))
            else:
                ui.flash("success", f"Run #{run_id} is now called {stored}.")
                st.rerun()
    with delete_col:
        confirm = st.checkbox(
            f"Delete run #{run_id} with its metrics and files",
            key=f"runs.confirm.{run_id}",
            disabled=not writable,
        )
        if st.button(
            "Delete",
            key="runs.delete",
            disabled=not (confirm and writable),
            icon=":material/delete:",
            help=write_help,
        ):
            if active:
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
