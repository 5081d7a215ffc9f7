"""The dashboard on a PostgreSQL store: `BLOCKVIZ_STORE=postgresql://...` and every page
reads its runs from the database (the run folders are not needed to draw a chart)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from blockviz.dashboard import ui
from blockviz.store import RunStore
from tests import fakes
from tests.helpers import chart_specs

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
STATUSES = ("completed", "running", "stopped")


@pytest.fixture
def server_runs(pg_url, tmp_path, monkeypatch) -> dict[str, int]:
    """Three fake runs in a PostgreSQL store that the dashboard is pointed at; the running
    one beats for this process. Its run folders are never created."""
    url = f"{pg_url}?runs={tmp_path / 'shared'}"
    monkeypatch.setenv("BLOCKVIZ_STORE", url)
    with RunStore(url) as store:
        ids = fakes.populate(store, n_runs=3, n_steps=60, n_layer=2, statuses=STATUSES)
    return dict(zip(STATUSES, ids, strict=True))


def _page(page: str, run_id: int | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if run_id is not None:
        at.session_state[ui.RUN_KEY] = run_id
    at.run()
    at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_pages_read_a_postgresql_store(server_runs, tmp_path):
    listed = _page("runs")
    assert {int(i) for i in listed.dataframe[0].value["id"]} == set(server_runs.values())
    summary = " ".join(str(c.value) for c in listed.caption)
    assert "postgresql://127.0.0.1:" in summary  # the store it names, without a password
    live = _page("live", server_runs["running"])
    assert any("loss" in title.lower() for title in chart_specs(live))
    compare = _page("compare")
    assert len(chart_specs(compare)) > 0
    assert not (tmp_path / "shared").exists()  # the charts came from the database alone
