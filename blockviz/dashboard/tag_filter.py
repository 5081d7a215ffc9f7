"""Filter runs by tag, and keep the Playground's auto-runs out of the way unless asked for.

Runs and Compare draw the same controls: a multiselect of every tag present (a run must
carry each chosen tag) and, when there are auto-runs, a toggle "Show auto-runs (N)".
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from blockviz.core.tags import AUTO_TAG, parse_tags


def run_tags(runs: pd.DataFrame) -> list[tuple[str, ...]]:
    """Each run's tags, from runs_frame()'s comma-separated `tags` column."""
    column = runs["tags"] if "tags" in runs.columns else pd.Series([""] * len(runs))
    return [parse_tags(text) if isinstance(text, str) else () for text in column]


def all_tags(runs: pd.DataFrame) -> list[str]:
    """Every tag some run carries, sorted case-insensitively."""
    return sorted({tag for tags in run_tags(runs) for tag in tags}, key=lambda t: (t.lower(), t))


def select_runs(runs: pd.DataFrame, wanted: Sequence[str], show_auto: bool) -> pd.DataFrame:
    """The runs carrying every tag in `wanted`; auto-runs only with `show_auto` (or when
    `wanted` names the auto tag itself)."""
    keep = []
    for tags in run_tags(runs):
        held = set(tags)
        hidden = AUTO_TAG in held and not show_auto and AUTO_TAG not in wanted
        keep.append(set(wanted) <= held and not hidden)
    return runs[pd.Series(keep, index=runs.index, dtype=bool)]


def tag_filter(runs: pd.DataFrame, key: str) -> pd.DataFrame:
    """Draw the tag filter and the auto-runs toggle; the runs that pass them."""
    tags = all_tags(runs)
    n_auto = sum(AUTO_TAG in t for t in run_tags(runs))
    if not tags:
        return runs
    # Tags of runs deleted since they were chosen drop out instead of breaking the widget.
    chosen = st.session_state.get(f"{key}.tags")
    if isinstance(chosen, list):
        st.session_state[f"{key}.tags"] = [t for t in chosen if t in tags]
    wanted_col, auto_col = st.columns([3, 1], vertical_alignment="bottom")
    wanted = wanted_col.multiselect(
        "Filter by tag",
        tags,
        key=f"{key}.tags",
        placeholder="every run",
        help="Only runs that carry every chosen tag",
    )
    show_auto = False
    if n_auto:
        show_auto = auto_col.toggle(
            f"Show auto-runs ({n_auto})",
            key=f"{key}.auto",
            help=f"Runs the Playground launched on its own (tag {AUTO_TAG})",
        )
    return select_runs(runs, wanted, show_auto)
