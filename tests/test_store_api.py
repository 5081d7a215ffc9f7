"""The store's one write transaction: commit, roll back, refuse to nest, and what a locked
store does to it (a deferring writer keeps its rows and retries).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from blockviz.store import RunStore, StoreError, StoreLocked, writes


def _insert(path: Path, table: str, row: dict[str, Any]) -> None:
    with sqlite3.connect(path) as conn:
        columns = ", ".join(row)
        conn.execute(
            f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(row))})",
            list(row.values()),
        )
    conn.close()


@pytest.fixture
def written(tmp_path: Path) -> Path:
    """A store holding two runs, written as raw SQL."""
    path = tmp_path / "runs.db"
    RunStore(path).close()  # the schema, and nothing else
    _insert(path, "runs", {"id": 7, "name": "pre-ln lr=1e-3", "status": "completed"})
    _insert(path, "runs", {"id": 8, "name": "bare"})
    return path


# -- transaction() ----------------------------------------------------------------------


def _notes(path: Path, run_id: int) -> str | None:
    """The run's notes as another connection sees them (committed state only)."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT notes FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
    finally:
        conn.close()


def test_a_transaction_commits_when_its_block_ends(written: Path):
    with RunStore(written) as store:
        with store.db.transaction() as conn:
            conn.execute("UPDATE runs SET notes = 'kept' WHERE id = 8")
            assert conn.in_transaction and _notes(written, 8) is None
        assert not store.conn.in_transaction
        assert _notes(written, 8) == "kept"


def test_a_transaction_rolls_back_when_its_block_raises(written: Path):
    with RunStore(written) as store:
        with pytest.raises(ValueError, match="boom"), store.db.transaction() as conn:
            conn.execute("UPDATE runs SET notes = 'lost' WHERE id = 8")
            raise ValueError("boom")
        assert not store.conn.in_transaction
        assert _notes(written, 8) is None
        with store.db.transaction() as conn:  # the store is usable afterwards
            conn.execute("UPDATE runs SET notes = 'later' WHERE id = 8")
    assert _notes(written, 8) == "later"


def test_a_transaction_inside_a_transaction_is_refused(written: Path):
    with RunStore(written) as store:
        with pytest.raises(RuntimeError, match="already open"), store.db.transaction() as conn:
            conn.execute("UPDATE runs SET notes = 'outer' WHERE id = 8")
            with store.db.transaction():
                pass
        assert not store.conn.in_transaction
        assert _notes(written, 8) is None  # the outer one was rolled back


def test_a_write_that_fails_halfway_leaves_nothing(written: Path):
    with RunStore(written) as store:
        with pytest.raises(StoreError, match="already taken"):
            store.rename_run(8, "pre-ln lr=1e-3")
        assert not store.conn.in_transaction
        assert store.get_run(8)["name"] == "bare"


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def test_a_locked_store_fails_the_begin_with_nothing_to_roll_back(written: Path):
    holder = _hold_write_lock(written)
    try:
        with RunStore(written, busy_timeout_s=0.2) as store:
            locked = pytest.raises(sqlite3.OperationalError, match="locked")
            with locked, store.db.transaction():
                pytest.fail("the block ran without the lock")
            assert not store.conn.in_transaction
            with pytest.raises(StoreLocked):
                store.update_run(8, notes="x")  # a public method words it
            holder.execute("ROLLBACK")
            store.update_run(8, notes="x")
    finally:
        holder.close()
    assert _notes(written, 8) == "x"


def test_a_deferring_writer_keeps_its_rows_while_locked_and_writes_them_after(written: Path):
    with RunStore(written, busy_timeout_s=0.2, defer_when_busy=True, flush_seconds=None) as store:
        holder = _hold_write_lock(written)
        try:
            store.log_scalars(8, [(step, "train/loss", 1.0) for step in range(5)])
            assert store.flush() is False  # locked: kept, not raised
            assert store.flush() is False  # retried, still locked
            assert not store.conn.in_transaction
            assert len(store.buffered_rows(8)["scalars"]) == 5
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.flush() is True
        assert store.scalars(8)["step"].tolist() == [0, 1, 2, 3, 4]
        assert store.buffered_rows(8) == {}


def test_a_deferring_writer_past_its_row_limit_waits_for_the_lock(written: Path, monkeypatch):
    monkeypatch.setattr(writes, "MAX_DEFERRED_ROWS", 3)
    with RunStore(written, busy_timeout_s=0.2, defer_when_busy=True, flush_seconds=None) as store:
        holder = _hold_write_lock(written)
        release = threading.Timer(1.0, lambda: (holder.execute("ROLLBACK"), holder.close()))
        store.log_scalars(8, [(step, "train/loss", 1.0) for step in range(2)])
        started = time.monotonic()
        release.start()
        try:
            store.log_scalars(8, [(step, "train/loss", 1.0) for step in range(2, 4)])
            assert store.flush() is True  # more than 3 rows held: it retried until written
        finally:
            release.join()
        assert time.monotonic() - started >= 0.9
        assert store.scalars(8)["step"].tolist() == [0, 1, 2, 3]
