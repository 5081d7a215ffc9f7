"""The runs table: create, rename, update and delete runs; find them by id or by name.

`RunLookup` turns a run given by id or name into its id (every part that takes a run uses
it); `Runs` keeps the rows and reads one back as a `RunRecord`.
"""

from __future__ import annotations

import operator
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from blockviz.core import procs, replicas
from blockviz.core.naming import NAME_MAX, run_id_from_text
from blockviz.core.spec import ACTIVE_STATUSES, STATUSES, TRAIN_LOSS, VAL_LOSS
from blockviz.core.tags import TagError, clean_notes, parse_tags, tags_text
from blockviz.store.connection import Connection, Part, guarded
from blockviz.store.errors import StoreError
from blockviz.store.liveness import process_alive
from blockviz.store.naming import RunRef, check_name
from blockviz.store.records import RunRecord
from blockviz.store.schema import JSON_COLUMNS, METRIC_TABLES, RUN_COLUMNS, RUNS_FRAME, typed_frame
from blockviz.store.values import decode_json, encode_json, placeholders

if TYPE_CHECKING:
    import pandas as pd

    from blockviz.store.writes import Writes


class RunLookup(Part):
    """The part of RunStore that finds runs: a run given by id or name -> its id, its name.

    `id_of`, `ids` and `names` are for the other parts, inside their guarded methods.
    """

    @guarded
    def resolve(self, run_id_or_name: RunRef) -> int:
        """The id of a run given its id (int or digits) or its exact name."""
        return self.id_of(run_id_or_name)

    def id_of(self, ref: RunRef) -> int:
        """`resolve` for a part that holds the lock already."""
        conn = self.conn
        if isinstance(ref, str):
            text = ref.strip()
            number = run_id_from_text(text)
            if number is not None:
                row = conn.execute("SELECT id FROM runs WHERE id = ?", (number,)).fetchone()
                if row:
                    return int(row[0])
            row = conn.execute("SELECT id FROM runs WHERE name = ?", (text,)).fetchone()
            if row:
                return int(row[0])
            raise StoreError(f"no run named {ref!r} in {self.db.where}; `blockviz runs` lists them")
        if isinstance(ref, bool):
            raise StoreError(f"run {ref!r} is neither a run id nor a run name")
        try:
            number = operator.index(ref)
        except TypeError:
            raise StoreError(f"run {ref!r} is neither a run id nor a run name") from None
        if conn.execute("SELECT 1 FROM runs WHERE id = ?", (number,)).fetchone() is None:
            raise StoreError(
                f"no run with id {number} in {self.db.where}; `blockviz runs` lists them"
            )
        return int(number)

    def ids(self, run_ids: RunRef | Iterable[RunRef] | None) -> list[int]:
        """Run ids from an id, a name or an iterable of them; None means every run."""
        if run_ids is None:
            return [row[0] for row in self.conn.execute("SELECT id FROM runs ORDER BY id")]
        if isinstance(run_ids, str) or not isinstance(run_ids, Iterable):
            run_ids = [run_ids]
        ids: list[int] = []
        for ref in run_ids:
            if isinstance(ref, str):
                ids.append(self.id_of(ref))
                continue
            try:
                ids.append(operator.index(ref))
            except TypeError:
                raise StoreError(f"run {ref!r} is neither a run id nor a run name") from None
        return list(dict.fromkeys(ids))

    def names(self, ids: Sequence[int]) -> dict[int, str]:
        """{id: name} of the runs that exist among `ids`."""
        if not ids:
            return {}
        return dict(
            self.conn.execute(
                f"SELECT id, name FROM runs WHERE id IN ({placeholders(ids)})", list(ids)
            ).fetchall()
        )


