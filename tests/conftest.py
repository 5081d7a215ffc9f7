"""Shared test setup: keep every test offline, on one thread, inside tmp dirs."""

import os

import pytest

from tests.real_runs import RealRuns, train_real_runs

# Two CPU cores in CI: one intra-op thread per process keeps parallel subprocess runs sane.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    """Each test gets its own cache and store so nothing leaks between tests or to $HOME."""
    monkeypatch.setenv("BLOCKVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BLOCKVIZ_STORE", str(tmp_path / "runs" / "blockviz.db"))


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory) -> RealRuns:
    """Real tiny runs (tests/real_runs.py), trained once per session in a few seconds.

    Their store is shared: read it, or copy runs out of it with `real_runs.copy_run`;
    never write it.
    """
    return train_real_runs(tmp_path_factory.mktemp("real-runs"))
