"""Opening a store: the connection, its pragmas, its lock, transactions, run folders.

`Connection` is the part of RunStore every other part shares (`Part.db`). Every public
method of a part runs under `guarded`: the store's one lock (Streamlit reads from several
threads) and database errors turned into StoreError naming the store. A part writes
inside `db.transaction()`.

A store is an SQLite file or a PostgreSQL server (`location.py`); the server's driver
sits behind the same calls (`server.py`). A server that goes away is waited for, as a
locked file is: `guarded` reconnects and runs the call again for up to the busy timeout
(a training writer: one second, then its rows wait in memory, see writes.py).
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from blockviz.store import server
from blockviz.store.errors import (
    CORRUPT_ADVICE,
    StoreError,
    StoreUnreachable,
    is_busy,
    missing_store,
    store_error,
)
from blockviz.store.location import Location
from blockviz.store.schema import RUN_COLUMNS, check_schema

# How long a call waits for another process's lock (or for a server that went away)
# before it fails; $BLOCKVIZ_BUSY_TIMEOUT_S sets another (`default_busy_timeout_s`).
BUSY_TIMEOUT_S = 30.0
BUSY_TIMEOUT_ENV = "BLOCKVIZ_BUSY_TIMEOUT_S"
MIN_SQLITE = (3, 35)  # RETURNING (3.35) and INSERT ... ON CONFLICT DO UPDATE (3.24)
RUN_DIRS_SUFFIX = ".runs"  # <workspace>/<store file name>.runs/<id>: each store its own
STUDY_DIRS_SUFFIX = ".studies"  # <workspace>/<store file name>.studies/<id>
LEDGER_DIR_SUFFIX = ".ledger"  # <workspace>/<store file name>.ledger/: imported ledgers
# A training writer (defer_when_busy) that finds the store locked keeps its rows in memory
# and retries, waiting this long per try so training goes on meanwhile (see writes.py).
DEFER_BUSY_TIMEOUT_S = 1.0


def default_busy_timeout_s() -> float:
    """$BLOCKVIZ_BUSY_TIMEOUT_S, else BUSY_TIMEOUT_S: a store's busy timeout in seconds
    when its opener gives none. StoreError when the variable is no positive number."""
    text = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
    if not text:
        return BUSY_TIMEOUT_S
    with contextlib.suppress(ValueError):
        if 0 < (value := float(text)) < math.inf:
            return value
    raise StoreError(
        f"{BUSY_TIMEOUT_ENV}={text[:40]!r} is not allowed; it must be a positive number "
        f"of seconds (unset: {BUSY_TIMEOUT_S:g})"
    )


AnyPart = TypeVar("AnyPart", bound="Part")
P = ParamSpec("P")
R = TypeVar("R")


def guarded(
    method: Callable[Concatenate[AnyPart, P], R],
) -> Callable[Concatenate[AnyPart, P], R]:
    """Hold the store's lock and turn database errors into StoreError naming the store.

    The outermost guarded call of a server store whose connection was lost reconnects and
    runs again, for up to the busy timeout; an inner call lets the error through to it.
    """

    @functools.wraps(method)
    def wrapper(self: AnyPart, *args: P.args, **kwargs: P.kwargs) -> R:
        db = self.db
        with db.lock:
            if db.closed:
                raise StoreError(f"the run store {db.where} is closed")
            if db.depth:
                return method(self, *args, **kwargs)
            deadline: float | None = None
            db.depth += 1
            db.committed = False
            try:
                while True:
                    try:
                        return method(self, *args, **kwargs)
                    except db.errors as exc:
                        if deadline is None:
                            deadline = time.monotonic() + db.wait_s()
                        if not db.waited_for_server(exc, deadline):
                            raise db.error_from(exc) from exc
            finally:
                db.depth -= 1

    return wrapper


class Connection:
    """The part of RunStore that owns the file or the server connection: open, check,
    close, transactions, folders.

    The other parts share one (`Part.db`): its connection, its lock, its location.
    """

    def __init__(
        self,
        location: Location,
        *,
        readonly: bool,
        create: bool,
        busy_timeout_s: float | None,
        defer_when_busy: bool,
        wait_for_server: bool | None = None,
    ) -> None:
        self.location = location
        if location.password is not None:
            # The processes this one starts open the store from `location.text`, which has
            # no password: libpq reads it from here (never from their command lines).
            os.environ["PGPASSWORD"] = location.password
        # The file; a server store's workspace folder (uploads, run and study folders).
        self.path = location.workspace_or_file()
        self.where = location.where  # how messages name the store (no password)
        self.is_server = location.is_server
        self.errors: tuple[type[BaseException], ...] = (sqlite3.Error, *server.driver_errors())
        self.integrity_errors = (sqlite3.IntegrityError, *server.integrity_errors())
        self.depth = 0  # guarded calls in progress (the outermost one waits for a server)
        self.committed = False  # whether the outermost guarded call has sent a COMMIT
        self.readonly = readonly
        # False: the file must exist already (a run or study it holds is being worked on);
        # a missing one is a StoreError, never a new empty store.
        self.create = create
        # Whether opening waits out a server that does not answer: by default only a store
        # that must exist already (a run or study being worked on); never a command that
        # reads, which says at once that it cannot reach the store.
        self.wait_for_server = not create if wait_for_server is None else wait_for_server
        # How long a statement waits for another process's lock before giving up: long for
        # training writers, short for a page that should say so rather than hang.
        self.busy_timeout_s = busy_timeout_s or default_busy_timeout_s()
        # A training writer: a flush that finds the store locked keeps its rows and
        # returns, so a long lock held by another process never stops training.
        self.defer_when_busy = defer_when_busy
        self.lock = threading.RLock()
        self._legacy_upto = 0  # runs up to this id may keep <workspace>/<id> folders
        self.run_columns = RUN_COLUMNS  # those the file has (a read-only v1 file: fewer)
        self._in_transaction = False
        self._conn: Any = None
        self._conn = self._open_server() if self.is_server else self._open()
        self._identity = self._file_identity()  # (st_dev, st_ino) of the file opened

    # -- opening ------------------------------------------------------------------------

    def _open_server(self) -> server.ServerConnection:
        """Connect to the server, create, upgrade or check the schema.

        A store that must exist already (create=False: a run or a study being worked on)
        waits up to the busy timeout for a server that does not answer, as a call on an
        open store does (`wait_for_server`); a command opening a store says at once that it
        cannot reach it.
        """
        deadline = time.monotonic() + (self.busy_timeout_s if self.wait_for_server else 0.0)
        try:
            conn = server.retrying(
                lambda: server.ServerConnection(
                    self.location, readonly=self.readonly, connect_timeout_s=self.wait_s()
                ),
                deadline,
            )
        except self.errors as exc:
            raise self.error_from(exc, opening=True) from None
        return self._with_schema(conn)

    def _with_schema(self, conn: Any) -> Any:
        """The connection once its schema is created, upgraded or checked; closed when
        that fails."""
        try:
            if not self.is_server:
                self._configure(conn)
            self._legacy_upto, self.run_columns = check_schema(
                conn, self.where, self.readonly, create=self.create
            )
        except StoreError:
            conn.close()
            raise
        except self.errors as exc:
            conn.close()
            raise self.error_from(exc, opening=True) from None
        return conn

    def waited_for_server(self, exc: BaseException, deadline: float) -> bool:
        """Whether `exc` lost the server connection and it came back before `deadline`."""
        if not self.is_server or not server.connection_lost(exc) or self._conn is None:
            return False
        if self.committed or time.monotonic() > deadline:
            # A COMMIT was sent in this call: it may have landed before the connection
            # went, so the call is not run again (a second create_run would be a second run).
            return False
        return server.wait_for_server(self._conn, deadline)

    def is_transient(self, exc: BaseException) -> bool:
        """A locked file or an unreachable server: a writer keeps its rows and tries later."""
        if isinstance(exc, sqlite3.OperationalError):
            return is_busy(exc)
        return self.is_server and server.transient(exc)

    def _open(self) -> sqlite3.Connection:
        """Connect, set the pragmas, create, upgrade or check the schema."""
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            wanted = ".".join(map(str, MIN_SQLITE))
            raise StoreError(
                f"blockviz needs SQLite {wanted} or newer (RETURNING, upserts); this Python "
                f"has SQLite {sqlite3.sqlite_version}: use a newer Python, or a "
                "postgresql:// store"
            )
        if self.path.is_dir():
            raise StoreError(f"the run store path {self.path} is a directory; give a file path")
        if self.readonly:
            return self._open_readonly()
        if not self.create:
            if not self.path.is_file():
                raise StoreError(missing_store(self.where, "no such file"))
            # mode=rw: a file removed since the check above is an error, not a new store.
            return self._connect(self.path.as_uri() + "?mode=rw", uri=True)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the run store folder {self.path.parent} "
                f"({exc.strerror or exc}); set --store or BLOCKVIZ_STORE to a writable path"
            ) from None
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise StoreError(
                f"the run store {self.path} is not writable; "
                "set --store or BLOCKVIZ_STORE to a writable path"
            )
        created = [p for p in self._sqlite_files() if not p.exists()]
        try:
            return self._connect(str(self.path), uri=False)
        except StoreError:
            # A store that could not be set up (a full disk, say) leaves no empty files.
            if self.path in created:
                self._remove_if_empty(created)
            raise

    def _remove_if_empty(self, created: list[Path]) -> None:
        """Remove the store file this open created if it is still empty, with its sidecars."""
        with contextlib.suppress(OSError):
            if self.path.stat().st_size > 0:
                return  # another process wrote a schema into it meanwhile: not ours to remove
            for leftover in created:
                leftover.unlink(missing_ok=True)

    def _file_identity(self) -> tuple[int, int] | None:
        """(st_dev, st_ino) of the file at the store's path; None when there is none."""
        if self.is_server:
            return None
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return stat.st_dev, stat.st_ino

    def file_changed(self) -> str | None:
        """'removed' or 'replaced' when the file at the store's path is no longer the one
        this store opened (its connection still writes to that one); None while it is
        (always for a server store)."""
        if self.is_server:
            return None
        now = self._file_identity()
        if now == self._identity:
            return None
        return "removed" if now is None else "replaced"

    def _sqlite_files(self) -> list[Path]:
        return [self.path, *(self.path.with_name(self.path.name + s) for s in ("-wal", "-shm"))]

    def _open_readonly(self) -> sqlite3.Connection:
        """Open without writing anything; works in a read-only file or folder too."""
        if not self.path.exists():
            raise StoreError(missing_store(self.where, "no such file"))
        base = self.path.as_uri()
        try:
            return self._connect(base + "?mode=ro", uri=True)
        except StoreError as exc:
            if "unable to open" not in str(exc) and "readonly" not in str(exc).replace("-", ""):
                raise
        # A WAL file in a folder we cannot write: SQLite cannot create the shared-memory
        # file it reads through. Nobody can be writing there either, so read it as an
        # immutable file.
        return self._connect(base + "?mode=ro&immutable=1", uri=True)

    def _connect(self, target: str, *, uri: bool) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                target,
                uri=uri,
                timeout=self.wait_s(),
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # Streamlit reads from several threads; `lock` serialises
            )
        except sqlite3.Error as exc:
            raise self.error_from(exc, opening=True) from None
        return self._with_schema(conn)

    def wait_s(self) -> float:
        """How long a statement waits for another process's lock, and a call for a lost
        server, before it fails: the busy timeout (a training writer: one second)."""
        if self.defer_when_busy:
            return min(self.busy_timeout_s, DEFER_BUSY_TIMEOUT_S)
        return self.busy_timeout_s

    def _configure(self, conn: sqlite3.Connection) -> None:
        """Pragmas: WAL so readers never block the writer, a busy timeout, FKs."""
        conn.execute(f"PRAGMA busy_timeout = {int(self.wait_s() * 1000)}")
        if not self.readonly:
            conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable across application crashes in WAL mode; only a power cut
            # can lose the last commits, which for metrics is fine.
            conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA cache_size = -32768")  # 32 MiB per connection
        conn.execute("PRAGMA temp_store = MEMORY")  # ORDER BY sorts stay off the disk

    def error_from(self, exc: BaseException, *, opening: bool = False) -> StoreError:
        """A StoreError that says what went wrong with which store."""
        if isinstance(exc, sqlite3.Error):
            return store_error(exc, self.path, self.busy_timeout_s, opening=opening)
        if server.connection_lost(exc):  # opening or in use: the server may come back
            return StoreUnreachable(str(server.server_error(exc, self.where)))
        return server.server_error(exc, self.where, opening=opening)

    def check_integrity(self) -> None:
        """StoreError when the file is damaged (`PRAGMA quick_check`); readers call it once.

        quick_check reads every page but skips the index-content comparison of a full
        integrity_check; benchmarks/bench_quick_check.py measures what it costs (0.31 s for a
        100 MiB store of 20 runs x 5,000 steps x 12 layers). A server checks its own pages.
        """
        if self.is_server:
            return
        try:
            with self.lock:
                rows = self.conn.execute("PRAGMA quick_check(3)").fetchall()
        except sqlite3.Error as exc:
            raise self.error_from(exc) from None
        problems = [" ".join(str(row[0]).split()) for row in rows if row and row[0] != "ok"]
        if problems:
            raise StoreError(
                f"the run store {self.path} is corrupt ({'; '.join(problems)[:160]}); "
                f"{CORRUPT_ADVICE}"
            )

    # -- run folders --------------------------------------------------------------------

    @property
    def workspace(self) -> Path:
        """The folder holding the store file (and uploads); a server store's own folder."""
        return self.location.workspace

    @property
    def runs_root(self) -> Path:
        """The run folders of this store and no other (`folder`)."""
        return self.folder(RUN_DIRS_SUFFIX)

    @property
    def studies_root(self) -> Path:
        """The study folders (workers' logs, jobs) of this store (`folder`)."""
        return self.folder(STUDY_DIRS_SUFFIX)

    @property
    def ledger_root(self) -> Path:
        """The ledger exports imported into this store's ledger (`views.ledger.imports`)."""
        return self.folder(LEDGER_DIR_SUFFIX)

    def folder(self, suffix: str) -> Path:
        """<workspace>/<store file name><suffix> (a server store: <workspace>/<suffix
        without its dot>): a folder this store owns beside its file."""
        if self.is_server:
            return self.workspace / suffix.lstrip(".")
        return self.workspace / (self.path.name + suffix)

    def run_dir(self, run_id: int) -> Path:
        """<store>.runs/<run_id>: built from the integer id only, never from a name.

        A run that an upgraded version 1 store already held keeps its old
        <workspace>/<id> folder while that folder is there and the new one is not.
        """
        if isinstance(run_id, bool | str):
            raise StoreError(f"run id {run_id!r} must be an integer")
        try:
            number = operator.index(run_id)
        except TypeError:
            raise StoreError(f"run id {run_id!r} must be an integer") from None
        if number < 1:
            raise StoreError(f"run id {number} must be a positive integer")
        folder = self.runs_root / str(number)
        if number <= self._legacy_upto and not folder.exists():
            legacy = self.workspace / str(number)
            if legacy.is_dir() and not legacy.is_symlink():
                return legacy
        return folder

    def remove_run_dir(self, run_id: int) -> None:
        """rmtree <workspace>/<id>, but only a real folder that lies inside the workspace."""
        folder = self.run_dir(run_id)
        if folder.is_symlink():
            folder.unlink()  # the link only: never follow it out of the workspace
            return
        if not folder.is_dir():
            return
        parent = folder.parent.resolve()
        if folder.resolve().parent == parent and parent in (
            self.workspace.resolve(),
            self.runs_root.resolve(),
        ):
            shutil.rmtree(folder, ignore_errors=True)

    # -- lifetime and transactions ------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent); RunStore.close flushes the buffers first."""
        with self.lock:
            if self._conn is not None:
                with contextlib.suppress(*self.errors):
                    self._conn.close()
                self._conn = None

    @property
    def closed(self) -> bool:
        """Whether the connection is closed."""
        return self._conn is None

    @property
    def conn(self) -> Any:
        """The open connection (raises StoreError when closed): an sqlite3.Connection, or a
        server.ServerConnection that answers the same calls. A server connection lost
        earlier is opened again first (the driver's error when the server still is away).
        """
        if self._conn is None:
            raise StoreError(f"the run store {self.where} is closed")
        if self.is_server and self._conn.broken:
            self._conn.reconnect()
        return self._conn

    @contextlib.contextmanager
    def transaction(self, *, serial: bool = True) -> Iterator[Any]:
        """One write transaction: BEGIN IMMEDIATE, COMMIT when the block ends, ROLLBACK when
        it raises (the exception goes on). Yields the connection.

        On a server, a `serial` transaction (every one but a metric flush) first takes one
        advisory lock, so read-then-write transactions run one at a time as on SQLite.

        IMMEDIATE takes the write lock up front, so a busy store waits (busy_timeout)
        instead of failing halfway through a read-then-write transaction; a BEGIN that
        times out raises sqlite3.OperationalError with nothing to roll back (a deferring
        writer's flush catches it and retries). A COMMIT that fails is rolled back too.
        Transactions do not nest: a second one opened inside the first is a RuntimeError
        (a bug in the store), never a silent join.
        """
        with self.lock:
            if self._in_transaction:
                raise RuntimeError(f"a transaction on {self.path} is already open here")
            conn = self.conn
            conn.execute("BEGIN" if self.is_server else "BEGIN IMMEDIATE")
            self._in_transaction = True
            try:
                if self.is_server and serial:
                    conn.execute(f"SELECT pg_advisory_xact_lock({server.SERIAL_LOCK_KEY})")
                yield conn
                self.committed = True
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(*self.errors):
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                raise
            finally:
                self._in_transaction = False


class Part:
    """A part of RunStore: its methods read and write through the shared Connection."""

    def __init__(self, db: Connection) -> None:
        self.db = db

    @property
    def conn(self) -> Any:
        """The store's open connection (StoreError when closed)."""
        return self.db.conn
