"""Shared test setup: keep every test offline, on one thread, inside tmp dirs."""

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import finding_runs as findings
from tests import pgserver
from tests.real_runs import RealRuns, train_real_runs

# Two CPU cores in CI: one intra-op thread per process keeps parallel subprocess runs sane.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    """Each test gets its own cache and store so nothing leaks between tests or to $HOME."""
    monkeypatch.setenv("BLOCKVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BLOCKVIZ_STORE", str(tmp_path / "runs" / "blockviz.db"))


@pytest.fixture(scope="session", autouse=True)
def _components_scanned_once() -> Iterator[None]:
    """Each new AppTest scans every installed package's metadata for Streamlit components
    (a third of a page test's time); the packages do not change during a session, so
    scan once, as the app's own runtime does. A session without AppTest is left alone."""
    if "streamlit.testing.v1" not in sys.modules:
        yield
        return
    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:  # another Streamlit: AppTest scans as it does
        yield
        return
    scan = functools.cache(manifest_scanner.scan_component_manifests)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            manifest_scanner, "scan_component_manifests", lambda *a, **k: list(scan(*a, **k))
        )
        yield


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory) -> RealRuns:
    """Real tiny runs (tests/real_runs.py), trained once per session in a few seconds.

    Their store is shared: read it, or copy runs out of it with `real_runs.copy_run`;
    never write it.
    """
    return train_real_runs(tmp_path_factory.mktemp("real-runs"))


# The findings runs train in a subprocess from the start of the test run on
# (tests/finding_runs.py); never while collecting, so `pytest --collect-only` starts nothing.
_FINDINGS = pytest.StashKey[tuple[Path, subprocess.Popen, float]]()


def _start_findings(config: pytest.Config) -> tuple[Path, subprocess.Popen, float]:
    folder = Path(tempfile.mkdtemp(prefix="blockviz-findings-"))
    started = (folder, findings.start(folder), time.perf_counter())
    config.stash[_FINDINGS] = started
    return started


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the findings runs is slow: they train for about 30 s of a core
    (before `-m "not slow"` deselects, hence first)."""
    for item in items:
        if "finding_runs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """As the tests start to run, start training the findings runs if a selected test
    needs them, so they train beside the tests before it; not for --collect-only or
    --setup-plan, which run no test."""
    if session.config.option.collectonly or session.config.option.setupplan:
        return
    if any("finding_runs" in getattr(item, "fixturenames", ()) for item in session.items):
        _start_findings(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the findings runs' subprocess if it is still going; remove its folder."""
    started = config.stash.get(_FINDINGS, None)
    if started is not None:
        folder, process, _ = started
        if process.poll() is None:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def finding_runs(pytestconfig: pytest.Config) -> findings.FindingRuns:
    """Real tiny runs that show what each findings rule looks for (tests/finding_runs.py),
    started as the test run began; read their store, never write it."""
    started = pytestconfig.stash.get(_FINDINGS, None)
    if started is None:  # run some other way: start now
        started = _start_findings(pytestconfig)
    folder, process, begun = started
    return findings.finish(process, folder, begun)


# PostgreSQL: throwaway servers of the tests' own (tests/pgserver.py). Without the server
# binaries the tests that ask for one skip; with CI=true they fail instead.


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pgserver.PgServer]:
    """One PostgreSQL server for the whole session, started the first time a test asks
    (about a second); share it through `pg_url`, never stop it."""
    pgserver.require_binaries()
    with pgserver.PgServer() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: pgserver.PgServer) -> Iterator[str]:
    """A fresh empty database on the session's server, dropped after the test:
    postgresql://blockviz@127.0.0.1:PORT/test_..."""
    url = pg_server.create_database()
    yield url
    pg_server.drop_database(url)


@pytest.fixture
def own_pg_server() -> Iterator[pgserver.PgServer]:
    """A PostgreSQL server for this test alone, to stop() and start() again (an outage);
    closed and removed after the test. Its databases come from its create_database()."""
    pgserver.require_binaries()
    with pgserver.PgServer() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"], ids=["sqlite", "pg"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store test keeps its store, once per backend: the SQLite file
    `tmp_path/runs/blockviz.db` (not created yet), or the URL of a fresh empty PostgreSQL
    database (`pg_url`; that variant skips without PostgreSQL, fails under CI=true) whose
    run folders are under `tmp_path/runs`."""
    if request.param == "sqlite":
        return str(tmp_path / "runs" / "blockviz.db")
    # Its run folders go under tmp_path too (the URL's `runs` parameter), never into the
    # working directory.
    return f"{request.getfixturevalue('pg_url')}?runs={tmp_path / 'runs'}"
