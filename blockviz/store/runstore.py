"""RunStore: the store's parts (one concern per module), composed around one connection.

A RunStore holds one part per concern, each an object sharing the store's `Connection`
(its file, its lock, its transactions) and holding the other parts it calls:

    store.db        Connection   the file: open, integrity, close, transaction(), run folders
    store.lookup    RunLookup    a run given by id or name -> its id (resolve)
    store.writes    Writes       buffered log_* rows and heartbeats, flush, restore, truncate
    store.reads     Reads        scalars, layer_stats, histograms, samples, attention, finals
    store.runs      Runs         the runs table: create, update, rename, delete, get_run
    store.liveness  Liveness     heartbeat, reap_dead, settle_step
    store.queue     Queue        claim_slot, queued_still
    store.studies   Studies      the studies table and their runs

Every public method of a part is also a method of RunStore by the same name (`store.get_run`
is `store.runs.get_run`), so callers keep one object to hold; the table below says which
part owns which method.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from blockviz.store.connection import Connection
from blockviz.store.errors import StoreError, StoreLocked, is_readonly_error
from blockviz.store.liveness import Liveness
from blockviz.store.location import Location, parse_location
from blockviz.store.queue import Queue
from blockviz.store.reads import Reads
from blockviz.store.runs import RunLookup, Runs
from blockviz.store.studies import Studies
from blockviz.store.writes import Writes

P = ParamSpec("P")
R = TypeVar("R")


class Delegated(Generic[P, R]):
    """A RunStore method that is the same method of one of its parts (`store.<part>`)."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.part = part
        self.name = method.__name__
        self.__doc__ = method.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.name:
            raise TypeError(f"RunStore.{name} delegates to {self.part}.{self.name}: one name")

    @overload
    def __get__(self, store: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, store: RunStore, owner: type | None = None) -> Callable[P, R]: ...
    def __get__(self, store: RunStore | None, owner: type | None = None) -> Any:
        if store is None:
            return self
        return getattr(getattr(store, self.part), self.name)


