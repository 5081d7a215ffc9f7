"""What a page says when it cannot open the run store: advice that matches the fault."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

PAGES = Path(__file__).resolve().parents[2] / "pages"


def test_a_server_that_does_not_answer_is_not_told_to_restart_the_app(monkeypatch, tmp_path):
    """The app reconnects by itself once the server is back (13 s after, in the audit);
    the page said "set BLOCKVIZ_STORE ... and restart the app"."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLOCKVIZ_STORE", "postgresql://me@127.0.0.1:9/x")
    at = AppTest.from_file(str(PAGES / "runs.py"), default_timeout=60)
    at.run()
    text = " ".join(e.value for e in at.error)
    assert "Cannot open the run store" in text, text
    assert "reconnects by itself" in text and "restart the app" not in text, text