class Runs(Part):
    """The part of RunStore that keeps the runs table: one row per run."""

    def __init__(self, db: Connection, lookup: RunLookup, writes: Writes) -> None:
        super().__init__(db)
        self.lookup = lookup
        self.writes = writes  # a deleted run's buffered rows are dropped

    # -- writing ------------------------------------------------------------------------

    @guarded
    def create_run(
        self,
        name: str,
        config_json: str | Mapping[str, Any] | Any,
        status: str = "queued",
        max_steps: int | None = None,
        **fields: Any,
    ) -> int:
        """Insert a run (its name sanitized and made unique with -2, -3, ...); its id.

        `tags` (an iterable or comma-separated text) and `notes` are checked like
        `set_tags` / `set_notes` do.
        """
        _check_fields(fields)
        if "tags" in fields:
            fields["tags"] = list(_checked(parse_tags, fields["tags"]))
        if "notes" in fields:
            fields["notes"] = _checked(clean_notes, fields["notes"])
        _check_status(status)
        config_text = encode_json(config_json)
        config = decode_json(config_text) if config_text is not None else None
        if config_text is not None and config is None:
            raise StoreError(f"run config for {name!r} is not valid JSON: {config_text[:60]!r}")
        if max_steps is None and isinstance(config, dict):
            max_steps = (config.get("train") or {}).get("max_steps")
        values: dict[str, Any] = {"created": time.time(), **fields}
        values.update(status=status, config=config_text, max_steps=max_steps)
        for column in JSON_COLUMNS:
            values[column] = encode_json(values.get(column))
        if values.get("pid") is not None:  # its process records where it lives, and beats
            values.setdefault("host", procs.this_host())
            values.setdefault("boot_id", procs.boot_id())
            values.setdefault("heartbeat", values["created"])
        with self.db.transaction() as conn:
            values["name"] = self.unique_name(check_name(name))
            columns = list(values)
            (run_id,) = conn.execute(
                f"INSERT INTO runs ({', '.join(columns)}) VALUES ({placeholders(columns)}) "
                "RETURNING id",
                [values[c] for c in columns],
            ).fetchone()
        return int(run_id)

    def unique_name(self, base: str) -> str:
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
            candidate = base[: NAME_MAX - len(tail)] + tail
            if candidate not in taken and not self._name_exists(candidate):
                return candidate
            suffix += 1

    def _name_exists(self, name: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM runs WHERE name = ?", (name,)).fetchone() is not None
        )

    @guarded
    def update_run(self, run_id: RunRef, **fields: Any) -> None:
        """Set run columns by name; dicts for config/dataset/final are stored as JSON."""
        _check_fields(fields)
        run_id = self.lookup.id_of(run_id)
        if "name" in fields:
            self.rename_run(run_id, fields.pop("name"))
        if fields:
            self._set_fields(run_id, fields)

    @guarded
    def take_over(self, run_id: RunRef, unless: tuple[str, ...], **fields: Any) -> bool:
        """Set a run's fields unless its status is one of `unless`; whether they were set.

        One statement, so a Stop that lands between a process starting and registering
        cannot be overwritten: `train` takes over a run the runner created with
        unless=('stopped',), and a run stopped before its process registered stays stopped.
        """
        _check_fields(fields)
        return self._set_fields(self.lookup.id_of(run_id), fields, unless)

    def _set_fields(
        self, run_id: int, fields: Mapping[str, Any], unless: Sequence[str] = ()
    ) -> bool:
        """One UPDATE of checked columns (JSON ones encoded), skipped for a status in
        `unless`; whether the row was written."""
        values = {k: (encode_json(v) if k in JSON_COLUMNS else v) for k, v in fields.items()}
        if values.get("pid") is not None and "host" not in values:
            # The process that takes the run over records where it lives (liveness.py),
            # and beats once: its silence counts from now.
            values.update(host=procs.this_host(), boot_id=procs.boot_id())
            values.setdefault("heartbeat", time.time())
        assignments = ", ".join(f"{column} = ?" for column in values)
        condition = f" AND COALESCE(status, '') NOT IN ({placeholders(unless)})" if unless else ""
        with self.db.transaction() as conn:
            cursor = conn.execute(
                f"UPDATE runs SET {assignments} WHERE id = ?{condition}",
                [*values.values(), run_id, *unless],
            )
        return cursor.rowcount == 1

    @guarded
    def set_tags(self, run_id: RunRef, tags: str | Iterable[str] | None) -> tuple[str, ...]:
        """Replace a run's tags (comma-separated text or an iterable); the tags stored."""
        clean = _checked(parse_tags, tags)
        self.update_run(run_id, tags=list(clean))
        return clean

    @guarded
    def set_notes(self, run_id: RunRef, notes: str | None) -> str:
        """Replace a run's notes (plain text, bounded); the notes stored."""
        clean = _checked(clean_notes, notes)
        self.update_run(run_id, notes=clean)
        return clean

    @guarded
    def rename_run(self, run_id: RunRef, new_name: str) -> str:
        """Give a run a new (sanitized) name; StoreError if another run has it."""
        run_id = self.lookup.id_of(run_id)
        name = check_name(new_name)
        with self.db.transaction() as conn:
            row = conn.execute("SELECT id FROM runs WHERE name = ?", (name,)).fetchone()
            if row is not None and row[0] != run_id:
                raise StoreError(
                    f"run name {name!r} is already taken by run {row[0]}; choose another name"
                )
            conn.execute("UPDATE runs SET name = ? WHERE id = ?", (name, run_id))
        return name

    @guarded
    def delete_run(self, run_id: RunRef) -> None:
        """Delete a run's rows and its folder; refuses a run whose process is alive."""
        run_id = self.lookup.id_of(run_id)
        # One transaction: the liveness check and the delete see the same state.
        with self.db.transaction() as conn:
            status, pid, began, name, host, boot, beat = conn.execute(
                "SELECT status, pid, pid_started, name, host, boot_id, heartbeat FROM runs "
                "WHERE id = ?",
                (run_id,),
            ).fetchone()
            if status in ACTIVE_STATUSES and process_alive(host, boot, pid, began, beat):
                where = f" on host {host}" if not procs.is_this_machine(host, boot) else ""
                raise StoreError(
                    f"run {run_id} ({name}) is {status} in process {pid}{where}; stop it "
                    "before deleting"
                )
            for table in METRIC_TABLES:
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
            # Its forks keep their copied history and their fork step, not a dangling id.
            conn.execute("UPDATE runs SET parent_id = NULL WHERE parent_id = ?", (run_id,))
        # A replica's batch folder (its checkpoints) goes with the batch's last member.
        left = replicas.folder_left_behind(self.db.run_dir(run_id), self.db.run_dir, self._present)
        self.writes.drop_buffered(run_id)
        self.db.remove_run_dir(run_id)
        if left is not None and left.parent.parent == self.db.run_dir(run_id).parent:
            shutil.rmtree(left, ignore_errors=True)

    def _present(self, run_ids: Sequence[int]) -> list[int]:
        """Those of these runs that are in the store."""
        ids = [int(i) for i in run_ids]
        sql = f"SELECT id FROM runs WHERE id IN ({placeholders(ids)})"
        return [int(row[0]) for row in self.conn.execute(sql, ids).fetchall()] if ids else []

    # -- reading ------------------------------------------------------------------------

    @guarded
    def get_run(self, run_id_or_name: RunRef) -> RunRecord:
        """One run's row as a RunRecord (config, dataset, final and tags decoded)."""
        run_id = self.lookup.id_of(run_id_or_name)
        columns = self.db.run_columns
        row = self.conn.execute(
            f"SELECT {', '.join(columns)} FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        return RunRecord.from_row(columns, row)

    @guarded
    def twins_of(self, run_id: RunRef, kind: str | None = None) -> list[RunRecord]:
        """The forks and replays started from a run (of one `kind`), oldest first."""
        parent = self.lookup.id_of(run_id)
        columns = self.db.run_columns
        if "parent_id" not in columns:  # an old file opened read-only
            return []
        sql = f"SELECT {', '.join(columns)} FROM runs WHERE parent_id = ?"
        params: list[Any] = [parent]
        if kind is not None:
            sql += " AND fork_kind = ?"
            params.append(kind)
        rows = self.conn.execute(sql + " ORDER BY id", params).fetchall()
        return [RunRecord.from_row(columns, row) for row in rows]

    @guarded
    def replays_stamp(self, run_id: RunRef) -> tuple[tuple[int, int], ...]:
        """(id, size of its fork_info) of each replay of a run: a cheap read that changes
        when a replay is added, finishes its analysis or is deleted (a cache key)."""
        if "parent_id" not in self.db.run_columns:  # an old file opened read-only
            return ()
        rows = self.conn.execute(
            "SELECT id, LENGTH(fork_info) FROM runs WHERE parent_id = ? AND fork_kind = ? "
            "ORDER BY id",
            (self.lookup.id_of(run_id), "replay"),
        ).fetchall()
        return tuple((int(i), int(size or 0)) for i, size in rows)

    @guarded
    def runs_frame(self) -> pd.DataFrame:
        """One row per run (oldest first) with its latest train and val loss.

        `tags` is the run's tags as comma-separated text ("" for none).
        """
        latest = (
            "(SELECT value FROM scalars WHERE run_id = r.id AND name = '{}' "
            "ORDER BY step DESC LIMIT 1)"
        )
        rows = self.conn.execute(
            "SELECT r.id, r.name, r.status, r.created, r.started, r.ended, r.step, r.max_steps, "
            "r.device, r.precision, r.n_params, "
            f"{latest.format(VAL_LOSS)}, {latest.format(TRAIN_LOSS)}, "
            "r.diverged_step, r.heartbeat, r.pid, "
            f"{self._column_or_null('pid_started')}, {self._column_or_null('tags')}, "
            f"{self._column_or_null('notes')}, {self._column_or_null('study_id')}, "
            f"{self._column_or_null('parent_id')}, {self._column_or_null('fork_step')}, "
            f"{self._column_or_null('fork_kind')} "
            "FROM runs AS r ORDER BY r.id"
        ).fetchall()
        rows = [
            (
                *head,
                tags_text(decode_json(tags) or ()),
                notes or "",
                study,
                parent,
                step,
                kind or "",
            )
            for *head, tags, notes, study, parent, step, kind in rows
        ]
        return typed_frame(rows, RUNS_FRAME)

    @guarded
    def run_statuses(self) -> dict[int, str]:
        """{run id: status} of every run: one cheap read for a page that waits for a run
        to be added, deleted or to change status (runs_frame reads each run's losses)."""
        rows = self.conn.execute("SELECT id, status FROM runs ORDER BY id").fetchall()
        return {int(run_id): str(status) for run_id, status in rows}

    def _column_or_null(self, column: str) -> str:
        """`r.<column>`, or NULL for a column an old file opened read-only does not have."""
        return f"r.{column}" if column in self.db.run_columns else "NULL"


def _check_fields(fields: Mapping[str, Any]) -> None:
    """StoreError unless every field is a runs column that may be set (id may not)."""
    unknown = sorted(set(fields) - set(RUN_COLUMNS) - {"name"})
    if unknown or "id" in fields:
        bad = unknown[0] if unknown else "id"
        allowed = ", ".join(c for c in RUN_COLUMNS if c != "id")
        raise StoreError(f"run field {bad!r} cannot be set; known fields: {allowed}")
    if "status" in fields:
        _check_status(fields["status"])


def _check_status(status: str) -> None:
    """StoreError unless `status` is one of core.spec.STATUSES."""
    if status not in STATUSES:
        raise StoreError(f"run status {status!r} is not one of {', '.join(STATUSES)}")


def _checked(clean: Callable[[Any], Any], value: Any) -> Any:
    """clean(value), its TagError worded as the StoreError every store caller handles."""
    try:
        return clean(value)
    except TagError as exc:
        raise StoreError(str(exc)) from None
