"""Tables the pages show: the final-metrics (ablation) table with its column formats."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from blockviz.core import spec
from blockviz.dashboard.ui import format_duration
from blockviz.store import RunStore


def _column(name: str, shown: spec.FinalColumn) -> Any:
    if shown.kind == "text" or name in ("diverged_at", "time_s"):
        return st.column_config.TextColumn("time" if name == "time_s" else shown.header)
    formats = {"integer": "%d", "percent": "percent", "count": "localized"}
    return st.column_config.NumberColumn(
        shown.header, format=formats.get(shown.kind, f"%.{shown.digits}f")
    )


FINAL_COLUMN_CONFIG = {name: _column(name, shown) for name, shown in spec.FINAL_COLUMNS.items()}


def final_table(store: RunStore, run_ids: list[int]) -> pd.DataFrame:
    """The runs' final metrics as the page shows them: durations and steps as text."""
    final = store.final_metrics(run_ids)
    final["time_s"] = [format_duration(None if pd.isna(t) else t) for t in final["time_s"]]
    # Blank rather than Streamlit's "None" for the runs that did not diverge.
    final["diverged_at"] = ["" if pd.isna(s) else str(int(s)) for s in final["diverged_at"]]
    if final["answer_acc"].isna().all():
        final = final.drop(columns="answer_acc")  # only the ops dataset has answers
    return final[[c for c in spec.FINAL_COLUMNS if c in final.columns]]
