"""The store's tables, their version, and the frames the read API returns.

Schema (version 7; `meta.schema_version` says which one a store holds). SQLite's DDL is
below; a PostgreSQL store has the same tables and columns (server.py: identity ids,
DOUBLE PRECISION for REAL, BIGINT for INTEGER):

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
         pid_started REAL,                            the writer's start time (pid reuse)
         tags TEXT, notes TEXT,                       JSON list of tags; plain-text notes
         study_id, variant, seed,                     the study a run belongs to
         host TEXT, boot_id TEXT,                     where its process runs (liveness)
         stop_requested REAL,                         a Stop asked through the store
         parent_id INTEGER, fork_step INTEGER,        a fork or replay: the run it started
         fork_kind TEXT, fork_info TEXT,              from, at which step; fork | replay;
                                                      JSON: changed fields, replay result
         lost INTEGER)                                times its process was lost in a study
                                                      and it was queued again (liveness.py)
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

Older files are upgraded in place when opened for writing. Version 1 (before run folders
moved under `<store>.runs/` and before process start times) gains the column and the
unique index, and the runs it already holds keep their old `<workspace>/<id>` folders;
version 2 gains the tags and notes columns (empty for its runs); version 3 the studies
table; version 4 host, boot_id and stop_requested; version 5 parent_id, fork_step,
fork_kind and fork_info; version 6 lost.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from blockviz.store.errors import StoreError, missing_store

# pandas (about a second to import) is imported where a frame is built: a training process
# writes through the store but never reads a frame.
if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 7
SCHEMA_LOCK_KEY = 0x626C6B73  # "blks": the advisory lock a server's schema changes take
# Version 5: where a run's process lives (host, boot id) and a stop asked through the store.
HOST_COLUMNS = (("host", "TEXT"), ("boot_id", "TEXT"), ("stop_requested", "REAL"))
# Version 6: a fork's or a replay's parent run and step (blockviz.training.fork).
FORK_COLUMNS = (
    ("parent_id", "INTEGER"),
    ("fork_step", "INTEGER"),
    ("fork_kind", "TEXT"),
    ("fork_info", "TEXT"),
)
# Version 7: how many times a study's run was lost with its process and queued again.
LOST_COLUMNS = (("lost", "INTEGER"),)

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS studies (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL, key TEXT NOT NULL, size TEXT,
    status TEXT, created REAL, ended REAL,
    spec TEXT, error TEXT, workers TEXT
);
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
    pid_started REAL,
    tags TEXT, notes TEXT,
    study_id INTEGER REFERENCES studies(id) ON DELETE SET NULL, variant TEXT, seed INTEGER,
    host TEXT, boot_id TEXT, stop_requested REAL,
    parent_id INTEGER, fork_step INTEGER, fork_kind TEXT, fork_info TEXT,
    lost INTEGER
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

RUN_COLUMNS = (
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
    "tags",
    "notes",
    "study_id",
    "variant",
    "seed",
    "host",
    "boot_id",
    "stop_requested",
    "parent_id",
    "fork_step",
    "fork_kind",
    "fork_info",
    "lost",
)
JSON_COLUMNS = ("config", "dataset", "final", "tags", "fork_info")
METRIC_TABLES = ("scalars", "layer_stats", "histograms", "samples", "attention")
# Columns of each table's buffered rows after the run id (step comes first in each).
TABLE_WIDTHS = {"scalars": 3, "layer_stats": 6, "histograms": 6, "samples": 3, "attention": 5}

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
    "tags": _STR,  # comma-separated, "" for none
    "notes": _STR,
    "study_id": "Int64",  # the study the run belongs to, <NA> for a run of its own
    "parent_id": "Int64",  # a fork's or replay's parent run, <NA> for a run of its own
    "fork_step": "Int64",
    "fork_kind": _STR,  # fork | replay | "" for a run of its own
}
STUDIES_FRAME = {
    "id": "int64",
    "name": _STR,
    "key": _STR,
    "size": _STR,
    "status": _STR,
    "created": "float64",
    "ended": "float64",
    "runs": "int64",
    "finished": "int64",  # completed or diverged
    "running": "int64",
    "queued": "int64",
    "unfinished": "int64",  # stopped or failed
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
    "answer_baseline": "float64",
    "diverged_at": "Int64",
    "time_s": "float64",
    "tokens_per_sec": "float64",
    "n_params": "Int64",
}


def typed_frame(rows: Sequence[Sequence[Any]], schema: Mapping[str, str]) -> pd.DataFrame:
    """A DataFrame with exactly the schema's columns and dtypes (also when empty)."""
    import pandas as pd

    frame = pd.DataFrame.from_records(list(rows), columns=list(schema))
    return frame.astype(dict(schema))


class SchemaState(NamedTuple):
    """What opening learnt about a file's schema."""

    legacy_upto: int  # runs up to this id may keep <workspace>/<id> folders
    run_columns: tuple[str, ...]  # the runs columns the file has (a read-only v1 file: fewer)


