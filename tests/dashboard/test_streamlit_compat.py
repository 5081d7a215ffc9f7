"""The Streamlit internal that streamlit_compat relies on: there, meaning what it meant.

These fail, saying what to do, when a Streamlit upgrade changes the old multipage mode
that `blockviz.dashboard.streamlit_compat.run_via_app` works around.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import streamlit
from streamlit.testing.v1 import AppTest

from blockviz.dashboard import streamlit_compat

WHAT_TO_DO = (
    f"Streamlit {streamlit.__version__} changed the old multipage mode that "
    "blockviz.dashboard.streamlit_compat.run_via_app works around (see its docstring): "
    "find how this Streamlit decides that a main script next to a pages/ folder runs a "
    "page file alone, and update run_via_app; tests/pages/test_pages_a.py::"
    "test_a_page_link_opened_first_still_goes_through_app_py checks the result."
)

APP = """
import streamlit as st

st.session_state.setdefault("ran", []).append("app")
pages = [st.Page("pages/home.py", default=True), st.Page("pages/alone.py")]
st.navigation([*pages, st.Page("pages/routed.py")]).run()
"""
PAGE = """
import streamlit as st

st.session_state.setdefault("ran", []).append("{name}")
"""
ROUTED = """
import streamlit as st

from blockviz.dashboard.streamlit_compat import run_via_app

run_via_app()
st.session_state.setdefault("ran", []).append("routed")
"""


@pytest.fixture
def app(tmp_path: Path) -> str:
    """A minimal app like ours: app.py with st.navigation, next to a pages/ folder."""
    (tmp_path / "pages").mkdir()
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "pages" / "home.py").write_text(PAGE.format(name="home"))
    (tmp_path / "pages" / "alone.py").write_text(PAGE.format(name="alone"))
    (tmp_path / "pages" / "routed.py").write_text(ROUTED)
    return str(tmp_path / "app.py")


def opened_first(app: str, page: str) -> list[str]:
    """The scripts that ran, in order, when a fresh session's first URL names `page`."""
    at = AppTest.from_file(app, default_timeout=30)
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return list(at.session_state["ran"])


def test_streamlit_still_has_the_old_multipage_switch() -> None:
    try:
        from streamlit.runtime.pages_manager import PagesManager
    except ImportError:
        pytest.fail(f"streamlit.runtime.pages_manager is gone. {WHAT_TO_DO}")
    assert hasattr(PagesManager, "uses_pages_directory"), (
        f"PagesManager.uses_pages_directory is gone. {WHAT_TO_DO}"
    )


def test_the_switch_is_still_set_by_a_pages_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamlit.runtime.pages_manager import PagesManager

    (tmp_path / "app.py").write_text("")
    for has_pages in (False, True):
        if has_pages:
            (tmp_path / "pages").mkdir()
        monkeypatch.setattr(PagesManager, "uses_pages_directory", None)
        PagesManager(str(tmp_path / "app.py"))
        assert PagesManager.uses_pages_directory is has_pages, (
            f"A pages/ folder no longer decides the old multipage mode. {WHAT_TO_DO}"
        )


def test_a_page_opened_first_still_runs_alone(app: str) -> None:
    # The quirk itself: if this fails, Streamlit runs app.py first on its own now, and
    # run_via_app (with this module) can go once test_pages_a passes without it.
    ran = opened_first(app, "pages/alone.py")
    assert ran == ["alone"], (
        f"A page URL opened first no longer runs the page alone (ran: {ran}). {WHAT_TO_DO}"
    )


def test_clearing_the_switch_still_sends_the_run_through_app_py(
    app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streamlit_compat, "_rerouted", False)  # a freshly started server
    ran = opened_first(app, "pages/routed.py")
    assert ran == ["app", "routed"], (
        f"run_via_app no longer reruns a page through app.py (ran: {ran}). {WHAT_TO_DO}"
    )
