"""Shared test setup: keep every test offline, on one thread, inside tmp dirs."""

import fcntl
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests import finding_runs as findings
from tests import pgserver
from tests.fakes import CORPUS
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


Trained = TypeVar("Trained", RealRuns, findings.FindingRuns)


def _trained_once(
    factory: pytest.TempPathFactory,
    name: str,
    kind: type[Trained],
    train: Callable[[Path], Trained],
) -> Trained:
    """What `train(folder)` returns, trained once per test run. Under pytest-xdist every
    worker asks: the first trains into a folder they share (the parent of their base temp
    folders, this run's own) while the others wait on its lock, then read its record."""
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    record = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        if record.exists():
            saved = json.loads(record.read_text(encoding="utf-8"))
            return kind(Path(saved["path"]), saved["ids"], saved["seconds"])
        folder = root / name
        folder.mkdir()
        runs = train(folder)
        saved = {"path": str(runs.path), "ids": runs.ids, "seconds": runs.seconds}
        record.write_text(json.dumps(saved), encoding="utf-8")
        return runs


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> RealRuns:
    """Real tiny runs (tests/real_runs.py), trained once per test run in a few seconds.

    Their store is shared: read it, or copy runs out of it with `real_runs.copy_run`;
    never write it.
    """
    return _trained_once(tmp_path_factory, "real-runs", RealRuns, train_real_runs)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the findings runs is slow: they train for about 30 s of a core
    (before `-m "not slow"` deselects, hence first). Then the files with a slow or browser
    test go first, each file's tests in their order: pytest-xdist (`--dist loadfile
    --no-loadscope-reorder`) hands out files in this order, so the long files start early
    and the many quick ones fill the end, rather than a long one starting last."""
    for item in items:
        if "finding_runs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    long_files = {
        item.path
        for item in items
        if any(item.iter_markers("slow")) or any(item.iter_markers("browser"))
    }
    items.sort(key=lambda item: item.path not in long_files)  # stable: False sorts first


@pytest.fixture(scope="session")
def finding_runs(tmp_path_factory: pytest.TempPathFactory) -> findings.FindingRuns:
    """Real tiny runs that show what each findings rule looks for (tests/finding_runs.py),
    trained once per test run when the first test asks; read their store, never write it."""
    return _trained_once(
        tmp_path_factory, "finding-runs", findings.FindingRuns, findings.train_finding_runs
    )


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


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The fox corpus (`tests.fakes.CORPUS`) as a text file, one per test module: what
    the tests that train real runs in processes read (a module may define its own)."""
    path = tmp_path_factory.mktemp("data") / "fox.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path
