"""The Ledger page's files: the offline HTML and the JSON to download, and the uploader
that imports another machine's export (checked as `ledger import` checks it)."""

from __future__ import annotations

import hashlib
import json

import streamlit as st

from blockviz.core import ledger as ldg
from blockviz.dashboard import ui
from blockviz.store import RunStore
from blockviz.views.ledger import build, imports, page

UPLOAD_KEY = "ledger.upload"
ACCEPTED_KEY = "ledger.accepted"  # the digest of the upload last accepted (one per file)


def downloads(store: RunStore) -> None:
    """Download buttons; each file is built when it is asked for."""
    left, right = st.columns(2)
    left.download_button(
        "Download ledger (offline HTML)",
        data=lambda: page.ledger_html(build.ledger(store)),
        file_name="blockviz-ledger.html",
        mime="text/html",
        icon=":material/download:",
        key="ledger.html",
        on_click="ignore",
    )
    right.download_button(
        "Download ledger (JSON, to import elsewhere)",
        data=lambda: json.dumps(ldg.to_json(build.ledger(store)), indent=1) + "\n",
        file_name="blockviz-ledger.json",
        mime="application/json",
        icon=":material/data_object:",
        key="ledger.json",
        on_click="ignore",
    )


def uploader(store: RunStore, writable: bool) -> None:
    """Import a `ledger export --json` file; one line says what it did or what is wrong."""
    uploaded = st.file_uploader(
        "Import another machine's ledger (JSON)",
        type=["json"],
        key=UPLOAD_KEY,
        disabled=not writable,
        help="A file `ledger export --json` (or this page's JSON download) wrote; each "
        "measurement keeps the host and store it came from, and the same file twice adds "
        "nothing.",
    )
    if uploaded is None:
        return
    if uploaded.size > ldg.MAX_FILE_BYTES:
        st.error(
            f"{ui.plain(uploaded.name)} is larger than a ledger export's limit of "
            f"{ldg.MAX_FILE_BYTES // 2**20} MiB"
        )
        return
    data = uploaded.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    if st.session_state.get(ACCEPTED_KEY) == digest:
        return  # imported on an earlier rerun: its message was shown then
    try:
        done = imports.accept(store, data, uploaded.name)
    except ldg.LedgerError as exc:
        st.error(ui.plain(exc))
        return
    st.session_state[ACCEPTED_KEY] = digest
    if done.already:
        st.info(f"{ui.plain(uploaded.name)} was imported already; nothing added.")
        return
    ui.flash(
        "success",
        f"Imported {done.measurements} measurement(s) of {len(done.ledger.entries)} claim(s) "
        f"from {done.ledger.origin.text()}, exported {done.ledger.exported}.",
    )
    st.rerun()  # the cards above show it
