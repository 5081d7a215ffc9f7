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
from blockviz.store import RunStore, StoreError, StoreLocked, checked, default_store_path

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


def store_path() -> Path:
    """The store file the dashboard uses ($BLOCKVIZ_STORE or runs/blockviz.db), absolute."""
    return default_store_path().expanduser().absolute()


def get_store() -> RunStore | None:
    """The cached RunStore, or None (showing nothing) when it cannot be opened."""
    run_via_app()
    try:
        return _open_store(str(store_path()))
    except (StoreError, OSError):
        return None


def store_or_stop() -> RunStore:
    """The cached RunStore; otherwise a clear error naming the path, and the page stops."""
    run_via_app()
    path = store_path()
    try:
        return _open_store(str(path))
    except (StoreError, OSError) as exc:
        if isinstance(exc, StoreLocked):
            advice = "Reload the page to try again."
        else:
            advice = "Set `BLOCKVIZ_STORE` to a writable file path and restart the app."
        st.error(f"Cannot open the run store at {literal(path)}: {plain(exc)}. {advice}")
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
    key = str(store.path)
    last = _last_reap.get(key)
    if last is not None and now - last < REAP_EVERY_S:
        return
    _last_reap[key] = now
    with suppress(StoreError):
        runner.reap(store)  # also collects the dashboard's own exited children
