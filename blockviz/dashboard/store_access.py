"""The dashboard's run store: one per file for the whole server, read-only when it must be.

Also what every page says about it (a clear error when it cannot be opened, a notice when
it is read-only) and the throttled reaping of runs whose process died.
"""

from __future__ import annotations

import time
from contextlib import suppress
from pathlib import Path

import streamlit as st

from blockviz.dashboard.streamlit_compat import run_via_app
from blockviz.dashboard.ui import literal, plain
from blockviz.launch import runner
from blockviz.store import (
    Location,
    RunStore,
    StoreError,
    StoreLocked,
    StoreUnreachable,
    checked,
    default_store_path,
    default_store_text,
    parse_location,
    redact,
)

PAGE_BUSY_TIMEOUT_S = 5.0  # a locked store: the page says so after this, never hangs
REAP_EVERY_S = 5.0  # pages mark dead runs failed at most this often (fragments refresh faster)
READONLY_NOTICE = "read-only store: launching, stopping, renaming and deleting are off"


@st.cache_resource(show_spinner=False)
def _open_store(path: str) -> RunStore:
    # One connection per store file for the whole server; RunStore serialises threads.
    # A store this process may read but not write (a read-only file or folder, a copy
    # from another user) opens read-only, with the actions that write turned off. A
    # damaged file is refused once, when it is opened, rather than misread page by page.
    return checked(RunStore.open_readable(path, busy_timeout_s=PAGE_BUSY_TIMEOUT_S))


def store_location() -> Location:
    """The store the dashboard uses: $BLOCKVIZ_STORE (a file path or a postgresql:// URL)
    or runs/blockviz.db. StoreError for a URL scheme blockviz does not support."""
    return parse_location(default_store_text())


def store_where() -> str:
    """How the pages name the store the dashboard uses: its file, or its URL without a
    password (the text of $BLOCKVIZ_STORE, redacted, when that is no store at all)."""
    try:
        return store_location().where
    except StoreError:
        return redact(default_store_text())


def store_workspace() -> Path:
    """The folder of the store file (a server store: its workspace): uploads go there."""
    try:
        return store_location().workspace
    except StoreError:
        return default_store_path().expanduser().absolute().parent


def get_store() -> RunStore | None:
    """The cached RunStore, or None (showing nothing) when it cannot be opened."""
    run_via_app()
    try:
        return _open_store(store_location().text)
    except (StoreError, OSError):
        return None


def store_or_stop() -> RunStore:
    """The cached RunStore; otherwise a clear error naming the store, and the page stops."""
    run_via_app()
    where = store_where()
    try:
        return _open_store(store_location().text)
    except (StoreError, OSError) as exc:
        if isinstance(exc, StoreUnreachable):
            advice = "The app reconnects by itself once the server answers: reload the page then."
        elif isinstance(exc, StoreLocked):
            advice = "Reload the page to try again."
        else:
            advice = (
                "Set `BLOCKVIZ_STORE` to a writable file path or a postgresql:// URL and "
                "restart the app."
            )
        st.error(f"Cannot open the run store at {literal(where)}: {plain(exc)}. {advice}")
        st.stop()
        raise  # unreachable: st.stop() raises; keeps type checkers honest


def writable(store: RunStore | None) -> bool:
    """Whether launching, stopping, renaming and deleting may write to this store."""
    return store is not None and not store.readonly


def store_notice(store: RunStore | None) -> None:
    """The one-line notice a read-only store gets on every page that uses it."""
    if store is not None and store.readonly:
        st.info(READONLY_NOTICE, icon=":material/lock:")


_last_reap: dict[str, float] = {}  # store path -> monotonic time of this process's last reap


def reap_dead(store: RunStore) -> None:
    """Mark runs whose process died (kill -9, out of memory) as failed; called on refreshes.

    At most once per REAP_EVERY_S per store, so a page refreshing every 1.5 s does not
    query process tables that often; a dead run reads `failed` within its 30 s heartbeat
    staleness plus this. A read-only store is never written. Best effort: a store that
    cannot be written right now is tried again on a later refresh, while the page reads on.
    """
    if store.readonly:
        return
    now = time.monotonic()
    key = store.where
    last = _last_reap.get(key)
    if last is not None and now - last < REAP_EVERY_S:
        return
    _last_reap[key] = now
    with suppress(StoreError):
        runner.reap(store)  # also collects the dashboard's own exited children
