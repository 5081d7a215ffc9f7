"""The run store: every run of a workspace in one SQLite file (WAL mode).

Training processes write into it while the dashboard and the CLI read from it. Times are
unix seconds; NaN is stored as NULL and read back as NaN, infinities are stored as they are,
so a diverged run's last loss survives.

Schema (version 2; `meta.schema_version` says which one a file holds):

    meta(key TEXT PRIMARY KEY, value TEXT)            schema_version; legacy_run_dirs_upto
    runs(id INTEGER PRIMARY KEY AUTOINCREMENT,        ids are never reused, so
         name TEXT UNIQUE NOT NULL,                   <store>.runs/<id> is a fresh folder
         created, started, ended REAL,
         status TEXT,                                 queued | running | completed | diverged
                                                      | failed | stopped
         config TEXT, dataset TEXT, final TEXT,       JSON: RunConfig, dataset fingerprint,
                                                      final metrics
         device TEXT, precision TEXT, n_params INTEGER,
         pid INTEGER, heartbeat REAL, step INTEGER,   liveness: the writer's pid and last beat
         max_steps INTEGER, diverged_step INTEGER, error TEXT,
         pid_started REAL)                            the writer's start time (pid reuse)
    scalars(run_id, step, name, value)                PRIMARY KEY (run_id, name, step)
    layer_stats(run_id, step, layer, kind,            PRIMARY KEY (run_id, kind, stat, step,
                component, stat, value)                            layer, component)
    histograms(run_id, step, layer, tap, lo, hi,      UNIQUE (run_id, layer, tap, step);
               counts)                                counts: JSON list of ints, equal bins
    samples(run_id, step, prompt, text)               UNIQUE (run_id, step)
    attention(run_id, step, layer, head,              UNIQUE (run_id, step, layer, head);
              tokens, weights)                        JSON list of chars, JSON T x T

scalars and layer_stats are WITHOUT ROWID tables clustered on their primary key, so a
series is one contiguous range on disk. Writing a (run, series, step) again replaces the
old value: a run resumed from a checkpoint overwrites the steps it repeats instead of
drawing them twice (and `truncate_after` first drops what the killed process logged
after its checkpoint). `layer` is -1 for the embeddings and n_layer for the final norm
and LM head.

Version 1 files (before run folders moved under `<store>.runs/` and before process start
times) are upgraded in place when opened for writing: the column and the unique index are
added, and the runs they already hold keep their old `<workspace>/<id>` folders.

Writes are buffered and land in one transaction per flush (a busy timeout lets several
runs share the file). Reads return tidy DataFrames with fixed columns and dtypes, even
when empty, and can downsample to about N points per series while keeping each bucket's
minimum and maximum, so spikes and divergence are never smoothed away. SQL does the
filtering on the primary keys; the bucketing runs in numpy over (step, value) pairs,
because moving rows into Python costs less than SQLite's window-function sort (see
benchmarks/bench_store.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import operator
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np
import pandas as pd

from blockviz.core import procs
from blockviz.core.spec import ACTIVE_STATUSES, STATUSES

SCHEMA_VERSION = 2
DEFAULT_STORE = Path("runs") / "blockviz.db"
BUSY_TIMEOUT_S = 30.0
HEARTBEAT_WRITE_S = 1.0  # a run's heartbeat reaches the file at most this often
STALE_AFTER_S = 30.0  # a run whose process is gone is failed once its beat is this old
RUN_DIRS_SUFFIX = ".runs"  # <workspace>/<store file name>.runs/<id>: each store its own
# A training writer (defer_when_busy) that finds the store locked keeps its rows in memory
# and retries, waiting this long per try so training goes on meanwhile...
DEFER_BUSY_TIMEOUT_S = 1.0
# ...up to this many rows (about 40 MB of scalar and layer rows); past it the writer
# waits for the lock, pausing training, rather than drop a row.
MAX_DEFERRED_ROWS = 200_000
SQLITE_HEADER = b"SQLite format 3\x00"


RunRef = int | str

log = logging.getLogger("blockviz.store")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT UNIQUE NOT NULL,
    created REAL, started REAL, ended REAL,
    status TEXT,
    config TEXT, dataset TEXT,
    device TEXT, precision TEXT, n_params INTEGER,
    pid INTEGER, heartbeat REAL, step INTEGER,
    max_steps INTEGER, diverged_step INTEGER,
    final TEXT, error TEXT,
    pid_started REAL
);
CREATE TABLE IF NOT EXISTS scalars (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    name TEXT NOT NULL,
    value REAL,
    PRIMARY KEY (run_id, name, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS layer_stats (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    layer INTEGER NOT NULL,
    kind TEXT NOT NULL,
    component TEXT NOT NULL,
    stat TEXT NOT NULL,
    value REAL,
    PRIMARY KEY (run_id, kind, stat, step, layer, component)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS histograms (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    layer INTEGER NOT NULL,
    tap TEXT NOT NULL,
    lo REAL, hi REAL,
    counts TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS histograms_series ON histograms (run_id, layer, tap, step);
CREATE TABLE IF NOT EXISTS samples (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    prompt TEXT,
    text TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS samples_series ON samples (run_id, step);
CREATE TABLE IF NOT EXISTS attention (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    layer INTEGER NOT NULL,
    head INTEGER NOT NULL,
    tokens TEXT,
    weights TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS attention_run_step ON attention (run_id, step, layer, head);
"""

_RUN_COLUMNS = (
    "id",
    "name",
    "created",
    "started",
    "ended",
    "status",
    "config",
    "dataset",
    "device",
    "precision",
    "n_params",
    "pid",
    "heartbeat",
    "step",
    "max_steps",
    "diverged_step",
    "final",
    "error",
    "pid_started",
)
_JSON_COLUMNS = ("config", "dataset", "final")
_METRIC_TABLES = ("scalars", "layer_stats", "histograms", "samples", "attention")
# Columns of each table's buffered rows after the run id (step comes first in each).
_TABLE_WIDTHS = {"scalars": 3, "layer_stats": 6, "histograms": 6, "samples": 3, "attention": 5}

# Column -> dtype of every frame the read API returns; empty frames get the same.
_STR = "str"
RUNS_FRAME = {
    "id": "int64",
    "name": _STR,
    "status": _STR,
    "created": "float64",
    "started": "float64",
    "ended": "float64",
    "step": "Int64",
    "max_steps": "Int64",
    "device": _STR,
    "precision": _STR,
    "n_params": "Int64",
    "val_loss": "float64",
    "train_loss": "float64",
    "diverged_step": "Int64",
    "heartbeat": "float64",
    "pid": "Int64",
    "pid_started": "float64",
}
SCALARS_FRAME = {
    "run_id": "int64",
    "run": _STR,
    "step": "int64",
    "name": _STR,
    "value": "float64",
}
LAYER_STATS_FRAME = {
    "run_id": "int64",
    "run": _STR,
    "step": "int64",
    "layer": "int64",
    "kind": _STR,
    "component": _STR,
    "stat": _STR,
    "value": "float64",
}
HISTOGRAMS_FRAME = {
    "run_id": "int64",
    "step": "int64",
    "layer": "int64",
    "tap": _STR,
    "bin": "int64",
    "lo": "float64",
    "hi": "float64",
    "count": "int64",
}
SAMPLES_FRAME = {"run_id": "int64", "step": "int64", "prompt": _STR, "text": _STR}
ATTENTION_FRAME = {
    "run_id": "int64",
    "step": "int64",
    "layer": "int64",
    "head": "int64",
    "query": "int64",
    "key": "int64",
    "query_char": _STR,
    "key_char": _STR,
    "weight": "float64",
}
# How layer_stats columns are read into numpy before the frame is built.
LAYER_STATS_DTYPES: dict[str, Any] = {
    "run_id": np.int64,
    "step": np.int64,
    "layer": np.int64,
    "kind": object,
    "component": object,
    "stat": object,
    "value": float,
}
FINAL_METRICS_FRAME = {
    "run": _STR,
    "status": _STR,
    "steps": "Int64",
    "train_loss": "float64",
    "val_loss": "float64",
    "val_ppl": "float64",
    "val_bpc": "float64",
    "answer_acc": "float64",
    "diverged_at": "Int64",
    "time_s": "float64",
    "tokens_per_sec": "float64",
    "n_params": "Int64",
}