class RunStore:
    """One run store: buffered metric writes, run lifecycle, DataFrame reads.

    `path` is an SQLite file path or a postgresql:// URL (location.py); None: the
    $BLOCKVIZ_STORE default. Built from parts (see the module docstring); its methods are
    theirs.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        readonly: bool = False,
        flush_rows: int = 5000,
        flush_seconds: float | None = 2.0,
        busy_timeout_s: float | None = None,
        defer_when_busy: bool = False,
        create: bool = True,
        wait_for_server: bool | None = None,
    ) -> None:
        location = parse_location(path)
        # create=False: the file must exist already (a run or study it holds is being
        # worked on). defer_when_busy: a training writer, whose flush keeps its rows when
        # another process holds the lock (writes.py). wait_for_server: whether opening
        # waits out a server that does not answer (default: when create=False).
        # busy_timeout_s: how long a call waits for a lock or a lost server (None:
        # $BLOCKVIZ_BUSY_TIMEOUT_S, else 30 s; connection.default_busy_timeout_s).
        self.db = Connection(
            location,
            readonly=readonly,
            create=create,
            busy_timeout_s=busy_timeout_s,
            defer_when_busy=defer_when_busy,
            wait_for_server=wait_for_server,
        )
        self.lookup = RunLookup(self.db)
        self.writes = Writes(
            self.db, self.lookup, flush_rows=flush_rows, flush_seconds=flush_seconds
        )
        self.reads = Reads(self.db, self.lookup)
        self.runs = Runs(self.db, self.lookup, self.writes)
        self.liveness = Liveness(self.db, self.lookup, self.writes, self.reads)
        self.queue = Queue(self.db, self.lookup, self.liveness)
        self.studies = Studies(self.db, self.runs, self.writes)

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
            location = parse_location(path)
            if location.path is None or not location.path.is_file():
                raise
            if not is_readonly_error(exc):
                raise
            try:
                return cls(path, readonly=True, **options)
            except StoreError:
                raise exc from None

    # -- the file -----------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The store file (absolute); a server store's workspace folder."""
        return self.db.path

    @property
    def location(self) -> Location:
        """Where the store lives: `location.text` opens it from another process."""
        return self.db.location

    @property
    def where(self) -> str:
        """How messages name the store: its file, or its server URL without a password."""
        return self.db.where

    @property
    def is_server(self) -> bool:
        """Whether the store is a PostgreSQL server, not an SQLite file."""
        return self.db.is_server

    @property
    def readonly(self) -> bool:
        """Whether the store was opened read-only."""
        return self.db.readonly

    @property
    def conn(self) -> Any:
        """The open connection (raises StoreError when closed)."""
        return self.db.conn

    @property
    def workspace(self) -> Path:
        """The folder holding the store file (and uploads)."""
        return self.db.workspace

    @property
    def runs_root(self) -> Path:
        """<workspace>/<store file name>.runs: the run folders of this store and no other."""
        return self.db.runs_root

    @property
    def ledger_root(self) -> Path:
        """<workspace>/<store file name>.ledger: ledger exports imported into this store."""
        return self.db.ledger_root

    def close(self) -> None:
        """Flush what is buffered and close the connection (idempotent)."""
        with self.db.lock:
            if self.db.closed:
                return
            try:
                if not self.readonly:
                    self.writes.flush()
            finally:
                self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunStore({self.where!r})"

    check_integrity = Delegated("db", Connection.check_integrity)
    file_changed = Delegated("db", Connection.file_changed)
    run_dir = Delegated("db", Connection.run_dir)

    # -- the parts' methods -------------------------------------------------------------

    resolve = Delegated("lookup", RunLookup.resolve)

    create_run = Delegated("runs", Runs.create_run)
    update_run = Delegated("runs", Runs.update_run)
    take_over = Delegated("runs", Runs.take_over)
    set_tags = Delegated("runs", Runs.set_tags)
    set_notes = Delegated("runs", Runs.set_notes)
    rename_run = Delegated("runs", Runs.rename_run)
    delete_run = Delegated("runs", Runs.delete_run)
    get_run = Delegated("runs", Runs.get_run)
    twins_of = Delegated("runs", Runs.twins_of)
    replays_stamp = Delegated("runs", Runs.replays_stamp)
    runs_frame = Delegated("runs", Runs.runs_frame)
    run_statuses = Delegated("runs", Runs.run_statuses)

    create_study = Delegated("studies", Studies.create_study)
    study_dir = Delegated("studies", Studies.study_dir)
    get_study = Delegated("studies", Studies.get_study)
    update_study = Delegated("studies", Studies.update_study)
    studies_frame = Delegated("studies", Studies.studies_frame)
    study_runs = Delegated("studies", Studies.study_runs)
    claim_study_run = Delegated("studies", Studies.claim_study_run)
    claim_study_runs = Delegated("studies", Studies.claim_study_runs)
    stop_unclaimed = Delegated("studies", Studies.stop_unclaimed)
    requeue_runs = Delegated("studies", Studies.requeue_runs)
    study_active_runs = Delegated("studies", Studies.study_active_runs)
    settle_study = Delegated("studies", Studies.settle_study)

    claim_slot = Delegated("queue", Queue.claim_slot)
    queued_still = Delegated("queue", Queue.queued_still)

    heartbeat = Delegated("liveness", Liveness.heartbeat)
    reap_dead = Delegated("liveness", Liveness.reap_dead)
    request_stop = Delegated("liveness", Liveness.request_stop)
    stop_requested = Delegated("liveness", Liveness.stop_requested)
    settle_step = Delegated("liveness", Liveness.settle_step)

    log_scalars = Delegated("writes", Writes.log_scalars)
    log_metrics = Delegated("writes", Writes.log_metrics)
    log_layer_stats = Delegated("writes", Writes.log_layer_stats)
    log_histogram = Delegated("writes", Writes.log_histogram)
    log_sample = Delegated("writes", Writes.log_sample)
    log_attention = Delegated("writes", Writes.log_attention)
    flush = Delegated("writes", Writes.flush)
    buffered_rows = Delegated("writes", Writes.buffered_rows)
    restore_rows = Delegated("writes", Writes.restore_rows)
    truncate_after = Delegated("writes", Writes.truncate_after)
    copy_history = Delegated("writes", Writes.copy_history)
    bulk_load = Delegated("writes", Writes.bulk_load)

    scalars = Delegated("reads", Reads.scalars)
    scalar_names = Delegated("reads", Reads.scalar_names)
    max_step = Delegated("reads", Reads.max_step)
    layer_stats = Delegated("reads", Reads.layer_stats)
    layer_steps = Delegated("reads", Reads.layer_steps)
    histograms = Delegated("reads", Reads.histograms)
    samples = Delegated("reads", Reads.samples)
    attention_steps = Delegated("reads", Reads.attention_steps)
    attention = Delegated("reads", Reads.attention)
    final_metrics = Delegated("reads", Reads.final_metrics)


def checked(store: RunStore) -> RunStore:
    """The store after `check_integrity`; closed and StoreError when it is damaged."""
    try:
        store.check_integrity()
    except StoreError:
        store.close()
        raise
    return store
