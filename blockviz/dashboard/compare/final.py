"""Compare's final-metrics table, with each run's findings in a column."""

from __future__ import annotations

import streamlit as st

from blockviz.dashboard import tables, ui
from blockviz.store import RunRecord, RunStore
from blockviz.views import run_findings

FINDINGS_COLUMN = st.column_config.TextColumn(
    "findings",
    help="The run's headline and each warning of its findings (Live shows them in full)",
)


def final_metrics(store: RunStore, stored: list[RunRecord]) -> None:
    """One row per run: its final metrics and its findings' titles."""
    run_ids = [int(run.id) for run in stored]
    st.subheader("Final metrics", anchor=False)
    with ui.guard("Final metrics"):
        final = tables.final_table(store, run_ids)
        by_name = {
            run.name: run_findings.titles_text(run_findings.cached_findings(store, run))
            for run in stored
        }
        final["findings"] = [by_name.get(name, "") for name in final["run"]]
        config = {**tables.final_column_config(final["run"]), "findings": FINDINGS_COLUMN}
        st.dataframe(final, hide_index=True, column_config=config)