_NAME_MAX = 80
_NAME_EXTRA_CHARS = frozenset("-_.+= ")


CORRUPT_ADVICE = (
    "restore it from a backup, or move it aside to start a new store "
    "(`sqlite3 FILE .recover` may save its rows)"
)


class StoreError(ValueError):
    """A problem with the run store a user can act on; the message says what and where."""


class StoreLocked(StoreError):
    """Another process held the store's lock for longer than the busy timeout."""


def default_store_path() -> Path:
    """$BLOCKVIZ_STORE if set, else runs/blockviz.db relative to the working directory."""
    configured = os.environ.get("BLOCKVIZ_STORE", "").strip()
    return Path(configured).expanduser() if configured else DEFAULT_STORE


def sanitize_name(name: str) -> str:
    """A run name made of letters, digits, `-_.+=` and single spaces, at most 80 chars."""
    spaced = " ".join(str(name).split())  # tabs, newlines and runs of spaces: one space
    kept = "".join(c if c.isalnum() or c in _NAME_EXTRA_CHARS else "-" for c in spaced)
    trimmed = kept[:_NAME_MAX].strip(" -._")
    return trimmed or "run"


READONLY_HINTS = ("not writable", "read-only", "readonly", "unable to open", "cannot create")


def is_readonly_error(exc: StoreError) -> bool:
    """Whether opening failed because the file or its folder cannot be written here."""
    return any(hint in str(exc) for hint in READONLY_HINTS)


def checked(store: RunStore) -> RunStore:
    """The store after `check_integrity`; closed and StoreError when it is damaged."""
    try:
        store.check_integrity()
    except StoreError:
        store.close()
        raise
    return store


def is_id_text(text: str) -> bool:
    """Whether text names a run by id: ASCII digits only (`²` and `٣` are not ids)."""
    return text.isascii() and text.isdigit()


def check_name(name: str) -> str:
    """The sanitised name, or StoreError when it is a bare number (ids own those).

    `show 2` and `?run=2` mean run id 2, so a run named `2` could never be reached by
    its name; every way of naming a run (CLI, sidebar, rename) goes through here.
    """
    clean = sanitize_name(name)
    if is_id_text(clean):
        raise StoreError(
            f"run name {clean!r} is a bare number, which reads as a run id; "
            f"add a letter, e.g. 'run-{clean}'"
        )
    return clean


def _is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def _real(value: Any) -> float | None:
    """A float for SQLite; NaN goes in as NULL by SQLite's own rule."""
    return None if value is None else float(value)


def _convert_column(convert: Callable[[Any], Any], column: Sequence[Any]) -> list[Any]:
    """Apply a converter to a column; floats take the fast builtin unless a None is there."""
    if convert is _real:
        try:
            return list(map(float, column))
        except TypeError:  # a None (missing value) among them
            pass
    return list(map(convert, column))


def _encode_json(value: Any) -> str | None:
    """Dicts and lists become JSON text; objects with `to_json` use it; text passes."""
    if value is None or isinstance(value, str):
        return value
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    return json.dumps(value, sort_keys=True)


def _decode_json(text: str | None) -> Any:
    """Parsed JSON, or None when the column is empty or not JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _frame(rows: Sequence[Sequence[Any]], schema: Mapping[str, str]) -> pd.DataFrame:
    """A DataFrame with exactly the schema's columns and dtypes (also when empty)."""
    frame = pd.DataFrame.from_records(list(rows), columns=list(schema))
    return frame.astype(dict(schema))


def _placeholders(values: Sequence[Any]) -> str:
    return ", ".join("?" * len(values))


def _transpose(rows: Sequence[tuple[Any, ...]], columns: Mapping[str, Any]) -> dict[str, Any]:
    """Query rows as one numpy array per column, in the given dtypes (NULL -> NaN).

    Column by column is several times faster than DataFrame.from_records on large reads.
    """
    if not rows:
        return {name: np.empty(0, dtype=dtype) for name, dtype in columns.items()}
    return {
        name: np.array(list(map(itemgetter(index), rows)), dtype=dtype)
        for index, (name, dtype) in enumerate(columns.items())
    }


def _series_starts(keys: Sequence[np.ndarray]) -> np.ndarray:
    """Row indices where a new series begins, for rows sorted by the key columns."""
    size = len(keys[0]) if keys else 0
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    changed = np.zeros(size, dtype=bool)
    changed[0] = True
    for column in keys:
        changed[1:] |= column[1:] != column[:-1]
    return np.flatnonzero(changed)


def downsample_mask(
    starts: np.ndarray, steps: np.ndarray, values: np.ndarray, max_points: int
) -> np.ndarray:
    """Which rows to keep so each series has about max_points points, extremes intact.

    Rows are sorted by series, then step; `starts` are the series' first rows. A series
    of more than 2N+1 rows (N = max_points) is cut into N step buckets,
    bucket = (step - first step) * N // (span + 1), and keeps per bucket the row with the
    smallest and the one with the largest value, plus one NaN row where the bucket has
    one; every series keeps its last row. Shorter series are kept whole.
    """
    buckets = max(1, int(max_points))
    size = len(steps)
    lengths = np.diff(np.append(starts, size))  # (S,)
    if size == 0 or lengths.max() <= 2 * buckets + 1:
        return np.ones(size, dtype=bool)  # every series is short: nothing to thin
    lasts = starts + lengths - 1
    first_step = np.repeat(steps[starts], lengths)  # (n,)
    span = np.repeat(steps[lasts], lengths) - first_step + 1  # (n,)
    is_long = np.repeat(lengths > 2 * buckets + 1, lengths)  # (n,)
    bucket = (steps - first_step) * buckets // span  # (n,)
    keep = ~is_long
    keep[lasts] = True
    # Buckets are contiguous: steps only grow within a series. Number them in row order.
    series_id = np.repeat(np.arange(len(starts)), lengths)
    new_group = np.ones(size, dtype=bool)
    new_group[1:] = (bucket[1:] != bucket[:-1]) | (series_id[1:] != series_id[:-1])
    group_starts = np.flatnonzero(new_group)
    group = np.cumsum(new_group) - 1
    # Sort by value inside each group (numpy puts NaN last); the groups stay where they were.
    by_value = np.lexsort((values, group))
    non_nan_count = np.add.reduceat((~np.isnan(values)).astype(np.int64), group_starts)
    group_sizes = np.diff(np.append(group_starts, size))
    lowest = by_value[group_starts]
    highest = by_value[group_starts + np.maximum(non_nan_count, 1) - 1]
    last_by_value = by_value[group_starts + group_sizes - 1]  # a NaN if the group has one
    for picked in (lowest, highest, last_by_value):
        keep[picked[is_long[picked]]] = True
    return keep


P = ParamSpec("P")
R = TypeVar("R")


