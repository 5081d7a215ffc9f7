"""Compare: overlay runs — loss and any metric, config diff, final metrics, gradient by layer.

The curves, the final-metrics table and the gradient picture refresh every 1.5 s while any
chosen run is still queued or running; when any run's status changes the whole page reruns
once, so the picker's labels show the statuses the table shows. The report button builds
the zip only when clicked (in a background thread of the download) and the page shows its
progress meanwhile. Under the gradient-by-layer charts, sentences computed from the runs
drawn (views/grad_by_layer_text.py) replace any fixed text; the paper's claim is a caption of
its own, labelled as a claim. The page lays out; its parts live in
`blockviz.dashboard.compare` (the selection, the curves, twins, the final metrics, gradient
by layer, the config differences, the report).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.dashboard import store_access, ui
from blockviz.dashboard.compare import twins
from blockviz.dashboard.compare.curves import curves
from blockviz.dashboard.compare.diff import config_section
from blockviz.dashboard.compare.final import final_metrics
from blockviz.dashboard.compare.grad_by_layer import grad_by_layer
from blockviz.dashboard.compare.report import report_section
from blockviz.dashboard.compare.selection import choose_runs
from blockviz.store import RunStore

REFRESH_S = 1.5


def _moving(store: RunStore, run_ids: list[int], seen: dict[int, str]) -> None:
    """Everything that moves while a chosen run trains; a fragment while one is active: the
    curves, then twins, final metrics and gradient by layer of the runs they read."""
    with ui.guard("Comparison"):
        drawn = curves(store, run_ids, seen)
        with ui.guard("Twins"):
            twins.twins_section(store, drawn.runs)
        final_metrics(store, drawn.runs)
        grad_by_layer(store, drawn.runs, drawn.colors, drawn.tag)


store = store_access.store_or_stop()
st.title("Compare")
ui.show_flashes()
store_access.store_notice(store)
picked: pd.DataFrame | None = None
seen: dict[int, str] = {}
with ui.guard("Reading the run store"):
    choice = choose_runs(store)
    if choice is not None:
        picked, seen = choice
if picked is not None:
    chosen = [int(i) for i in picked["id"]]
    any_active = bool(picked["status"].isin(ACTIVE_STATUSES).any())
    st.fragment(_moving, run_every=REFRESH_S if any_active else None)(store, chosen, seen)
    with ui.guard("Config differences"):
        config_section(store, chosen)
    with ui.guard("Report"):
        report_section(store, chosen, [str(name) for name in picked["name"]])
