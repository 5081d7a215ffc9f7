"""The run store: every run of a workspace in one SQLite file (WAL mode), or in one
PostgreSQL database that workers on many machines share (`--store postgresql://...`).

Training processes write into it while the dashboard and the CLI read from it. Times are
unix seconds; NaN is stored as NULL and read back as NaN, infinities are stored as they are,
so a diverged run's last loss survives.

Writes are buffered and land in one transaction per flush (a busy timeout lets several
runs share the file). Reads return tidy DataFrames with fixed columns and dtypes, even
when empty, and can downsample to about N points per series while keeping each bucket's
minimum and maximum, so spikes and divergence are never smoothed away.

A run's row comes back as a RunRecord and a study's as a StudyRecord (frozen dataclasses),
never as a dict. One concern per module; import from here, not from them:

    runstore.py    RunStore, composed of the parts below around one Connection, and `checked`
    records.py     RunRecord and StudyRecord: typed rows, each built from a row in one place
    location.py    Location: a file path or a postgresql:// URL; unknown schemes refused
    connection.py  Connection: opening (read-only and immutable fallbacks), pragmas,
                   integrity check, run folders, close, `transaction()`; the `guarded` lock
                   (a lost server is waited for)
    server.py      the PostgreSQL driver behind sqlite3's calls; the server's DDL
    schema.py      the tables and their version (upgrades to v5 in place), the frames' dtypes
    runs.py        RunLookup (resolve) and Runs, the runs table: create, update, take_over,
                   tags, notes, rename, delete, get_run, runs_frame, run_statuses
    studies.py     Studies: the studies table; a study's runs created at once, claimed by
                   workers
    liveness.py    Liveness: heartbeats, reap_dead, settle_step
    queue.py       Queue: claim_slot: at most N runs running; queued_still
    writes.py      Writes: buffered log_* writes, flush, rows kept while the store is locked,
                   restore and truncate for resumed runs
    reads.py       Reads: scalars, layer_stats, histograms, samples, attention, final_metrics
    downsample.py  min/max bucket downsampling in numpy
    naming.py      check_name: a bare number is no run name (syntax: core.naming)
    values.py      floats, JSON columns and `?` lists on their way into SQLite
    errors.py      StoreError, StoreLocked and the wording of what went wrong
"""

from blockviz.store.connection import BUSY_TIMEOUT_S, DEFER_BUSY_TIMEOUT_S, RUN_DIRS_SUFFIX
from blockviz.store.downsample import downsample_mask
from blockviz.store.errors import (
    CORRUPT_ADVICE,
    READONLY_HINTS,
    SQLITE_HEADER,
    StoreError,
    StoreLocked,
    StoreUnreachable,
    is_readonly_error,
)
from blockviz.store.liveness import HEARTBEAT_WRITE_S, STALE_AFTER_S, run_alive
from blockviz.store.location import (
    DEFAULT_STORE,
    Location,
    default_store_path,
    default_store_text,
    parse_location,
    redact,
)
from blockviz.store.naming import RunRef, check_name
from blockviz.store.records import FinalMetrics, ForkInfo, RunRecord, StoredConfig, StudyRecord
from blockviz.store.runstore import RunStore, checked
from blockviz.store.schema import (
    ATTENTION_FRAME,
    FINAL_METRICS_FRAME,
    HISTOGRAMS_FRAME,
    LAYER_STATS_DTYPES,
    LAYER_STATS_FRAME,
    RUNS_FRAME,
    SAMPLES_FRAME,
    SCALARS_FRAME,
    SCHEMA_VERSION,
)
from blockviz.store.writes import MAX_DEFERRED_ROWS

__all__ = [
    "ATTENTION_FRAME",
    "BUSY_TIMEOUT_S",
    "CORRUPT_ADVICE",
    "DEFAULT_STORE",
    "DEFER_BUSY_TIMEOUT_S",
    "FINAL_METRICS_FRAME",
    "HEARTBEAT_WRITE_S",
    "HISTOGRAMS_FRAME",
    "LAYER_STATS_DTYPES",
    "LAYER_STATS_FRAME",
    "MAX_DEFERRED_ROWS",
    "READONLY_HINTS",
    "RUNS_FRAME",
    "RUN_DIRS_SUFFIX",
    "SAMPLES_FRAME",
    "SCALARS_FRAME",
    "SCHEMA_VERSION",
    "SQLITE_HEADER",
    "STALE_AFTER_S",
    "FinalMetrics",
    "ForkInfo",
    "Location",
    "RunRecord",
    "RunRef",
    "RunStore",
    "StoreError",
    "StoreLocked",
    "StoreUnreachable",
    "StoredConfig",
    "StudyRecord",
    "check_name",
    "checked",
    "default_store_path",
    "default_store_text",
    "downsample_mask",
    "is_readonly_error",
    "parse_location",
    "redact",
    "run_alive",
]