def _guarded(
    method: Callable[Concatenate[RunStore, P], R],
) -> Callable[Concatenate[RunStore, P], R]:
    """Hold the store's lock and turn sqlite3 errors into StoreError naming the file."""

    @functools.wraps(method)
    def wrapper(self: RunStore, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            if self._conn is None:
                raise StoreError(f"the run store {self.path} is closed")
            try:
                return method(self, *args, **kwargs)
            except sqlite3.Error as exc:
                raise self._error_from(exc) from exc

    return wrapper


class RunStore:
    """One SQLite run store: buffered metric writes, run lifecycle, DataFrame reads."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        readonly: bool = False,
        flush_rows: int = 5000,
        flush_seconds: float | None = 2.0,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
        defer_when_busy: bool = False,
    ) -> None:
        self.path = Path(path).expanduser() if path is not None else default_store_path()
        self.path = self.path.absolute()
        # A training writer: a flush that finds the store locked keeps its rows and
        # returns, so a long lock held by another process never stops training.
        self.defer_when_busy = defer_when_busy
        self._deferred_since: float | None = None  # monotonic start of a lock episode
        self._legacy_upto = 0  # runs up to this id may keep <workspace>/<id> folders
        self._run_columns = _RUN_COLUMNS  # those the file has (a read-only v1 file: fewer)
        # How long a statement waits for another process's lock before giving up: long for
        # training writers, short for a page that should say so rather than hang.
        self.busy_timeout_s = busy_timeout_s
        self.readonly = readonly
        self.flush_rows = flush_rows
        # Also flush when the oldest buffered row is this old, so a live page sees a
        # run that logs a few rows per step within seconds, not every 5,000 rows.
        self.flush_seconds = flush_seconds
        self._lock = threading.RLock()
        self._buffers: dict[str, list[tuple[Any, ...]]] = {t: [] for t in _METRIC_TABLES}
        self._buffered = 0
        self._heartbeats: dict[int, tuple[float, int]] = {}  # run -> (time, step) not yet written
        self._beats_written: dict[int, float] = {}  # run -> monotonic time of its last write
        self._last_flush = time.monotonic()
        self._conn: sqlite3.Connection | None = None
        self._conn = self._open()

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

    # -- opening ------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        """Connect, set the pragmas, create, upgrade or check the schema."""
        if self.path.is_dir():
            raise StoreError(f"the run store path {self.path} is a directory; give a file path")
        if self.readonly:
            return self._open_readonly()
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

    def _sqlite_files(self) -> list[Path]:
        return [self.path, *(self.path.with_name(self.path.name + s) for s in ("-wal", "-shm"))]

    def _open_readonly(self) -> sqlite3.Connection:
        """Open without writing anything; works in a read-only file or folder too."""
        if not self.path.exists():
            raise StoreError(f"no store at {self.path}")
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
                timeout=self._busy_s(),
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # Streamlit reads from several threads; _lock serialises
            )
        except sqlite3.Error as exc:
            raise self._error_from(exc, opening=True) from None
        try:
            self._configure(conn)
            self._check_schema(conn)
        except StoreError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            raise self._error_from(exc, opening=True) from None
        return conn

    def _busy_s(self) -> float:
        """How long a statement waits for another process's lock."""
        if self.defer_when_busy:
            return min(self.busy_timeout_s, DEFER_BUSY_TIMEOUT_S)
        return self.busy_timeout_s

    def _configure(self, conn: sqlite3.Connection) -> None:
        """Pragmas: WAL so readers never block the writer, a busy timeout, FKs."""
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_s() * 1000)}")
        if not self.readonly:
            conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable across application crashes in WAL mode; only a power cut
            # can lose the last commits, which for metrics is fine.
            conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA cache_size = -32768")  # 32 MiB per connection
        conn.execute("PRAGMA temp_store = MEMORY")  # ORDER BY sorts stay off the disk

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        """Create the schema in an empty file; refuse foreign or newer files."""
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if "meta" not in tables:
            if {t for t in tables if not t.startswith("sqlite_")}:
                raise StoreError(
                    f"{self.path} is an SQLite database but not a blockviz run store; "
                    "give another --store path"
                )
            if self.readonly:
                raise StoreError(f"no store at {self.path} (the file holds no blockviz schema)")
            # One transaction, so a crash never leaves tables without their version row;
            # IF NOT EXISTS / OR IGNORE make a concurrent first open harmless.
            try:
                conn.executescript(
                    "BEGIN IMMEDIATE;"
                    + _SCHEMA
                    + "INSERT OR IGNORE INTO meta (key, value) "
                    + f"VALUES ('schema_version', '{SCHEMA_VERSION}');"
                    + "COMMIT;"
                )
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        try:
            version = int(row[0]) if row else None
        except (TypeError, ValueError):
            version = None
        if version is None:
            raise StoreError(
                f"{self.path} is not a blockviz run store (no schema version in its meta table)"
            )
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer blockviz (schema version {version}; "
                f"this version reads up to {SCHEMA_VERSION}); upgrade blockviz to open it"
            )
        if version < SCHEMA_VERSION and not self.readonly:
            self._upgrade(conn)
        row = conn.execute("SELECT value FROM meta WHERE key = 'legacy_run_dirs_upto'").fetchone()
        self._legacy_upto = int(row[0]) if row and str(row[0]).isdigit() else 0
        columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        # A version 1 file opened read-only keeps its columns: read what is there.
        self._run_columns = tuple(c for c in _RUN_COLUMNS if c in columns)

    def _upgrade(self, conn: sqlite3.Connection) -> None:
        """Version 1 -> 2, in one transaction (a concurrent opener finds it done)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            (version,) = conn.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'"
            ).fetchone()
            if int(version) < 2:
                # The runs so far keep their <workspace>/<id> folders; ids are never
                # reused, so every later run gets a folder of this store's own.
                (upto,) = conn.execute(
                    "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'runs'), 0),"
                    " COALESCE((SELECT MAX(id) FROM runs), 0))"
                ).fetchone()
                conn.execute("ALTER TABLE runs ADD COLUMN pid_started REAL")
                # One sample per step (a resume used to add a second copy).
                conn.execute(
                    "DELETE FROM samples WHERE rowid NOT IN "
                    "(SELECT MAX(rowid) FROM samples GROUP BY run_id, step)"
                )
                conn.execute("DROP INDEX IF EXISTS samples_run_step")
                conn.execute(
                    "CREATE UNIQUE INDEX IF NOT EXISTS samples_series ON samples (run_id, step)"
                )
                conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('legacy_run_dirs_upto', ?)",
                    (str(int(upto)),),
                )
                conn.execute(
                    "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _error_from(self, exc: sqlite3.Error, *, opening: bool = False) -> StoreError:
        """A StoreError that says what went wrong with which file."""
        text = str(exc)
        if "not a database" in text or "malformed" in text:
            if not self._has_sqlite_header():
                return StoreError(
                    f"{self.path} is not a blockviz run store (not an SQLite file: {text}); "
                    "give another --store path"
                )
            return StoreError(f"the run store {self.path} is corrupt ({text}); {CORRUPT_ADVICE}")
        if "disk is full" in text or "disk I/O" in text:
            return StoreError(
                f"cannot write the run store {self.path}: {text} (is its disk full?); "
                "free some space and try again"
            )
        if "locked" in text or "busy" in text:
            return StoreLocked(
                f"the run store {self.path} stayed locked by another process for "
                f"{self.busy_timeout_s:g} s; try again"
            )
        if "readonly" in text or "read-only" in text:
            return StoreError(f"the run store {self.path} is read-only here ({text})")
        if "closed" in text:
            return StoreError(f"the run store {self.path} is closed")
        verb = "open" if opening else "use"
        return StoreError(f"cannot {verb} the run store {self.path}: {text}")

    def _has_sqlite_header(self) -> bool:
        try:
            with open(self.path, "rb") as fh:
                return fh.read(len(SQLITE_HEADER)) == SQLITE_HEADER
        except OSError:
            return False

    def check_integrity(self) -> None:
        """StoreError when the file is damaged (`PRAGMA quick_check`); readers call it once.

        quick_check reads every page but skips the index-content comparison of a full
        integrity_check; benchmarks/bench_quick_check.py measures what it costs (0.31 s for a
        100 MiB store of 20 runs x 5,000 steps x 12 layers).
        """
        try:
            with self._lock:
                rows = self.conn.execute("PRAGMA quick_check(3)").fetchall()
        except sqlite3.Error as exc:
            raise self._error_from(exc) from None
        problems = [" ".join(str(row[0]).split()) for row in rows if row and row[0] != "ok"]
        if problems:
            raise StoreError(
                f"the run store {self.path} is corrupt ({'; '.join(problems)[:160]}); "
                f"{CORRUPT_ADVICE}"
            )

    # -- lifetime -----------------------------------------------------------------------

    @property
    def workspace(self) -> Path:
        """The folder holding the store file (and uploads)."""
        return self.path.parent

    @property
    def runs_root(self) -> Path:
        """<workspace>/<store file name>.runs: the run folders of this store and no other."""
        return self.workspace / (self.path.name + RUN_DIRS_SUFFIX)

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

    def close(self) -> None:
        """Flush what is buffered and close the connection (idempotent)."""
        with self._lock:
            if self._conn is None:
                return
            try:
                if not self.readonly:
                    self.flush()
            finally:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunStore({str(self.path)!r})"

    @contextmanager
    def bulk_load(self) -> Iterator[RunStore]:
        """Load many rows fast (synthetic data): no per-row foreign-key checks inside."""
        with self._lock:
            self.flush()
            self.conn.execute("PRAGMA foreign_keys = OFF")
            try:
                yield self
                self.flush()
            finally:
                if self._conn is not None:
                    self._conn.execute("PRAGMA foreign_keys = ON")

    @property
    def conn(self) -> sqlite3.Connection:
        """The open connection (raises StoreError when closed)."""
        if self._conn is None:
            raise StoreError(f"the run store {self.path} is closed")
        return self._conn

    def _begin(self) -> None:
        # IMMEDIATE takes the write lock up front, so a busy store waits (busy_timeout)
        # instead of failing halfway through a read-then-write transaction.
        self.conn.execute("BEGIN IMMEDIATE")

    def _commit(self) -> None:
        self.conn.execute("COMMIT")

    def _rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    # -- runs: writes -------------------------------------------------------------------

    @_guarded
    def create_run(
        self,
        name: str,
        config_json: str | Mapping[str, Any] | Any,
        status: str = "queued",
        max_steps: int | None = None,
        **fields: Any,
    ) -> int:
        """Insert a run (its name sanitized and made unique with -2, -3, ...); its id."""
        self._check_fields(fields)
        self._check_status(status)
        config_text = _encode_json(config_json)
        config = _decode_json(config_text) if config_text is not None else None
        if config_text is not None and config is None:
            raise StoreError(f"run config for {name!r} is not valid JSON: {config_text[:60]!r}")
        if max_steps is None and isinstance(config, dict):
            max_steps = (config.get("train") or {}).get("max_steps")
        values: dict[str, Any] = {"created": time.time(), **fields}
        values.update(status=status, config=config_text, max_steps=max_steps)
        for column in _JSON_COLUMNS:
            values[column] = _encode_json(values.get(column))
        self._begin()
        try:
            values["name"] = self._unique_name(check_name(name))
            columns = list(values)
            cursor = self.conn.execute(
                f"INSERT INTO runs ({', '.join(columns)}) VALUES ({_placeholders(columns)})",
                [values[c] for c in columns],
            )
            self._commit()
        except BaseException:
            self._rollback()
            raise
        return int(cursor.lastrowid or 0)

    def _unique_name(self, base: str) -> str:
        """base, or base-2, base-3, ... whichever is free (inside a write transaction)."""
        taken = {
            row[0]
            for row in self.conn.execute(
                "SELECT name FROM runs WHERE substr(name, 1, ?) = ?", (len(base), base)
            )
        }
        if base not in taken:
            return base
        suffix = 2
        while True:
            tail = f"-{suffix}"
            candidate = base[: _NAME_MAX - len(tail)] + tail
            if candidate not in taken and not self._name_exists(candidate):
                return candidate
            suffix += 1

    def _name_exists(self, name: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM runs WHERE name = ?", (name,)).fetchone() is not None
        )

    @staticmethod
    def _check_fields(fields: Mapping[str, Any]) -> None:
        unknown = sorted(set(fields) - set(_RUN_COLUMNS) - {"name"})
        if unknown or "id" in fields:
            bad = unknown[0] if unknown else "id"
            allowed = ", ".join(c for c in _RUN_COLUMNS if c != "id")
            raise StoreError(f"run field {bad!r} cannot be set; known fields: {allowed}")
        if "status" in fields:
            RunStore._check_status(fields["status"])

    @staticmethod
    def _check_status(status: str) -> None:
        if status not in STATUSES:
            raise StoreError(f"run status {status!r} is not one of {', '.join(STATUSES)}")

    @_guarded
    def update_run(self, run_id: RunRef, **fields: Any) -> None:
        """Set run columns by name; dicts for config/dataset/final are stored as JSON."""
        self._check_fields(fields)
        run_id = self._resolve(run_id)
        if "name" in fields:
            self.rename_run(run_id, fields.pop("name"))
        if not fields:
            return
        values = {k: (_encode_json(v) if k in _JSON_COLUMNS else v) for k, v in fields.items()}
        assignments = ", ".join(f"{column} = ?" for column in values)
        self._begin()
        try:
            self.conn.execute(
                f"UPDATE runs SET {assignments} WHERE id = ?", [*values.values(), run_id]
            )
            self._commit()
        except BaseException:
            self._rollback()
            raise

    @_guarded
    def rename_run(self, run_id: RunRef, new_name: str) -> str:
        """Give a run a new (sanitized) name; StoreError if another run has it."""
        run_id = self._resolve(run_id)
        name = check_name(new_name)
        self._begin()
        try:
            row = self.conn.execute("SELECT id FROM runs WHERE name = ?", (name,)).fetchone()
            if row is not None and row[0] != run_id:
                raise StoreError(
                    f"run name {name!r} is already taken by run {row[0]}; choose another name"
                )
            self.conn.execute("UPDATE runs SET name = ? WHERE id = ?", (name, run_id))
            self._commit()
        except BaseException:
            self._rollback()
            raise
        return name

    @_guarded
    def delete_run(self, run_id: RunRef) -> None:
        """Delete a run's rows and its folder; refuses a run whose process is alive."""
        run_id = self._resolve(run_id)
        self._begin()  # the liveness check and the delete see the same state
        try:
            status, pid, began, name = self.conn.execute(
                "SELECT status, pid, pid_started, name FROM runs WHERE id = ?", (run_id,)
            ).fetchone()
            if status in ACTIVE_STATUSES and procs.is_alive(pid, began):
                raise StoreError(
                    f"run {run_id} ({name}) is {status} in process {pid}; stop it before deleting"
                )
            for table in _METRIC_TABLES:
                self.conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            self.conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
            self._commit()
        except BaseException:
            self._rollback()
            raise
        self._drop_buffered(run_id)
        self._remove_run_dir(run_id)

    def _drop_buffered(self, run_id: int) -> None:
        for table, rows in self._buffers.items():
            kept = [row for row in rows if row[0] != run_id]
            self._buffered -= len(rows) - len(kept)
            self._buffers[table] = kept
        self._heartbeats.pop(run_id, None)

    def _remove_run_dir(self, run_id: int) -> None:
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

    # -- lifecycle ------------------------------------------------------------------------

    @_guarded
    def heartbeat(self, run_id: int, step: int) -> None:
        """Record that the run is alive at `step`; written now, or with the next flush."""
        run_id = int(run_id)
        self._heartbeats[run_id] = (time.time(), int(step))
        # At most one write a second per run; a held beat rides along with the next flush.
        written = self._beats_written.get(run_id)
        if written is None or time.monotonic() - written >= HEARTBEAT_WRITE_S:
            self.flush()

    @_guarded
    def reap_dead(self, stale_after: float = STALE_AFTER_S) -> list[int]:
        """Mark queued/running runs whose process is gone and beat is stale as failed.

        "Gone" means no live, non-zombie process with the run's pid and start time
        (`procs.is_alive`): a pid now used by another process does not keep a run alive.
        A read-only store is left as it is.
        """
        if self.readonly:
            return []
        now = time.time()
        cutoff = now - stale_after
        # A plain read first: the dashboard calls this on every refresh and must not
        # queue for the write lock when nothing has died.
        started_column = "pid_started" if "pid_started" in self._run_columns else "NULL"
        candidates = self.conn.execute(
            f"SELECT id, pid, {started_column} FROM runs "
            f"WHERE status IN ({_placeholders(ACTIVE_STATUSES)}) "
            "AND COALESCE(heartbeat, started, created, 0) < ?",
            (*ACTIVE_STATUSES, cutoff),
        ).fetchall()
        dead = [
            (run_id, pid) for run_id, pid, began in candidates if not procs.is_alive(pid, began)
        ]
        if not dead:
            return []
        reaped: list[int] = []
        self._begin()
        try:
            for run_id, pid in dead:
                who = f"process {pid}" if pid else "the run's process"
                cursor = self.conn.execute(
                    f"UPDATE runs SET status = 'failed', ended = ?, error = ? "
                    f"WHERE id = ? AND pid IS ? AND status IN ({_placeholders(ACTIVE_STATUSES)}) "
                    "AND COALESCE(heartbeat, started, created, 0) < ?",
                    (
                        now,
                        f"{who} exited without reporting (killed or out of memory?)",
                        run_id,
                        pid,
                        *ACTIVE_STATUSES,
                        cutoff,
                    ),
                )
                if cursor.rowcount:
                    reaped.append(run_id)
                    self._settle_step(run_id)
            self._commit()
        except BaseException:
            self._rollback()
            raise
        return reaped

    def _settle_step(self, run_id: int) -> None:
        """Set the run's step to the last step it logged, when its rows got further."""
        logged = self._max_logged_step(run_id)
        if logged is not None:
            self.conn.execute(
                "UPDATE runs SET step = MAX(COALESCE(step, 0), ?) WHERE id = ?", (logged, run_id)
            )

    @_guarded
    def settle_step(self, run_id: RunRef) -> None:
        """The run's step made consistent with its rows (for a run that ended abruptly)."""
        run_id = self._resolve(run_id)
        self._begin()
        try:
            self._settle_step(run_id)
            self._commit()
        except BaseException:
            self._rollback()
            raise

    @_guarded
    def claim_slot(
        self,
        run_id: RunRef,
        max_running: int,
        *,
        pid: int | None = None,
        pid_started: float | None = None,
    ) -> bool:
        """Atomically make the run 'running' if fewer than max_running (<=0: no limit) are."""
        run_id = self._resolve(run_id)
        self.reap_dead()
        self._begin()
        try:
            if max_running > 0:
                (running,) = self.conn.execute(
                    "SELECT COUNT(*) FROM runs WHERE status = 'running' AND id != ?", (run_id,)
                ).fetchone()
                if running >= max_running:
                    self._commit()
                    return False
            now = time.time()
            self.conn.execute(
                "UPDATE runs SET status = 'running', started = ?, heartbeat = ?, "
                "pid = COALESCE(?, pid), pid_started = COALESCE(?, pid_started) WHERE id = ?",
                (now, now, pid, pid_started if pid is not None else None, run_id),
            )
            self._commit()
        except BaseException:
            self._rollback()
            raise
        return True

    # -- metrics: buffered writes ---------------------------------------------------------

    @_guarded
    def log_scalars(self, run_id: int, rows: Iterable[tuple[int, str, float]]) -> None:
        """Buffer (step, name, value) rows of one run."""
        self._buffer_rows("scalars", run_id, rows, (int, str, _real))

    @_guarded
    def log_metrics(self, run_id: int, step: int, metrics: Mapping[str, float]) -> None:
        """Buffer a {name: value} dict of scalars logged at one step."""
        self.log_scalars(run_id, [(step, name, value) for name, value in metrics.items()])

    @_guarded
    def log_layer_stats(
        self, run_id: int, rows: Iterable[tuple[int, int, str, str, str, float]]
    ) -> None:
        """Buffer (step, layer, kind, component, stat, value) rows of one run."""
        self._buffer_rows("layer_stats", run_id, rows, (int, int, str, str, str, _real))

    def _buffer_rows(
        self,
        table: str,
        run_id: int,
        rows: Iterable[Sequence[Any]],
        converters: Sequence[Callable[[Any], Any]],
    ) -> None:
        """Coerce rows column by column (numpy scalars would not bind) and buffer them."""
        rows = rows if isinstance(rows, list | tuple) else list(rows)
        if not rows:
            return
        try:
            converted = [
                _convert_column(convert, list(map(itemgetter(index), rows)))
                for index, convert in enumerate(converters)
            ]
        except (IndexError, TypeError, ValueError) as exc:
            raise StoreError(
                f"{table} rows must be {len(converters)}-tuples of numbers and text ({exc})"
            ) from None
        self._buffers[table].extend(zip(repeat(int(run_id)), *converted, strict=False))
        self._added(len(rows))

    @_guarded
    def log_histogram(
        self,
        run_id: int,
        step: int,
        layer: int,
        tap: str,
        lo: float,
        hi: float,
        counts: Sequence[int],
    ) -> None:
        """Buffer one fixed-range histogram: equal-width bin counts over [lo, hi]."""
        counts_json = json.dumps([int(c) for c in counts], separators=(",", ":"))
        row = (int(run_id), int(step), int(layer), str(tap), float(lo), float(hi), counts_json)
        self._buffers["histograms"].append(row)
        self._added(1)

    @_guarded
    def log_sample(self, run_id: int, step: int, prompt: str, text: str) -> None:
        """Buffer one generated text sample."""
        self._buffers["samples"].append((int(run_id), int(step), str(prompt), str(text)))
        self._added(1)

    @_guarded
    def log_attention(
        self,
        run_id: int,
        step: int,
        layer: int,
        head: int,
        tokens: Sequence[str],
        weights: Sequence[Sequence[float]],
    ) -> None:
        """Buffer one attention map: the probe's characters and the T x T weights."""
        # Four decimals are plenty for a heatmap and keep a 64 x 64 map near 20 KB;
        # `or 0` writes exact zeros (the causal mask) as a single character.
        rounded = [[round(float(w), 4) or 0 for w in row] for row in weights]
        row = (
            int(run_id),
            int(step),
            int(layer),
            int(head),
            json.dumps(list(tokens), separators=(",", ":")),
            json.dumps(rounded, separators=(",", ":")),
        )
        self._buffers["attention"].append(row)
        self._added(1)

    def _added(self, count: int) -> None:
        self._buffered += count
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        """Flush when enough rows are buffered or the last flush is old enough."""
        due_seconds = self.flush_seconds if self.flush_seconds is not None else math.inf
        elapsed = time.monotonic() - self._last_flush
        if self._buffered >= self.flush_rows or (elapsed >= due_seconds and self._buffered):
            self.flush()

    @_guarded
    def flush(self) -> bool:
        """Write every buffered row (and pending heartbeats) in one transaction.

        True when written. A writer opened with `defer_when_busy` that finds the store
        locked by another process keeps its rows, notes the wait in its log and returns
        False; the next flush retries. Past MAX_DEFERRED_ROWS rows it waits for the lock
        instead, so memory stays bounded and no row is ever dropped.
        """
        self._last_flush = time.monotonic()
        if not self._buffered and not self._heartbeats:
            return True
        while True:
            try:
                self._flush_once()
            except sqlite3.OperationalError as exc:
                if not (self.defer_when_busy and _is_busy(exc)):
                    raise
                if self._deferred_since is None:
                    self._deferred_since = time.monotonic()
                    log.warning(
                        "the run store %s is locked by another process; keeping rows in "
                        "memory (up to %d) and retrying",
                        self.path,
                        MAX_DEFERRED_ROWS,
                    )
                if self._buffered < MAX_DEFERRED_ROWS:
                    return False
                log.warning(
                    "%d rows held while the store is locked; waiting for the lock", self._buffered
                )
                continue  # each try waits DEFER_BUSY_TIMEOUT_S inside SQLite
            if self._deferred_since is not None:
                log.warning(
                    "the run store is writable again after %.1f s; the rows kept meanwhile "
                    "are written",
                    time.monotonic() - self._deferred_since,
                )
                self._deferred_since = None
            return True

    def _flush_once(self) -> None:
        self._begin()
        try:
            self._write_buffers()
            self._commit()
        except sqlite3.IntegrityError:
            self._rollback()
            missing = self._drop_missing_runs()
            if not missing:
                raise
            raise StoreError(
                f"cannot record metrics for run(s) {', '.join(map(str, missing))}: no such run "
                "(deleted?); their buffered rows were dropped"
            ) from None
        except BaseException:
            self._rollback()  # keep the buffers: the next flush retries them
            raise
        for rows in self._buffers.values():
            rows.clear()
        self._buffered = 0
        written_at = time.monotonic()
        for run_id in self._heartbeats:
            self._beats_written[run_id] = written_at
        self._heartbeats.clear()

    @_guarded
    def buffered_rows(self, run_id: int) -> dict[str, list[list[Any]]]:
        """The run's rows not yet written, per table (without the run id), as plain lists.

        A checkpoint carries these, so rows logged before it survive a kill even when the
        store was locked when the checkpoint was written (`restore_rows` puts them back).
        """
        run_id = int(run_id)
        return {
            table: [list(row[1:]) for row in rows if row[0] == run_id]
            for table, rows in self._buffers.items()
            if any(row[0] == run_id for row in rows)
        }

    @_guarded
    def restore_rows(self, run_id: int, rows: Mapping[str, Sequence[Sequence[Any]]]) -> int:
        """Buffer rows saved by `buffered_rows` (from a checkpoint) and flush; their count."""
        count = 0
        for table, table_rows in rows.items():
            width = _TABLE_WIDTHS.get(table)
            if width is None:
                raise StoreError(f"rows for unknown table {table!r} in a checkpoint")
            kept = [tuple(row) for row in table_rows if len(row) == width]
            self._buffers[table].extend((int(run_id), *row) for row in kept)
            count += len(kept)
        self._buffered += count
        self.flush()
        return count

    @_guarded
    def truncate_after(self, run_id: RunRef, step: int) -> int:
        """Delete the run's rows logged after `step` (a resume from a checkpoint there).

        What a killed process logged after its last checkpoint came from steps the
        resumed run does again; without this, series would hold both. Returns the rows
        deleted.
        """
        run_id = self._resolve(run_id)
        self._drop_buffered_after(run_id, int(step))
        deleted = 0
        self._begin()
        try:
            for table in _METRIC_TABLES:
                cursor = self.conn.execute(
                    f"DELETE FROM {table} WHERE run_id = ? AND step > ?", (run_id, int(step))
                )
                deleted += max(cursor.rowcount, 0)
            self.conn.execute("UPDATE runs SET step = ? WHERE id = ?", (int(step), run_id))
            self._commit()
        except BaseException:
            self._rollback()
            raise
        return deleted

    def _drop_buffered_after(self, run_id: int, step: int) -> None:
        for table, rows in self._buffers.items():
            kept = [row for row in rows if row[0] != run_id or row[1] <= step]
            self._buffered -= len(rows) - len(kept)
            self._buffers[table] = kept

    def _write_buffers(self) -> None:
        conn = self.conn
        buffers = self._buffers
        if buffers["scalars"]:
            conn.executemany(
                "INSERT OR REPLACE INTO scalars (run_id, step, name, value) VALUES (?, ?, ?, ?)",
                buffers["scalars"],
            )
        if buffers["layer_stats"]:
            conn.executemany(
                "INSERT OR REPLACE INTO layer_stats "
                "(run_id, step, layer, kind, component, stat, value) VALUES (?, ?, ?, ?, ?, ?, ?)",
                buffers["layer_stats"],
            )
        if buffers["histograms"]:
            conn.executemany(
                "INSERT OR REPLACE INTO histograms (run_id, step, layer, tap, lo, hi, counts) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                buffers["histograms"],
            )
        if buffers["samples"]:
            conn.executemany(
                "INSERT OR REPLACE INTO samples (run_id, step, prompt, text) VALUES (?, ?, ?, ?)",
                buffers["samples"],
            )
        if buffers["attention"]:
            conn.executemany(
                "INSERT OR REPLACE INTO attention (run_id, step, layer, head, tokens, weights) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                buffers["attention"],
            )
        if self._heartbeats:
            conn.executemany(
                "UPDATE runs SET heartbeat = ?, step = ? WHERE id = ?",
                [(beat, step, run_id) for run_id, (beat, step) in self._heartbeats.items()],
            )

    def _drop_missing_runs(self) -> list[int]:
        """After a foreign-key failure: drop buffered rows of runs that no longer exist."""
        buffered_ids = {row[0] for rows in self._buffers.values() for row in rows}
        existing = {
            row[0]
            for row in self.conn.execute(
                f"SELECT id FROM runs WHERE id IN ({_placeholders(list(buffered_ids))})",
                list(buffered_ids),
            )
        }
        missing = sorted(buffered_ids - existing)
        for run_id in missing:
            self._drop_buffered(run_id)
        return missing

    # -- runs: reads ----------------------------------------------------------------------

    @_guarded
    def resolve(self, run_id_or_name: RunRef) -> int:
        """The id of a run given its id (int or digits) or its exact name."""
        return self._resolve(run_id_or_name)

    def _resolve(self, ref: RunRef) -> int:
        conn = self.conn
        if isinstance(ref, str):
            text = ref.strip()
            if is_id_text(text):
                row = conn.execute("SELECT id FROM runs WHERE id = ?", (int(text),)).fetchone()
                if row:
                    return int(row[0])
            row = conn.execute("SELECT id FROM runs WHERE name = ?", (text,)).fetchone()
            if row:
                return int(row[0])
            raise StoreError(f"no run named {ref!r} in {self.path}; `blockviz runs` lists them")
        if isinstance(ref, bool):
            raise StoreError(f"run {ref!r} is neither a run id nor a run name")
        try:
            number = operator.index(ref)
        except TypeError:
            raise StoreError(f"run {ref!r} is neither a run id nor a run name") from None
        if conn.execute("SELECT 1 FROM runs WHERE id = ?", (number,)).fetchone() is None:
            raise StoreError(f"no run with id {number} in {self.path}; `blockviz runs` lists them")
        return int(number)

    def _ids(self, run_ids: RunRef | Iterable[RunRef] | None) -> list[int]:
        """Run ids from an id, a name or an iterable of them; None means every run."""
        if run_ids is None:
            return [row[0] for row in self.conn.execute("SELECT id FROM runs ORDER BY id")]
        if isinstance(run_ids, str) or not isinstance(run_ids, Iterable):
            run_ids = [run_ids]
        ids: list[int] = []
        for ref in run_ids:
            if isinstance(ref, str):
                ids.append(self._resolve(ref))
                continue
            try:
                ids.append(operator.index(ref))
            except TypeError:
                raise StoreError(f"run {ref!r} is neither a run id nor a run name") from None
        return list(dict.fromkeys(ids))

    def _names(self, ids: Sequence[int]) -> dict[int, str]:
        if not ids:
            return {}
        return dict(
            self.conn.execute(
                f"SELECT id, name FROM runs WHERE id IN ({_placeholders(ids)})", list(ids)
            ).fetchall()
        )

    @_guarded
    def get_run(self, run_id_or_name: RunRef) -> dict[str, Any]:
        """Every column of one run; config, dataset and final parsed from JSON."""
        run_id = self._resolve(run_id_or_name)
        row = self.conn.execute(
            f"SELECT {', '.join(self._run_columns)} FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        run = dict.fromkeys(_RUN_COLUMNS)
        run.update(zip(self._run_columns, row, strict=True))
        for column in _JSON_COLUMNS:
            run[column] = _decode_json(run[column])
        return run

    @_guarded
    def runs_frame(self) -> pd.DataFrame:
        """One row per run (oldest first) with its latest train and val loss."""
        latest = (
            "(SELECT value FROM scalars WHERE run_id = r.id AND name = '{}' "
            "ORDER BY step DESC LIMIT 1)"
        )
        rows = self.conn.execute(
            "SELECT r.id, r.name, r.status, r.created, r.started, r.ended, r.step, r.max_steps, "
            "r.device, r.precision, r.n_params, "
            f"{latest.format('val/loss')}, {latest.format('train/loss')}, "
            "r.diverged_step, r.heartbeat, r.pid, "
            f"{'r.pid_started' if 'pid_started' in self._run_columns else 'NULL'} "
            "FROM runs AS r ORDER BY r.id"
        ).fetchall()
        return _frame(rows, RUNS_FRAME)

    # -- metrics: reads -------------------------------------------------------------------

    @_guarded
    def scalars(
        self,
        run_ids: RunRef | Iterable[RunRef] | None,
        names: str | Iterable[str] | None = None,
        after_step: int | None = None,
        max_points: int | None = None,
    ) -> pd.DataFrame:
        """Scalar series, ordered by run, name and step; downsampled when max_points is set."""
        ids = self._ids(run_ids)
        wanted = (
            None if names is None else sorted({names} if isinstance(names, str) else set(names))
        )
        sql = "SELECT step, value FROM scalars WHERE run_id = ? AND name = ?"
        if after_step is not None:
            sql += f" AND step > {int(after_step)}"
        sql += " ORDER BY step"
        # One primary-key range per series, fetching only (step, value): the per-row cost
        # of moving values into Python is what a read pays for, so move as few as we can.
        keys: list[tuple[int, str]] = []
        chunks: list[np.ndarray] = []
        for run_id in sorted(ids):
            for name in wanted if wanted is not None else self._names_of_run(run_id):
                rows = self.conn.execute(sql, (run_id, name)).fetchall()
                if not rows:
                    continue
                data = np.array(rows, dtype=float)  # (n, 2): step, value; NULL -> NaN
                if max_points is not None:
                    steps = data[:, 0].astype(np.int64)  # (n,)
                    keep = downsample_mask(np.zeros(1, np.int64), steps, data[:, 1], max_points)
                    data = data[keep]
                keys.append((run_id, name))
                chunks.append(data)
        if not chunks:
            return _frame([], SCALARS_FRAME)
        lengths = [len(chunk) for chunk in chunks]
        data = np.concatenate(chunks)
        run_of = {run_id: run for run_id, run in self._names(ids).items()}
        frame = pd.DataFrame(
            {
                "run_id": np.repeat([run_id for run_id, _ in keys], lengths),
                "run": np.repeat(np.array([run_of.get(r) for r, _ in keys], dtype=object), lengths),
                "step": data[:, 0].astype(np.int64),
                "name": np.repeat(np.array([name for _, name in keys], dtype=object), lengths),
                "value": data[:, 1],
            }
        )
        return frame.astype(SCALARS_FRAME)

    @_guarded
    def scalar_names(self, run_ids: RunRef | Iterable[RunRef] | None) -> list[str]:
        """The distinct scalar names the runs have logged, sorted."""
        found: set[str] = set()
        for run_id in self._ids(run_ids):
            found.update(self._names_of_run(run_id))
        return sorted(found)

    def _names_of_run(self, run_id: int) -> list[str]:
        # Skip-scan over the primary key: one index seek per distinct name instead of
        # reading every row of the run.
        rows = self.conn.execute(
            "WITH RECURSIVE names(name) AS ("
            " SELECT MIN(name) FROM scalars WHERE run_id = ?1"
            " UNION ALL"
            " SELECT (SELECT MIN(name) FROM scalars WHERE run_id = ?1 AND name > names.name)"
            " FROM names WHERE names.name IS NOT NULL"
            ") SELECT name FROM names WHERE name IS NOT NULL",
            (run_id,),
        ).fetchall()
        return [row[0] for row in rows]

    @_guarded
    def max_step(self, run_id: RunRef) -> int | None:
        """The largest step with any scalar recorded for the run, or None."""
        return self._max_logged_step(self._ids(run_id)[0])

    def _max_logged_step(self, run_id: int) -> int | None:
        steps = [
            self.conn.execute(
                "SELECT MAX(step) FROM scalars WHERE run_id = ? AND name = ?", (run_id, name)
            ).fetchone()[0]
            for name in self._names_of_run(run_id)
        ]
        return max(steps) if steps else None

    @_guarded
    def layer_stats(
        self,
        run_ids: RunRef | Iterable[RunRef] | None,
        kind: str | Iterable[str] | None = None,
        stat: str | Iterable[str] | None = None,
        step: int | None = None,
        after_step: int | None = None,
        max_points: int | None = None,
        *,
        component: str | Iterable[str] | None = None,
        layer: int | Iterable[int] | None = None,
    ) -> pd.DataFrame:
        """Per-layer statistics, filtered; downsampled per series when max_points is set."""
        ids = self._ids(run_ids)
        filters: dict[str, list[Any]] = {"run_id": ids}
        for column, wanted in (
            ("kind", kind),
            ("stat", stat),
            ("component", component),
            ("layer", layer),
        ):
            if wanted is not None:
                filters[column] = [wanted] if isinstance(wanted, str | int) else list(wanted)
        if not all(filters.values()):
            return _frame([], LAYER_STATS_FRAME)
        where = [f"{column} IN ({_placeholders(v)})" for column, v in filters.items()]
        params = [value for values in filters.values() for value in values]
        if step is not None:
            where.append(f"step = {int(step)}")
        if after_step is not None:
            where.append(f"step > {int(after_step)}")
        # Columns pinned to one value by a filter are not fetched: moving cells into
        # Python is most of a large read's cost.
        fixed = {column: values[0] for column, values in filters.items() if len(values) == 1}
        dtypes = {c: LAYER_STATS_DTYPES[c] for c in LAYER_STATS_DTYPES if c not in fixed}
        series = [c for c in ("run_id", "kind", "stat", "component", "layer") if c not in fixed]
        sql = (
            f"SELECT {', '.join(dtypes)} FROM layer_stats WHERE {' AND '.join(where)} "
            f"ORDER BY {', '.join([*series, 'step'])}"
        )
        arrays = _transpose(self.conn.execute(sql, params).fetchall(), dtypes)
        size = len(arrays["step"])
        if max_points is not None and size > 2 * max(1, max_points) + 1:
            starts = _series_starts([arrays[c] for c in series]) if series else np.zeros(1, int)
            keep = downsample_mask(starts, arrays["step"], arrays["value"], max_points)
            arrays = {column: values[keep] for column, values in arrays.items()}
            size = len(arrays["step"])
        for column, value in fixed.items():
            arrays[column] = np.full(size, value, dtype=LAYER_STATS_DTYPES[column])
        return self._with_run_names(pd.DataFrame(arrays), LAYER_STATS_FRAME)

    @_guarded
    def layer_steps(
        self, run_id: RunRef, kind: str | None = None, stat: str | None = None
    ) -> list[int]:
        """The steps at which the run recorded layer statistics (of `kind`, `stat`), ascending."""
        where, params = ["run_id = ?"], [self._ids(run_id)[0]]
        for column, wanted in (("kind", kind), ("stat", stat)):
            if wanted is not None:
                where.append(f"{column} = ?")
                params.append(wanted)
        sql = f"SELECT DISTINCT step FROM layer_stats WHERE {' AND '.join(where)}"
        return sorted(row[0] for row in self.conn.execute(sql, params))

    def _with_run_names(self, frame: pd.DataFrame, schema: Mapping[str, str]) -> pd.DataFrame:
        """The frame plus a `run` (name) column, in the schema's column order and dtypes."""
        names = self._names(sorted({int(i) for i in frame["run_id"].unique()}))
        frame["run"] = frame["run_id"].map(names)
        return frame[list(schema)].astype(dict(schema))

    @_guarded
    def histograms(
        self,
        run_id: RunRef,
        layer: int | None = None,
        tap: str | None = None,
        *,
        after_step: int | None = None,
    ) -> pd.DataFrame:
        """One row per histogram bin, with that bin's edges, ordered by layer, tap, step."""
        run_id = self._ids(run_id)[0]
        where, params = ["run_id = ?"], [run_id]
        if layer is not None:
            where.append("layer = ?")
            params.append(int(layer))
        if tap is not None:
            where.append("tap = ?")
            params.append(tap)
        if after_step is not None:
            where.append("step > ?")
            params.append(int(after_step))
        stored = self.conn.execute(
            "SELECT run_id, step, layer, tap, lo, hi, counts FROM histograms "
            f"WHERE {' AND '.join(where)} ORDER BY layer, tap, step",
            params,
        ).fetchall()
        rows: list[tuple[Any, ...]] = []
        for rid, step, lay, tap_name, lo, hi, counts_json in stored:
            counts = _decode_json(counts_json) or []
            width = (hi - lo) / len(counts) if counts else 0.0
            rows.extend(
                (rid, step, lay, tap_name, i, lo + i * width, lo + (i + 1) * width, count)
                for i, count in enumerate(counts)
            )
        return _frame(rows, HISTOGRAMS_FRAME)

    @_guarded
    def samples(self, run_id: RunRef, limit: int | None = None) -> pd.DataFrame:
        """Generated text samples of a run, newest first."""
        run_id = self._ids(run_id)[0]
        sql = "SELECT run_id, step, prompt, text FROM samples WHERE run_id = ? "
        sql += "ORDER BY step DESC, rowid DESC"
        params: list[Any] = [run_id]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return _frame(self.conn.execute(sql, params).fetchall(), SAMPLES_FRAME)

    @_guarded
    def attention_steps(self, run_id: RunRef) -> list[int]:
        """The steps at which the run recorded attention maps, ascending."""
        run_id = self._ids(run_id)[0]
        rows = self.conn.execute(
            "SELECT DISTINCT step FROM attention WHERE run_id = ? ORDER BY step", (run_id,)
        ).fetchall()
        return [row[0] for row in rows]

    @_guarded
    def attention(
        self,
        run_id: RunRef,
        step: int | None = None,
        *,
        layer: int | None = None,
        head: int | None = None,
    ) -> pd.DataFrame:
        """Attention maps at `step` (default: the latest), one row per (query, key)."""
        run_id = self._ids(run_id)[0]
        if step is None:
            step = self.conn.execute(
                "SELECT MAX(step) FROM attention WHERE run_id = ?", (run_id,)
            ).fetchone()[0]
            if step is None:
                return _frame([], ATTENTION_FRAME)
        where, params = ["run_id = ?", "step = ?"], [run_id, int(step)]
        if layer is not None:
            where.append("layer = ?")
            params.append(int(layer))
        if head is not None:
            where.append("head = ?")
            params.append(int(head))
        stored = self.conn.execute(
            "SELECT layer, head, tokens, weights FROM attention "
            f"WHERE {' AND '.join(where)} ORDER BY layer, head",
            params,
        ).fetchall()
        parts: list[pd.DataFrame] = []
        for lay, hd, tokens_json, weights_json in stored:
            tokens = np.asarray(_decode_json(tokens_json) or [], dtype=object)
            weights = np.asarray(_decode_json(weights_json) or [], dtype=float)  # (T, T)
            size = len(tokens)
            if weights.shape != (size, size) or size == 0:
                continue  # a malformed map is skipped rather than breaking the page
            query = np.repeat(np.arange(size), size)  # (T*T,)
            key = np.tile(np.arange(size), size)  # (T*T,)
            parts.append(
                pd.DataFrame(
                    {
                        "run_id": run_id,
                        "step": int(step),
                        "layer": lay,
                        "head": hd,
                        "query": query,
                        "key": key,
                        "query_char": tokens[query],
                        "key_char": tokens[key],
                        "weight": weights.reshape(-1),
                    }
                )
            )
        if not parts:
            return _frame([], ATTENTION_FRAME)
        return pd.concat(parts, ignore_index=True).astype(ATTENTION_FRAME)

    @_guarded
    def final_metrics(self, run_ids: RunRef | Iterable[RunRef] | None) -> pd.DataFrame:
        """One summary row per run: its final JSON where present, else its latest scalars."""
        ids = self._ids(run_ids)
        rows = []
        now = time.time()
        latest_of = {
            "train_loss": "train/loss",
            "val_loss": "val/loss",
            "val_ppl": "val/ppl",
            "val_bpc": "val/bpc",
            "answer_acc": "val/answer_acc",
        }
        for run_id in ids:
            run = self.conn.execute(
                "SELECT name, status, step, diverged_step, started, ended, heartbeat, n_params, "
                "final FROM runs WHERE id = ?",
                (run_id,),
            ).fetchone()
            if run is None:
                continue  # deleted meanwhile: a missing row, not an error
            name, status, step, diverged, started, ended, beat, n_params, final_json = run
            final = _decode_json(final_json)
            final = final if isinstance(final, dict) else {}
            values: dict[str, Any] = {
                key: self._latest_value(run_id, scalar) for key, scalar in latest_of.items()
            }
            (tokens_per_sec,) = self.conn.execute(
                "SELECT AVG(value) FROM scalars WHERE run_id = ? AND name = 'train/tokens_per_sec'",
                (run_id,),
            ).fetchone()
            finished_at = ended if ended is not None else (beat if beat is not None else now)
            values.update(
                steps=step if step is not None else self.max_step(run_id),
                diverged_at=diverged,
                time_s=None if started is None else finished_at - started,
                tokens_per_sec=tokens_per_sec,
                n_params=n_params,
            )
            for key in values:
                if final.get(key) is not None:
                    values[key] = final[key]
            rows.append((name, status, *(values[k] for k in list(FINAL_METRICS_FRAME)[2:])))
        return _frame(rows, FINAL_METRICS_FRAME)

    def _latest_value(self, run_id: int, name: str) -> float | None:
        row = self.conn.execute(
            "SELECT value FROM scalars WHERE run_id = ? AND name = ? ORDER BY step DESC LIMIT 1",
            (run_id, name),
        ).fetchone()
        return None if row is None else row[0]
