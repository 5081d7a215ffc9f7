"""Compare's config differences: only the fields whose values are not the same in every
chosen run."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from blockviz.store import RunStore, StoreError
from blockviz.views.export.report import LABEL_ROWS, config_diff_table


def config_section(store: RunStore, run_ids: list[int]) -> None:
    """The differing fields as a table, or a word that the configs are identical."""
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
