"""The one place blockviz reaches into Streamlit's internals, and why.

Streamlit (1.67 as this is written) keeps the old multipage mode for an app whose main
script sits next to a `pages/` folder, until some run in the server process has called
`st.navigation`. In that mode a `/<page>` URL runs that page file alone, without app.py's
navigation, page config and sidebar: the first visit after a (re)start that opens a page
link, such as a bookmarked `/live?run=3`, gets a page without its sidebar. Streamlit
decides this once per process from `PagesManager.uses_pages_directory`, which the
`pages/` folder sets and `st.navigation` clears; no config option or public API turns the
old mode off, and Streamlit's own advice (a folder not named `pages/`) is not open to us:
the project keeps `pages/` as its pages folder. So a page that finds itself run alone
clears the flag and reruns, which sends the run through app.py.

tests/dashboard/test_streamlit_compat.py fails, saying what to do, when a Streamlit upgrade drops
the flag, changes what it means, or no longer needs this.
"""

from __future__ import annotations

import streamlit as st

_rerouted = False  # whether run_via_app has rerun a page run already (once per process)


def run_via_app() -> None:
    """Rerun through app.py when Streamlit ran a page file on its own (see the module doc).

    Every page reaches this early (via the store or the sidebar). The rerun happens once
    per process: a server keeps the old mode off from then on, while AppTest turns it back
    on for every run, and a rerun there would swallow the click that started the run.
    """
    global _rerouted
    try:
        from streamlit.runtime.pages_manager import PagesManager
    except ImportError:  # a Streamlit without the module: the test says what to check
        return
    if getattr(PagesManager, "uses_pages_directory", False):
        PagesManager.uses_pages_directory = False
        if not _rerouted:
            _rerouted = True
            st.rerun()
