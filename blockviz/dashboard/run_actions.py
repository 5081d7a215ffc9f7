"""The Runs page's edits of one run: rename, tags and notes.

Each edit is saved in its button's callback, which runs before the page is drawn again:
the boxes can then show what the store kept (a sanitised name, cleaned tags) rather than
what was typed. A refusal is kept for the page to show under the boxes.
"""

from __future__ import annotations

import streamlit as st

from blockviz.core.tags import tags_text
from blockviz.dashboard import ui
from blockviz.store import RunRecord, RunStore, StoreError

_ERROR_KEY = "run_actions.error"  # {which edit: message} of the last refused save


def name_key(run_id: int) -> str:
    return f"runs.name.{run_id}"


def tags_key(run_id: int) -> str:
    return f"runs.tags.{run_id}"


def notes_key(run_id: int) -> str:
    return f"runs.notes.{run_id}"


def _refused(which: str, exc: Exception) -> None:
    st.session_state[_ERROR_KEY] = {which: str(exc)}


def _rename(store: RunStore, run_id: int) -> None:
    st.session_state.pop(_ERROR_KEY, None)
    try:
        stored = store.rename_run(run_id, st.session_state.get(name_key(run_id), ""))
    except StoreError as exc:
        _refused("rename", exc)
        return
    st.session_state[name_key(run_id)] = stored
    ui.flash("success", f"Run #{run_id} is now called {stored}.")


def _save_labels(store: RunStore, run_id: int) -> None:
    st.session_state.pop(_ERROR_KEY, None)
    try:
        tags = store.set_tags(run_id, st.session_state.get(tags_key(run_id), ""))
        notes = store.set_notes(run_id, st.session_state.get(notes_key(run_id), ""))
    except StoreError as exc:
        _refused("labels", exc)
        return
    st.session_state[tags_key(run_id)] = tags_text(tags)
    st.session_state[notes_key(run_id)] = notes
    ui.flash("success", f"Saved run #{run_id}'s tags and notes.")


def _show_refusal(which: str) -> None:
    message = (st.session_state.get(_ERROR_KEY) or {}).pop(which, None)
    if message:
        st.error(ui.plain(message))


def rename_box(store: RunStore, run: RunRecord, writable: bool, help_text: str | None) -> None:
    """'New name' and Rename; the box shows the stored name after a rename."""
    run_id = int(run.id)
    st.session_state.setdefault(name_key(run_id), run.name)
    st.text_input("New name", key=name_key(run_id))
    st.button(
        "Rename",
        key="runs.rename",
        icon=":material/edit:",
        disabled=not writable,
        help=help_text,
        on_click=_rename,
        args=(store, run_id),
    )
    _show_refusal("rename")


def labels_box(store: RunStore, run: RunRecord, writable: bool, help_text: str | None) -> None:
    """Tags (comma-separated) and notes, with Save."""
    run_id = int(run.id)
    st.session_state.setdefault(tags_key(run_id), tags_text(run.tags))
    st.session_state.setdefault(notes_key(run_id), run.notes or "")
    st.text_input(
        "Tags",
        key=tags_key(run_id),
        placeholder="e.g. post-ln, lr-sweep",
        help="Comma-separated; letters, digits and -_.+=: in each tag",
    )
    st.text_area("Notes", key=notes_key(run_id), height=90, placeholder="Why this run?")
    st.button(
        "Save tags and notes",
        key="runs.save_labels",
        icon=":material/sell:",
        disabled=not writable,
        help=help_text,
        on_click=_save_labels,
        args=(store, run_id),
    )
    _show_refusal("labels")


def clear_refusals() -> None:
    """Forget the last refused save (another run was picked)."""
    st.session_state.pop(_ERROR_KEY, None)
