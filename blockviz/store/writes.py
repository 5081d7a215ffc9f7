"""Buffered metric writes: rows wait in memory and land in one transaction per flush.

A log call flushes once `flush_rows` rows wait or the last flush is `flush_seconds` old;
close flushes the rest. A busy timeout lets several runs share the file; a training writer
opened with `defer_when_busy` keeps its rows while another process holds the lock.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from blockviz.store.connection import DEFER_BUSY_TIMEOUT_S, Connection, Part, guarded
from blockviz.store.errors import StoreError
from blockviz.store.naming import RunRef
from blockviz.store.schema import METRIC_TABLES, TABLE_WIDTHS
from blockviz.store.values import convert_column, placeholders, real

if TYPE_CHECKING:
    from blockviz.store.runs import RunLookup

# Each table's upsert: its columns in a buffered row's order, the unique key (the first
# columns of a row, in another order), and the columns a repeated key overwrites.
UPSERTS = {
    "scalars": ("run_id, step, name, value", "run_id, name, step", "value"),
    "layer_stats": (
        "run_id, step, layer, kind, component, stat, value",
        "run_id, kind, stat, step, layer, component",
        "value",
    ),
    "histograms": (
        "run_id, step, layer, tap, lo, hi, counts",
        "run_id, layer, tap, step",
        "lo, hi, counts",
    ),
    "samples": ("run_id, step, prompt, text", "run_id, step", "prompt, text"),
    "attention": (
        "run_id, step, layer, head, tokens, weights",
        "run_id, step, layer, head",
        "tokens, weights",
    ),
}

# A writer that finds the store locked keeps up to this many rows in memory (about 40 MB
# of scalar and layer rows); past it the writer waits for the lock, pausing training,
# rather than drop a row.
MAX_DEFERRED_ROWS = 200_000

log = logging.getLogger("blockviz.store")  # training copies this logger into train.log


class Writes(Part):
    """The part of RunStore that buffers metric rows and heartbeats and flushes them."""

    def __init__(
        self,
        db: Connection,
        lookup: RunLookup,
        *,
        flush_rows: int,
        flush_seconds: float | None,
    ) -> None:
        super().__init__(db)
        self.lookup = lookup
        self.flush_rows = flush_rows
        # Also flush when the oldest buffered row is this old, so a live page sees a
        # run that logs a few rows per step within seconds, not every 5,000 rows.
        self.flush_seconds = flush_seconds
        self._buffers: dict[str, list[tuple[Any, ...]]] = {t: [] for t in METRIC_TABLES}
        self._buffered = 0
        # Heartbeats (liveness.py): run -> (time, step) not yet written, and run ->
        # monotonic time of its last write.
        self.pending_beats: dict[int, tuple[float, int]] = {}
        self.beats_written: dict[int, float] = {}
        self._last_flush = time.monotonic()
        self._deferred_since: float | None = None  # monotonic start of a lock episode
        # Runs whose Stop was asked through the store (read with each heartbeat written).
        self.stops_requested: set[int] = set()

    @guarded
    def log_scalars(self, run_id: int, rows: Iterable[tuple[int, str, float]]) -> None:
        """Buffer (step, name, value) rows of one run."""
        self._buffer_rows("scalars", run_id, rows, (int, str, real))

    @guarded
    def log_metrics(self, run_id: int, step: int, metrics: Mapping[str, float]) -> None:
        """Buffer a {name: value} dict of scalars logged at one step."""
        self.log_scalars(run_id, [(step, name, value) for name, value in metrics.items()])

    @guarded
    def log_layer_stats(
        self, run_id: int, rows: Iterable[tuple[int, int, str, str, str, float]]
    ) -> None:
        """Buffer (step, layer, kind, component, stat, value) rows of one run."""
        self._buffer_rows("layer_stats", run_id, rows, (int, int, str, str, str, real))

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
                convert_column(convert, list(map(itemgetter(index), rows)))
                for index, convert in enumerate(converters)
            ]
        except (IndexError, TypeError, ValueError) as exc:
            raise StoreError(
                f"{table} rows must be {len(converters)}-tuples of numbers and text ({exc})"
            ) from None
        self._buffers[table].extend(zip(repeat(int(run_id)), *converted, strict=False))
        self._added(len(rows))

    @guarded
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

    @guarded
    def log_sample(self, run_id: int, step: int, prompt: str, text: str) -> None:
        """Buffer one generated text sample."""
        self._buffers["samples"].append((int(run_id), int(step), str(prompt), str(text)))
        self._added(1)

    @guarded
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

    @guarded
    def flush(self) -> bool:
        """Write every buffered row (and pending heartbeats) in one transaction.

        True when written. A writer opened with `defer_when_busy` that finds the store
        locked by another process keeps its rows, notes the wait in its log and returns
        False; the next flush retries. Past MAX_DEFERRED_ROWS rows it waits for the lock
        instead, so memory stays bounded and no row is ever dropped.
        """
        self._last_flush = time.monotonic()
        if not self._buffered and not self.pending_beats:
            return True
        while True:
            try:
                self._flush_once()
            except self.db.errors as exc:
                if not (self.db.defer_when_busy and self.db.is_transient(exc)):
                    raise
                if self._deferred_since is None:
                    self._deferred_since = time.monotonic()
                    why = "is unreachable" if self.db.is_server else "is locked by another process"
                    log.warning(
                        "the run store %s %s; keeping rows in memory (up to %d) and retrying",
                        self.db.where,
                        why,
                        MAX_DEFERRED_ROWS,
                    )
                if self._buffered < MAX_DEFERRED_ROWS:
                    return False
                log.warning(
                    "%d rows held while the store is locked; waiting for the lock", self._buffered
                )
                if self.db.is_server:
                    time.sleep(DEFER_BUSY_TIMEOUT_S)  # a server away answers at once
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
        try:
            # Rolled back when it raises: the buffers are kept and the next flush retries.
            # Not serial: flushes of different runs touch different rows.
            with self.db.transaction(serial=False):
                self._write_buffers()
        except self.db.integrity_errors:
            missing = self._drop_missing_runs()
            if not missing:
                raise
            raise StoreError(
                f"cannot record metrics for run(s) {', '.join(map(str, missing))}: no such run "
                "(deleted?); their buffered rows were dropped"
            ) from None
        for rows in self._buffers.values():
            rows.clear()
        self._buffered = 0
        written_at = time.monotonic()
        for run_id in self.pending_beats:
            self.beats_written[run_id] = written_at
        self.pending_beats.clear()

    @guarded
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

    @guarded
    def restore_rows(self, run_id: int, rows: Mapping[str, Sequence[Sequence[Any]]]) -> int:
        """Buffer rows saved by `buffered_rows` (from a checkpoint) and flush; their count."""
        count = 0
        for table, table_rows in rows.items():
            width = TABLE_WIDTHS.get(table)
            if width is None:
                raise StoreError(f"rows for unknown table {table!r} in a checkpoint")
            kept = [tuple(row) for row in table_rows if len(row) == width]
            self._buffers[table].extend((int(run_id), *row) for row in kept)
            count += len(kept)
        self._buffered += count
        self.flush()
        return count

    @guarded
    def truncate_after(self, run_id: RunRef, step: int) -> int:
        """Delete the run's rows logged after `step` (a resume from a checkpoint there).

        What a killed process logged after its last checkpoint came from steps the
        resumed run does again; without this, series would hold both. Returns the rows
        deleted.
        """
        run_id = self.lookup.id_of(run_id)
        self._drop_buffered_after(run_id, int(step))
        deleted = 0
        with self.db.transaction() as conn:
            for table in METRIC_TABLES:
                cursor = conn.execute(
                    f"DELETE FROM {table} WHERE run_id = ? AND step > ?", (run_id, int(step))
                )
                deleted += max(cursor.rowcount, 0)
            conn.execute("UPDATE runs SET step = ? WHERE id = ?", (int(step), run_id))
        return deleted

    @guarded
    def copy_history(
        self, parent: RunRef, run_id: RunRef, step: int, evaluations: Sequence[str]
    ) -> int:
        """Copy `parent`'s rows from before `step` into `run_id` (a fork or replay starting
        from the parent's checkpoint there), and its `evaluations` scalars at `step` (the
        evaluation that ran before that checkpoint was written). Returns the rows copied.

        One transaction of INSERT ... SELECT: the rows never leave the database.
        """
        parent_id, child_id = self.lookup.id_of(parent), self.lookup.id_of(run_id)
        copied = 0
        with self.db.transaction() as conn:
            for table in METRIC_TABLES:
                columns = UPSERTS[table][0].removeprefix("run_id, ")
                where = "run_id = ? AND step < ?"
                params: list[Any] = [child_id, parent_id, int(step)]
                if table == "scalars" and evaluations:
                    names = placeholders(evaluations)
                    where = f"run_id = ? AND (step < ? OR (step = ? AND name IN ({names})))"
                    params = [child_id, parent_id, int(step), int(step), *evaluations]
                cursor = conn.execute(
                    f"INSERT INTO {table} (run_id, {columns}) SELECT ?, {columns} FROM {table} "
                    f"WHERE {where}",
                    params,
                )
                copied += max(cursor.rowcount, 0)
        return copied

    def drop_buffered(self, run_id: int) -> None:
        """Forget the run's rows and beat not yet written (a deleted or requeued run)."""
        for table, rows in self._buffers.items():
            kept = [row for row in rows if row[0] != run_id]
            self._buffered -= len(rows) - len(kept)
            self._buffers[table] = kept
        self.pending_beats.pop(run_id, None)

    def _drop_buffered_after(self, run_id: int, step: int) -> None:
        for table, rows in self._buffers.items():
            kept = [row for row in rows if row[0] != run_id or row[1] <= step]
            self._buffered -= len(rows) - len(kept)
            self._buffers[table] = kept

    def _write_buffers(self) -> None:
        """Upsert every buffered row; write the beats and read back which runs were asked
        to stop (so a Stop reaches a run on any host within a heartbeat)."""
        conn = self.conn
        for table, rows in self._buffers.items():
            if not rows:
                continue
            columns, key, values = UPSERTS[table]
            if self.db.is_server:
                # A server's upsert may not touch one key twice: the last row wins, as
                # SQLite's lets it. The key is the row's first len(key) columns.
                prefix = len(key.split(", "))
                rows = list({row[:prefix]: row for row in rows}.values())
            updates = ", ".join(f"{c} = excluded.{c}" for c in values.split(", "))
            conn.executemany(
                f"INSERT INTO {table} ({columns}) VALUES ({placeholders(columns.split(', '))}) "
                f"ON CONFLICT ({key}) DO UPDATE SET {updates}",
                rows,
            )
        if self.pending_beats:
            beats = sorted(self.pending_beats.items())  # one row order for every writer
            # A beat held through an outage may reach the store after the run's end wrote
            # a later step: the step only moves forward here (truncate_after rewinds it).
            conn.executemany(
                "UPDATE runs SET heartbeat = ?, "
                "step = CASE WHEN step IS NULL OR step < ? THEN ? ELSE step END WHERE id = ?",
                [(beat, step, step, run_id) for run_id, (beat, step) in beats],
            )
            if "stop_requested" in self.db.run_columns:
                ids = [run_id for run_id, _ in beats]
                asked = conn.execute(
                    f"SELECT id FROM runs WHERE id IN ({placeholders(ids)}) "
                    "AND stop_requested IS NOT NULL",
                    ids,
                ).fetchall()
                self.stops_requested.update(int(row[0]) for row in asked)

    def _drop_missing_runs(self) -> list[int]:
        """After a foreign-key failure: drop buffered rows of runs that no longer exist."""
        buffered_ids = {row[0] for rows in self._buffers.values() for row in rows}
        existing = {
            row[0]
            for row in self.conn.execute(
                f"SELECT id FROM runs WHERE id IN ({placeholders(list(buffered_ids))})",
                list(buffered_ids),
            )
        }
        missing = sorted(buffered_ids - existing)
        for run_id in missing:
            self.drop_buffered(run_id)
        return missing

    @contextmanager
    def bulk_load(self) -> Iterator[None]:
        """Load many rows fast (test fakes, benchmarks): no per-row foreign-key checks inside
        (SQLite; a server checks them as always)."""
        with self.db.lock:
            self.flush()
            if self.db.is_server:
                yield
                self.flush()
                return
            self.conn.execute("PRAGMA foreign_keys = OFF")
            try:
                yield
                self.flush()
            finally:
                if not self.db.closed:
                    self.conn.execute("PRAGMA foreign_keys = ON")
