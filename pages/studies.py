"""Studies: one click answers a question about the block, with seeds, intervals and a verdict.

The picked study (the newest, or the one just launched) comes first: each claim beside its
verdict and the charts (loss curves with seed bands, final loss against the swept value),
then the results table and the details; under it the launchers for a built-in study or a
custom sweep, and every study of the store. Studies live in the store and keep going with
the tab closed.
"""

import streamlit as st

from blockviz.dashboard import store_access, ui
from blockviz.dashboard.studies import launch as study_launch
from blockviz.dashboard.studies import view as study_view

store = store_access.store_or_stop()
st.title("Studies")
ui.show_flashes()
store_access.store_notice(store)
writable = store_access.writable(store)

chosen = None
with ui.guard("Studies"):
    store_access.reap_dead(store)
    chosen = study_view.pick_study(store)
if chosen is not None:
    with ui.guard("Study"):
        study_view.live_panel(store, int(chosen), writable)
    st.divider()
    st.subheader("Run another study", anchor=False)

builtin_tab, sweep_tab = st.tabs(["Built-in studies", "Custom sweep"])
with builtin_tab, ui.guard("Study launcher"):
    study_launch.builtin_launcher(store, writable)
with sweep_tab, ui.guard("Sweep form"):
    study_launch.sweep_launcher(store, writable)
with ui.guard("Every study"):
    study_view.studies_list(store)
