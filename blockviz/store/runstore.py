"""RunStore: the store's parts (one concern per module) combined into one object."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from blockviz.store.connection import BUSY_TIMEOUT_S, _Connection, default_store_path
from blockviz.store.errors import StoreError, StoreLocked, is_readonly_error
from blockviz.store.liveness import _Liveness
from blockviz.store.queue import _Queue
from blockviz.store.reads import _Reads
from blockviz.store.runs import _Runs
from blockviz.store.schema import METRIC_TABLES, RUN_COLUMNS
from blockviz.store.studies import _Studies
from blockviz.store.writes import _Writes


class RunStore(_Runs, _Studies, _Queue, _Liveness, _Writes, _Reads, _Connection):
    """One SQLite run store: buffered metric writes, run lifecycle, DataFrame reads.

    connection.py opens and closes the file, runs.py keeps the runs table, studies.py the
    studies and their runs, queue.py hands
    out running slots, liveness.py tracks which runs are alive, writes.py buffers metric
    rows, reads.py returns frames.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        readonly: bool = False,
        flush_rows: int = 5000,
        flush_seconds: float | None = 2.0,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
        defer_when_busy: bool = False,
        create: bool = True,
    ) -> None:
        self.path = Path(path).expanduser() if path is not None else default_store_path()
        self.path = self.path.absolute()
        # False: the file must exist already (a run or study it holds is being worked on);
        # a missing one is a StoreError, never a new empty store.
        self.create = create
        # A training writer: a flush that finds the store locked keeps its rows and
        # returns, so a long lock held by another process never stops training.
        self.defer_when_busy = defer_when_busy
        self._deferred_since: float | None = None  # monotonic start of a lock episode
        self._legacy_upto = 0  # runs up to this id may keep <workspace>/<id> folders
        self._run_columns = RUN_COLUMNS  # those the file has (a read-only v1 file: fewer)
        # How long a statement waits for another process's lock before giving up: long for
        # training writers, short for a page that should say so rather than hang.
        self.busy_timeout_s = busy_timeout_s
        self.readonly = readonly
        self.flush_rows = flush_rows
        # Also flush when the oldest buffered row is this old, so a live page sees a
        # run that logs a few rows per step within seconds, not every 5,000 rows.
        self.flush_seconds = flush_seconds
        self._lock = threading.RLock()
        self._buffers: dict[str, list[tuple[Any, ...]]] = {t: [] for t in METRIC_TABLES}
        self._buffered = 0
        self._heartbeats: dict[int, tuple[float, int]] = {}  # run -> (time, step) not yet written
        self._beats_written: dict[int, float] = {}  # run -> monotonic time of its last write
        self._last_flush = time.monotonic()
        self._conn: sqlite3.Connection | None = None
        self._conn = self._open()
        self._identity = self._file_identity()  # which file this store opened

    @classmethod
    def open_readable(cls, path: str | Path | None = None, **options: Any) -> RunStore:
        """Open for reading: read-write when allowed (readers mark dead runs), else read-only.

        `runs`, `show`, `export` and the pages work on a store in a read-only file or
        folder; only training needs to write. A locked store is not reopened read-only,
        and when the read-only open fails too, the first error (why writing was refused)
        is raised.
        """
        try:
            return cls(path, **options)
        except StoreLocked:
            raise
        except StoreError as exc:
            target = Path(path).expanduser() if path is not None else default_store_path()
            if not target.is_file() or not is_readonly_error(exc):
                raise
            try:
                return cls(path, readonly=True, **options)
            except StoreError:
                raise exc from None

    def __repr__(self) -> str:
        return f"RunStore({str(self.path)!r})"


def checked(store: RunStore) -> RunStore:
    """The store after `check_integrity`; closed and StoreError when it is damaged."""
    try:
        store.check_integrity()
    except StoreError:
        store.close()
        raise
    return store