def _tables(conn: Any) -> set[str]:
    """The database's table names (an SQLite file's own sqlite_* ones left out)."""
    if isinstance(conn, sqlite3.Connection):
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {row[0] for row in rows if not row[0].startswith("sqlite_")}
    return set(conn.tables())


def _columns(conn: Any, table: str) -> set[str]:
    if isinstance(conn, sqlite3.Connection):
        return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
    return set(conn.columns(table))


def _begin(conn: Any) -> None:
    """BEGIN IMMEDIATE on SQLite; on a server BEGIN and the schema's advisory lock."""
    if isinstance(conn, sqlite3.Connection):
        conn.execute("BEGIN IMMEDIATE")
    else:
        conn.execute("BEGIN")
        conn.execute(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY})")


def _ddl(conn: Any, sqlite_ddl: str) -> str:
    """SQLite's DDL as it is, or in a server's words (server.server_ddl)."""
    if isinstance(conn, sqlite3.Connection):
        return sqlite_ddl
    from blockviz.store.server import server_ddl

    return server_ddl(sqlite_ddl)


def _create(conn: Any) -> None:
    """The whole schema and its version row, in one transaction; IF NOT EXISTS and
    ON CONFLICT make a concurrent first open harmless."""
    version_row = (
        "INSERT INTO meta (key, value) "
        f"VALUES ('schema_version', '{SCHEMA_VERSION}') ON CONFLICT (key) DO NOTHING"
    )
    if isinstance(conn, sqlite3.Connection):
        conn.executescript("BEGIN IMMEDIATE;" + SCHEMA_SQL + version_row + ";COMMIT;")
        return
    _begin(conn)
    for statement in [*_ddl(conn, SCHEMA_SQL).split(";"), version_row]:
        if statement.strip():
            conn.execute(statement)
    conn.execute("COMMIT")


def check_schema(conn: Any, where: str, readonly: bool, create: bool = True) -> SchemaState:
    """Create the schema in an empty database (unless `readonly`, or not `create`: a store
    that must exist already), upgrade an old one; refuse foreign or newer ones. `conn` is
    an sqlite3.Connection or a server.ServerConnection."""
    tables = _tables(conn)
    kind = "an SQLite database" if isinstance(conn, sqlite3.Connection) else "a database"
    if "meta" not in tables:
        if tables:
            raise StoreError(
                f"{where} is {kind} but not a blockviz run store; give another --store"
            )
        if readonly or not create:
            raise StoreError(missing_store(where, "it has no blockviz tables"))
        try:
            _create(conn)
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
            f"{where} is not a blockviz run store (no schema version in its meta table)"
        )
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{where} was written by a newer blockviz (schema version {version}; "
            f"this version reads up to {SCHEMA_VERSION}); upgrade blockviz to open it"
        )
    if version < SCHEMA_VERSION and not readonly:
        upgrade(conn)
    row = conn.execute("SELECT value FROM meta WHERE key = 'legacy_run_dirs_upto'").fetchone()
    legacy_upto = int(row[0]) if row and str(row[0]).isdigit() else 0
    columns = _columns(conn, "runs")
    # A version 1 file opened read-only keeps its columns: read what is there.
    return SchemaState(legacy_upto, tuple(c for c in RUN_COLUMNS if c in columns))


def upgrade(conn: Any) -> None:
    """Version 1 to 6 -> 7, in one transaction (a concurrent opener finds it done).

    A server store began at version 5; its upgrades start from there (the steps below 5
    are SQLite's alone)."""
    _begin(conn)
    try:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
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
        if int(version) < 3:
            conn.execute("ALTER TABLE runs ADD COLUMN tags TEXT")
            conn.execute("ALTER TABLE runs ADD COLUMN notes TEXT")
        if int(version) < 4:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS studies (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                "name TEXT NOT NULL, key TEXT NOT NULL, size TEXT, status TEXT, created REAL, "
                "ended REAL, spec TEXT, error TEXT, workers TEXT)"
            )
            have = _columns(conn, "runs")
            for column, kind in (("study_id", "INTEGER"), ("variant", "TEXT"), ("seed", "INTEGER")):
                if column not in have:
                    conn.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
        if int(version) < 5:
            have = _columns(conn, "runs")
            for column, kind in HOST_COLUMNS:
                if column not in have:
                    conn.execute(_ddl(conn, f"ALTER TABLE runs ADD COLUMN {column} {kind}"))
        for below, columns in ((6, FORK_COLUMNS), (7, LOST_COLUMNS)):
            if int(version) < below:
                have = _columns(conn, "runs")
                for column, kind in columns:
                    if column not in have:
                        conn.execute(_ddl(conn, f"ALTER TABLE runs ADD COLUMN {column} {kind}"))
        if int(version) < SCHEMA_VERSION:
            conn.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
