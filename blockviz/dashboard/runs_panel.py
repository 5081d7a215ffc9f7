"""The Runs page's live part: the summary line and the runs table, whose selected row is
the run the page's actions apply to.

A click on a row selects that run for every page (`ui.select_run`, so `?run=` follows);
clicking it again selects none. The page keeps the selection as a run id, not a row
number: when rows move (a new run on top) the selection moves with its run, and a run
hidden by the tag filter is selected again when the filter lets it back.

Summary and table are one fragment. While a shown run is queued or running (or one was
just resumed) it refreshes every REFRESH_S. Otherwise a fragment that draws nothing reads
the runs' statuses every WATCH_S, so a run launched from the command line appears. Any
status change reruns the whole page, so the actions below the table follow it too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pandas as pd
import streamlit as st

from blockviz.core import disk
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.dashboard import relaunch, run_actions, store_access, tables, tag_filter, ui
from blockviz.launch import runner
from blockviz.store import RunStore

REFRESH_S = 2.0  # while a run moves: its step, loss and duration
WATCH_S = 5.0  # while none does: how soon a run launched elsewhere appears
TABLE_KEY = "runs.table"
_DRAWN_KEY = "runs.table.drawn"  # (run ids in table order, selected rows) as last drawn
NO_ROW_HINT = (
    "Click a row in the table to act on that run: open it in Live, compare, relaunch, "
    "resume, rename, tag or delete it."
)


def _moving(runs: pd.DataFrame) -> bool:
    """Whether a shown run is queued or running, or one was resumed and may start soon."""
    return bool(runs["status"].isin(ACTIVE_STATUSES).any()) or relaunch.recently_resumed()


def summary_line(everything: pd.DataFrame, n_shown: int, store_path: object) -> str:
    """'3 run(s) in `path`: 1 running, 2 completed; 1 hidden by the filter above.' (Markdown)

    Statuses as the table shows them (a queued run with a free slot is `starting`).
    """
    words = runner.shown_in(everything)
    counts = pd.Series([words[int(i)] for i in everything["id"]], dtype=object).value_counts()
    hidden = len(everything) - n_shown
    return (
        f"{len(everything)} run(s) in {ui.literal(store_path)}: "
        + ", ".join(f"{count} {status}" for status, count in counts.items())
        + (f"; {hidden} hidden by the filter above." if hidden else ".")
    )


def show(store: RunStore, runs: pd.DataFrame, wanted: Sequence[str], show_auto: bool) -> None:
    """The summary line and the table (`runs`: the page's read of every run, whose
    statuses the actions below are drawn with), refreshing as the module says."""
    shown = tag_filter.select_runs(runs, wanted, show_auto)
    active = _moving(shown)
    seen = ui.run_statuses(runs)
    st.fragment(_panel, run_every=REFRESH_S if active else None)(
        store, list(wanted), show_auto, seen, active
    )
    if not active:
        st.fragment(_watch, run_every=WATCH_S)(store, seen)


def disk_warning(store: RunStore) -> str | None:
    """The store's checkpoints past the warning size (`core.disk`), or a bad
    $BLOCKVIZ_CKPT_WARN_MB, as one plain-text warning; None when neither."""
    try:
        limit_mb = disk.warn_mb()
    except disk.WarnSizeError as exc:
        return str(exc)
    return disk.over_warning(disk.checkpoint_bytes(store.runs_root), limit_mb, str(store.runs_root))


def selected_run() -> int | None:
    """The run of the table's selected row as last drawn; None when no row is selected."""
    ids, rows = st.session_state.get(_DRAWN_KEY) or ([], [])
    return ids[rows[0]] if rows else None


def no_row_hint(runs: pd.DataFrame) -> str:
    """Why no row is selected, and what to do (plain text)."""
    chosen = ui.selected_run_id()
    if chosen in {int(i) for i in runs["id"]}:
        return f"Run #{chosen} is hidden by the filter above. {NO_ROW_HINT}"
    return NO_ROW_HINT


def _panel(
    store: RunStore, wanted: list[str], show_auto: bool, seen: dict[int, str], active: bool
) -> None:
    with ui.guard("Run list"):
        store_access.reap_dead(store)
        everything = store.runs_frame()
        shown = tag_filter.select_runs(everything, wanted, show_auto)
        if ui.run_statuses(everything) != seen or _moving(shown) != active:
            # A run started, ended or was reaped (or a resume stopped being awaited):
            # redraw the page, so the actions and the refresh timer follow.
            st.rerun(scope="app")
        st.caption(summary_line(everything, len(shown), store.where))
        sizes = {int(i): disk.folder_bytes(store.run_dir(int(i))) for i in shown["id"]}
        table = tables.runs_table(
            shown.iloc[::-1], time.time(), store_runs=everything, disk_bytes=sizes
        )
        if _table(table, shown):
            st.rerun(scope="app")  # a click reruns this fragment alone: redraw the actions


def _watch(store: RunStore, seen: dict[int, str]) -> None:
    """Draws nothing; reruns the page when a run was added, deleted or changed status."""
    with ui.guard("Run list"):
        store_access.reap_dead(store)
        if store.run_statuses() != seen:
            st.rerun(scope="app")


def _table(table: pd.DataFrame, shown: pd.DataFrame) -> bool:
    """Draw the table with the selected run's row selected; whether the user clicked a
    row (or clicked the selected one off) since the last draw, selecting that run."""
    ids = [int(i) for i in table["id"]]
    state = st.session_state.get(TABLE_KEY)
    drawn_ids, drawn_rows = st.session_state.get(_DRAWN_KEY) or ([], [])
    rows = list(state["selection"]["rows"]) if state is not None else []
    clicked = state is not None and rows != drawn_rows
    if clicked:  # rows count in the table as it was drawn when the user clicked
        run_id = drawn_ids[rows[0]] if rows and rows[0] < len(drawn_ids) else None
        ui.select_run(run_id)
        run_actions.clear_refusals()
    elif state is None:  # the table's first draw on this visit
        run_id = ui.current_run(shown)  # the run chosen on any page, else the newest
    else:
        run_id = ui.selected_run_id()
    selected = [ids.index(run_id)] if run_id in ids else []
    if rows != selected:  # e.g. a new run on top moved the row: the browser is told
        st.session_state[TABLE_KEY] = {"selection": {"rows": selected, "columns": []}}
    st.dataframe(
        table,
        key=TABLE_KEY,  # a stable identity: the selection survives every refresh
        on_select="rerun",
        selection_mode="single-row",
        hide_index=True,
        width="stretch",
        column_config=tables.RUNS_COLUMN_CONFIG,
        placeholder="—",  # a run not started yet has no device: not a grey None
    )
    st.session_state[_DRAWN_KEY] = (ids, selected)
    return clicked
