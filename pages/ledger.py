"""Ledger: every named claim about the block, with what each stored study measured.

A card per claim (its sentence and source, each seed set's verdict with its intervals,
the replication, size, machine, date and the command that re-runs it, or "not run" with
the command that runs it); the ledger as one offline HTML file or as JSON; and an import
of another machine's JSON export, merged in with each measurement's origin kept.
"""

import streamlit as st

from blockviz.dashboard import store_access, ui
from blockviz.dashboard.ledger import cards, files
from blockviz.views.ledger import build

store = store_access.store_or_stop()
st.title("Ledger")
ui.show_flashes()
store_access.store_notice(store)

merged = None
with ui.guard("Ledger"):
    merged = build.merged(store)
if merged is not None:
    measured = sum(1 for entry in merged.entries if entry.measurements)
    st.caption(
        f"{len(merged.entries)} claims, {measured} measured in this store or an imported "
        "ledger. Each verdict is computed from the runs by its study's rule; a seed set is "
        "judged on its own runs, and a claim is replicated when a disjoint seed set gives "
        "the same verdict (docs/studies.md)."
    )
    for line in merged.problems:
        st.warning(ui.plain(line))
    with ui.guard("Ledger files"):
        files.downloads(store)
    for entry in merged.entries:
        with ui.guard(entry.id):
            cards.card(entry)
with ui.guard("Ledger import"):
    files.uploader(store, store_access.writable(store))
