"""Shared test setup: keep every test offline, on one thread, inside tmp dirs."""

import os

import pytest

# Two CPU cores in CI: one intra-op thread per process keeps parallel subprocess runs sane.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    """Each test gets its own cache and store so nothing leaks between tests or to $HOME."""
    monkeypatch.setenv("BLOCKVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BLOCKVIZ_STORE", str(tmp_path / "runs" / "blockviz.db"))
