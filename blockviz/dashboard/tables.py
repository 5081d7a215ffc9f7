"""Tables the pages show: the runs list, the final-metrics (ablation) table and its formats."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
import streamlit as st

from blockviz.core import disk, spec
from blockviz.dashboard.ui import format_duration
from blockviz.launch import runner
from blockviz.store import RunStore

DIVERGED = "diverged"  # a loss a diverged run has none of: it went non-finite
# The final metrics a diverged run loses (non-finite values are stored as none).
LOSS_COLUMNS = ("train_loss", "val_loss", "val_ppl", "val_bpc")


def loss_text(value: float | None, status: str, digits: int = 4) -> str:
    """A loss as the tables show it: `digits` decimals; "diverged" where a diverged run's
    is missing or infinite, "—" where another run has none yet (not Streamlit's grey None)."""
    if value is not None and math.isfinite(value):
        return f"{value:.{digits}f}"
    if status == "diverged":
        return DIVERGED
    return "—" if value is None or math.isnan(value) else str(value)


def loss_texts(values: pd.Series, statuses: pd.Series, digits: int = 4) -> list[str]:
    """`loss_text` of each run's value."""
    return [
        loss_text(None if pd.isna(value) else float(value), str(status), digits)
        for value, status in zip(values, statuses, strict=True)
    ]


# Compare's table fits a laptop (1366x768, the sidebar open: the page's content is
# LAPTOP_CONTENT_PX wide in chromium) without a horizontal scroll up to its last metric:
# the run's name pinned at the left, the metrics in narrow columns under short headers
# (each header's help says it in full), then status, the rare columns and the findings.
LAPTOP_CONTENT_PX = 906
NARROW_PX = 75  # Streamlit's "small" column
NAME_CHAR_PX = 7.5  # about one character of a run name in the table's font
NAME_MIN_PX = 120
METRIC_COLUMNS = (
    "val_loss",
    "val_bpc",
    "val_ppl",
    "train_loss",
    "steps",
    "time_s",
    "tokens_per_sec",
    "n_params",
)
FINAL_ORDER = ("run", *METRIC_COLUMNS, "status", "diverged_at", "answer_acc", "answer_baseline")
NAME_MAX_PX = LAPTOP_CONTENT_PX - NARROW_PX * len(METRIC_COLUMNS) - 4  # the table's border


def _column(name: str, shown: spec.FinalColumn) -> Any:
    label = shown.label
    about = shown.header if shown.header != label else None
    width = "small" if name in METRIC_COLUMNS else None
    if shown.kind == "text" or name in ("diverged_at", "time_s", *LOSS_COLUMNS):
        return st.column_config.TextColumn(label, help=about, width=width)
    # "compact": 1.2M parameters fit a narrow column (the CSV and the report keep the count)
    formats = {"integer": "%d", "percent": "percent", "count": "compact"}
    return st.column_config.NumberColumn(
        label, help=about, width=width, format=formats.get(shown.kind, f"%.{shown.digits}f")
    )


def name_width(names: Iterable[str]) -> int:
    """Pixels for the run column: the longest name whole, within NAME_MIN_PX..NAME_MAX_PX
    (a longer name is cut here; the charts' legends and the run picker show it whole)."""
    longest = max((len(str(name)) for name in names), default=0)
    return math.ceil(min(NAME_MAX_PX, max(NAME_MIN_PX, 16 + NAME_CHAR_PX * longest)))


def final_column_config(names: Iterable[str]) -> dict[str, Any]:
    """Compare's column config for `final_table`'s columns, the run column sized to `names`."""
    config = {name: _column(name, shown) for name, shown in spec.FINAL_COLUMNS.items()}
    config["run"] = st.column_config.TextColumn(
        "run",
        width=name_width(names),
        pinned=True,
        help="The run's name; the charts' legends and the run picker show a long one whole",
    )
    return config


def final_table(store: RunStore, run_ids: list[int]) -> pd.DataFrame:
    """The runs' final metrics as the page shows them (FINAL_ORDER; `diverged_at` only when a
    run diverged): durations, steps and losses as text."""
    final = store.final_metrics(run_ids)
    final["time_s"] = [format_duration(None if pd.isna(t) else t) for t in final["time_s"]]
    # Blank rather than Streamlit's "None" for the runs that did not diverge.
    final["diverged_at"] = ["" if pd.isna(s) else str(int(s)) for s in final["diverged_at"]]
    for name in LOSS_COLUMNS:
        final[name] = loss_texts(final[name], final["status"], spec.FINAL_COLUMNS[name].digits)
    answers = [c for c in ("answer_acc", "answer_baseline") if c in final.columns]
    if final[answers].isna().all().all():
        final = final.drop(columns=answers)  # only the ops dataset has answers
    if not any(final["diverged_at"]):
        final = final.drop(columns="diverged_at")  # no run diverged: an empty column
    return final[[c for c in FINAL_ORDER if c in final.columns]]


RUNS_COLUMN_CONFIG = {
    "id": st.column_config.NumberColumn("id", format="%d"),
    "disk": st.column_config.NumberColumn(
        "disk", format="%.1f MB", help="the run's folder: its checkpoints, log and config"
    ),
}


def runs_table(
    runs: pd.DataFrame,
    now: float,
    max_running: int | None = None,
    store_runs: pd.DataFrame | None = None,
    disk_bytes: Mapping[int, int] | None = None,
) -> pd.DataFrame:
    """The columns a person scans: id, name, status, created, duration, step, val loss
    (as text, so a diverged run's reads "diverged"), device, tags, the study a run
    belongs to, and, given `disk_bytes` (run id -> bytes of its folder), its disk in MB.

    Duration runs to `ended`, to `now` for an active run, else to the last heartbeat. The
    status is the one the pages show (`runner.shown_in`: a queued run with a free slot is
    `starting`), which depends on every run of the store: `store_runs` (default `runs`)
    holds them when `runs` is filtered.
    """
    shown = runner.shown_in(runs if store_runs is None else store_runs, max_running)
    active = runs["status"].isin(spec.ACTIVE_STATUSES)
    end = runs["ended"].where(runs["ended"].notna(), runs["heartbeat"]).where(~active, now)
    duration = end - runs["started"]
    steps = [
        f"{'–' if pd.isna(step) else f'{int(step):,}'} / "
        f"{'?' if pd.isna(total) else f'{int(total):,}'}"
        for step, total in zip(runs["step"], runs["max_steps"], strict=True)
    ]
    created = [
        "" if pd.isna(c) else time.strftime("%Y-%m-%d %H:%M", time.localtime(c))
        for c in runs["created"]
    ]
    table = pd.DataFrame(
        {
            "id": runs["id"].to_numpy(),
            "name": runs["name"].to_numpy(),
            "status": [shown[int(i)] for i in runs["id"]],
            "created": created,
            "duration": [format_duration(None if pd.isna(d) else d) for d in duration],
            "step": steps,
            "val loss": loss_texts(runs["val_loss"], runs["status"]),
            "device": runs["device"].to_numpy(),
            "tags": runs["tags"].fillna("").to_numpy()
            if "tags" in runs.columns
            else [""] * len(runs),
            "study": [
                "" if pd.isna(s) else f"#{int(s)}"
                for s in (runs["study_id"] if "study_id" in runs.columns else [None] * len(runs))
            ],
        }
    )
    if disk_bytes is not None:
        table["disk"] = [disk_bytes.get(int(i), 0) / disk.MB for i in runs["id"]]
    return table
