"""Studies in the store: a studies table, and runs that link to their study and variant.

A study's runs are created with it, all at once, as 'queued' rows without a process
(`pid` NULL); a study worker claims them one at a time (`claim_study_run`), or a batch of
replicas at once (`claim_study_runs`). Such unclaimed
rows are not reaped as dead: no process was ever theirs. Whether anything still works on
a study is the study runner's question (it knows the workers), not the reaper's.

A run that trained before is queued again with its rows (`requeue_runs`: `study resume`;
`requeue_lost`: its process was lost while the study ran). The worker that claims it
continues it from its checkpoint, with the rest of its batch when it trained as a replica;
a run whose checkpoint the claiming worker cannot see has its rows dropped in the claim and
trains again from the start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blockviz import CLI
from blockviz.core import procs
from blockviz.core.naming import is_id_text, run_id_from_text, sanitize_name, shortened_id
from blockviz.core.replicas import even_batch, resumed_together
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.store.connection import Connection, Part, guarded
from blockviz.store.errors import StoreError
from blockviz.store.records import StudyRecord
from blockviz.store.schema import METRIC_TABLES, STUDIES_FRAME, typed_frame
from blockviz.store.values import decode_json, encode_json, placeholders

if TYPE_CHECKING:  # pandas is imported where a frame is built, never by a training process
    import pandas as pd

    from blockviz.store.runs import Runs
    from blockviz.store.writes import Writes

STUDY_STATUSES = ("running", "stopped", "completed")
FINISHED = ("completed", "diverged")  # a run's ends that need no more training
# A server claim that finds every unclaimed run held by another worker's claim reads again
# this often, for up to the store's busy timeout, before it says there is nothing to claim.
CLAIM_RETRY_S = 0.02
STUDY_FIELDS = ("name", "status", "ended", "error", "workers")
# A run lost with its process while its study runs is queued again at most this many times;
# lost once more, it stays failed (`study resume` then trains it again, and counts anew).
MAX_LOST = 3
# What queues a run again, with `error` and `lost` set beside it (its rows, step, start and
# final metrics stay until a worker claims it: it continues from its checkpoint, or drops
# them and starts over).
REQUEUED = (
    "status = 'queued', pid = NULL, pid_started = NULL, ended = NULL, heartbeat = NULL, "
    "diverged_step = NULL, host = NULL, boot_id = NULL, stop_requested = NULL"
)
INIT_GRADS_FILE = "init_grads.json"  # what the init-gradients study writes into its folder


# The studies table's columns, in StudyRecord's field order.
STUDY_COLUMNS = (
    "id",
    "name",
    "key",
    "size",
    "status",
    "created",
    "ended",
    "spec",
    "error",
    "workers",
)


class Studies(Part):
    """The part of RunStore that keeps studies and hands their runs to workers."""

    def __init__(self, db: Connection, runs: Runs, writes: Writes) -> None:
        super().__init__(db)
        self.runs = runs  # unique run names, the runs frame
        self.writes = writes  # a requeued run's buffered rows are dropped

    @guarded
    def create_study(
        self,
        name: str,
        key: str,
        size: str,
        spec: Mapping[str, Any],
        runs: Sequence[Mapping[str, Any]],
    ) -> tuple[int, list[int]]:
        """The study and its runs, in one transaction; (study id, run ids in order).

        Each of `runs` is {"variant", "seed", "config" (JSON text), "max_steps"}; run names
        are `<study name> <variant> seed <n>`, made safe and unique.
        """
        now = time.time()
        with self.db.transaction() as conn:
            (study_id,) = conn.execute(
                "INSERT INTO studies (name, key, size, status, created, spec) "
                "VALUES (?, ?, ?, 'running', ?, ?) RETURNING id",
                (sanitize_name(name), key, size, now, encode_json(dict(spec))),
            ).fetchone()
            run_ids = []
            for run in runs:
                base = sanitize_name(f"{name} {run['variant']} seed {run['seed']}")
                row = {
                    "name": self.runs.unique_name(base),
                    "created": now,
                    "status": "queued",
                    "config": run["config"],
                    "max_steps": int(run["max_steps"]),
                    "study_id": study_id,
                    "variant": str(run["variant"]),
                    "seed": int(run["seed"]),
                }
                (run_id,) = conn.execute(
                    f"INSERT INTO runs ({', '.join(row)}) VALUES ({placeholders(row)}) "
                    "RETURNING id",
                    list(row.values()),
                ).fetchone()
                run_ids.append(int(run_id))
        return int(study_id), run_ids

    def study_dir(self, study_id: int | str) -> Path:
        """<store>.studies/<id>: a study's own files (worker log, init-gradient results)."""
        return self.db.studies_root / str(_study_id(study_id))

    @guarded
    def get_study(self, study_id: int | str) -> StudyRecord:
        """The study's row as a StudyRecord (`spec` and `workers` decoded); StoreError if
        unknown."""
        row = self.conn.execute(
            f"SELECT {', '.join(STUDY_COLUMNS)} FROM studies WHERE id = ?", (_study_id(study_id),)
        ).fetchone()
        if row is None:
            raise StoreError(f"no study {study_id} in {self.db.where}; `study list` shows them")
        return StudyRecord.from_row(STUDY_COLUMNS, row)

    @guarded
    def update_study(self, study_id: int | str, **fields: Any) -> None:
        """Set some of a study's fields (name, status, ended, error, workers)."""
        unknown = sorted(set(fields) - set(STUDY_FIELDS))
        if unknown:
            raise StoreError(f"study field {unknown[0]!r} cannot be set")
        if "status" in fields and fields["status"] not in STUDY_STATUSES:
            raise StoreError(f"study status {fields['status']!r} is not one of {STUDY_STATUSES}")
        if "workers" in fields:
            fields["workers"] = encode_json(list(fields["workers"]))
        if not fields:
            return
        sets = ", ".join(f"{column} = ?" for column in fields)
        with self.db.transaction() as conn:
            conn.execute(
                f"UPDATE studies SET {sets} WHERE id = ?", [*fields.values(), _study_id(study_id)]
            )

    @guarded
    def studies_frame(self) -> pd.DataFrame:
        """One row per study (oldest first) with its runs counted by status."""
        rows = self.conn.execute(
            "SELECT s.id, s.name, s.key, s.size, s.status, s.created, s.ended, "
            "COUNT(r.id), "
            f"{_count_of('completed', 'diverged')}, {_count_of('running')}, "
            f"{_count_of('queued')}, {_count_of('failed', 'stopped')} "
            "FROM studies AS s LEFT JOIN runs AS r ON r.study_id = s.id "
            "GROUP BY s.id ORDER BY s.id"
        ).fetchall()
        rows = [(*row[:7], *(int(v or 0) for v in row[7:])) for row in rows]
        return typed_frame(rows, STUDIES_FRAME)

    @guarded
    def study_runs(self, study_id: int | str) -> pd.DataFrame:
        """The study's runs as `runs_frame` rows plus study_id, variant, seed, config
        (JSON text), final and dataset (dicts); in creation order."""
        sid = _study_id(study_id)
        rows = self.conn.execute(
            "SELECT id, variant, seed, config, final, dataset FROM runs "
            "WHERE study_id = ? ORDER BY id",
            (sid,),
        ).fetchall()
        frame = self.runs.runs_frame()
        frame = frame[frame["id"].isin([r[0] for r in rows])].reset_index(drop=True)
        extra = {
            r[0]: {
                "variant": r[1] or "",
                "seed": int(r[2]) if r[2] is not None else 0,
                "config": r[3] or "",
                "final": decode_json(r[4]) or {},
                "dataset": decode_json(r[5]) or {},
            }
            for r in rows
        }
        frame["study_id"] = sid
        for column in ("variant", "seed", "config", "final", "dataset"):
            frame[column] = [extra[int(i)][column] for i in frame["id"]]
        return frame

    @guarded
    def claim_study_run(
        self, study_id: int | str, pid: int, pid_started: float | None
    ) -> int | None:
        """Give the oldest unclaimed queued run of the study to process `pid`; its id.

        None when every run is claimed or done. Atomic: two workers never get one run.
        """
        claimed = self.claim_study_runs(study_id, pid, pid_started, 1, lambda config: None)
        return claimed[0] if claimed else None

    @guarded
    def claim_study_runs(
        self,
        study_id: int | str,
        pid: int,
        pid_started: float | None,
        limit: int,
        key_of: Callable[[str | None], str | None],
        workers: int = 1,
    ) -> list[int]:
        """Give the oldest unclaimed queued run of the study, and up to `limit` - 1 more
        whose `key_of(config)` is the same (not None), to process `pid`; their ids.

        A batch of replicas is claimed at once, as large as splitting the runs of its key
        into even batches of at most `limit` makes it (`even_batch`), and at most its share
        of the unclaimed runs among the study's `workers`. A run queued again after it
        trained comes with the rest of its checkpoint's batch (`_to_claim`). Empty when
        every run is claimed or done, or those left wait for a batch mate still held.
        Atomic: two workers never get one run.
        """
        sid = _study_id(study_id)
        # SQLite lets one writer in at a time (BEGIN IMMEDIATE). A server lets workers
        # claim at once: each locks the unclaimed runs it reads (FOR UPDATE SKIP LOCKED)
        # and chooses among them; runs another worker is claiming right now are skipped,
        # and when all of them are, it reads again rather than report nothing to claim.
        server = self.db.is_server
        unclaimed = "FROM runs WHERE study_id = ? AND status = 'queued' AND pid IS NULL"
        deadline = time.monotonic() + self.db.wait_s()
        with self.db.transaction(serial=not server) as conn:
            while True:
                rows = conn.execute(
                    f"SELECT id, config, started {unclaimed} ORDER BY id"
                    + (" FOR UPDATE SKIP LOCKED" if server else ""),
                    (sid,),
                ).fetchall()
                if rows or not server or time.monotonic() > deadline:
                    break
                if conn.execute(f"SELECT COUNT(*) {unclaimed}", (sid,)).fetchone()[0] == 0:
                    break
                time.sleep(CLAIM_RETRY_S)  # a fresh read sees the other worker's claim
            chosen, again = self._to_claim(conn, rows, limit, key_of, workers)
            if not chosen:
                return []
            if again:  # trained before, no checkpoint to continue from here: from the start
                self._start_over(conn, again)
            host, boot, now = procs.this_host(), procs.boot_id(), time.time()
            # A beat at the claim: the run's silence is counted from now, not from when
            # the study was stored (another host's reaper would fail it at once).
            conn.executemany(
                "UPDATE runs SET pid = ?, pid_started = ?, host = ?, boot_id = ?, heartbeat = ? "
                "WHERE id = ?",
                [(int(pid), pid_started, host, boot, now, run_id) for run_id in chosen],
            )
        return chosen

    def _to_claim(
        self,
        conn: Any,
        rows: list[tuple[int, str | None, float | None]],
        limit: int,
        key_of: Callable[[str | None], str | None],
        workers: int,
    ) -> tuple[list[int], list[int]]:
        """(the runs to claim, those of them that trained before and start over) from the
        unclaimed (id, config, started) rows, oldest first.

        A run that trained before (`started`) and has a checkpoint here continues from it
        with the others its checkpoint holds (its batch's queued members), whatever the
        replica limit, and only once none of them is held by a process; every other run is
        claimed as a new one is (`batch_to_claim`).
        """
        groups = {
            int(run_id): resumed_together(int(run_id), self.db.run_dir)
            for run_id, _, started in rows
            if started is not None
        }
        waiting = {int(row[0]) for row in rows}
        fresh = [(int(row[0]), row[1]) for row in rows if groups.get(int(row[0])) is None]
        for run_id, _, _ in rows:
            together = groups.get(int(run_id))
            if together is None:
                chosen = batch_to_claim(fresh, limit, key_of, workers)
                return chosen, [i for i in chosen if int(i) in groups]
            if self._free(conn, together, waiting):
                return [i for i in together if i in waiting], []
        return [], []

    @staticmethod
    def _free(conn: Any, together: list[int], waiting: set[int]) -> bool:
        """Whether runs that continue from one checkpoint may be claimed: each is waiting
        unclaimed, or no process holds it (ended, or deleted)."""
        held = conn.execute(
            f"SELECT id FROM runs WHERE id IN ({placeholders(together)}) "
            f"AND status IN ({placeholders(ACTIVE_STATUSES)})",
            (*together, *ACTIVE_STATUSES),
        ).fetchall()
        return all(int(row[0]) in waiting for row in held)

    def _start_over(self, conn: Any, run_ids: list[int]) -> None:
        """Runs that train again from the start: their rows deleted, their step, start and
        final metrics cleared."""
        for run_id in run_ids:
            self.writes.drop_buffered(run_id)
            for table in METRIC_TABLES:
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            conn.execute(
                "UPDATE runs SET started = NULL, step = 0, final = NULL WHERE id = ?", (run_id,)
            )

    @guarded
    def stop_unclaimed(self, study_id: int | str) -> int:
        """Mark the study's queued runs that no worker claimed 'stopped'; how many."""
        with self.db.transaction() as conn:
            cursor = conn.execute(
                "UPDATE runs SET status = 'stopped', ended = ? "
                "WHERE study_id = ? AND status = 'queued' AND pid IS NULL",
                (time.time(), _study_id(study_id)),
            )
        return max(cursor.rowcount, 0)

    @guarded
    def requeue_runs(self, run_ids: Sequence[int]) -> int:
        """Queue unfinished runs (stopped or failed) again for the study's workers; how many.

        Their rows stay: the worker that claims one continues it from its checkpoint, or
        drops them and starts over when it has none (`claim_study_runs`). The count of its
        losses starts anew.
        """
        ids = [int(i) for i in run_ids]
        if not ids:
            return 0
        with self.db.transaction() as conn:
            cursor = conn.execute(
                f"UPDATE runs SET {REQUEUED}, error = NULL, lost = NULL "
                f"WHERE id IN ({placeholders(ids)}) AND status IN ('stopped', 'failed')",
                ids,
            )
        return max(cursor.rowcount, 0)

    @guarded
    def study_active_runs(self, study_id: int | str) -> list[int]:
        """Ids of the study's queued or running runs."""
        rows = self.conn.execute(
            "SELECT id FROM runs WHERE study_id = ? "
            f"AND status IN ({placeholders(ACTIVE_STATUSES)}) ORDER BY id",
            (_study_id(study_id), *ACTIVE_STATUSES),
        ).fetchall()
        return [int(r[0]) for r in rows]

    @guarded
    def settle_study(self, study_id: int | str) -> str | None:
        """End a running study that has no run left to train (queued or running): completed
        when every run finished (completed or diverged), else stopped, its error counting
        the runs that did not and naming the command that trains them again. The status it
        set (None: the study was not running, or runs are left)."""
        sid = _study_id(study_id)
        with self.db.transaction() as conn:
            (status,) = conn.execute("SELECT status FROM studies WHERE id = ?", (sid,)).fetchone()
            counts = dict(
                conn.execute(
                    "SELECT status, COUNT(*) FROM runs WHERE study_id = ? GROUP BY status", (sid,)
                ).fetchall()
            )
            if status != "running" or any(counts.get(s) for s in ACTIVE_STATUSES):
                return None
            left = sum(n for state, n in counts.items() if state not in FINISHED)
            error = None
            if left:
                error = (
                    f"{left} of {sum(counts.values())} runs failed or stopped; "
                    f"`{CLI} study resume {sid}` trains them again"
                )
            settled = "stopped" if left else "completed"
            conn.execute(
                "UPDATE studies SET status = ?, ended = ?, error = ? WHERE id = ?",
                (settled, time.time(), error, sid),
            )
        return settled


def requeue_lost(conn: Any, run_id: int, why: str) -> bool:
    """A run the reaper has just failed (`why`: its process was lost), queued again when its
    study is running and it was lost at most MAX_LOST times, else left failed saying so;
    whether it was queued. Inside the reaper's transaction, so each loss counts once."""
    row = conn.execute(
        "SELECT r.lost, s.id, s.status FROM runs AS r JOIN studies AS s ON s.id = r.study_id "
        "WHERE r.id = ?",
        (run_id,),
    ).fetchone()
    if row is None or row[2] != "running":
        return False
    lost, study_id = int(row[0] or 0) + 1, int(row[1])
    if lost > MAX_LOST:
        error = (
            f"{why}; lost {lost} times, more than the {MAX_LOST} its study's workers take "
            f"again by themselves: `{CLI} study resume {study_id}` trains it again"
        )
        conn.execute("UPDATE runs SET lost = ?, error = ? WHERE id = ?", (lost, error, run_id))
        return False
    conn.execute(
        f"UPDATE runs SET {REQUEUED}, lost = ?, error = ? WHERE id = ?",
        (lost, f"{why}; queued again ({lost} of at most {MAX_LOST} times)", run_id),
    )
    return True


def batch_to_claim(
    rows: list[tuple[int, str | None]],
    limit: int,
    key_of: Callable[[str | None], str | None],
    workers: int,
) -> list[int]:
    """The runs to claim from the unclaimed (id, config) rows, oldest first: the oldest and
    up to `limit` - 1 more of its key, in an even batch, within this worker's share (what a
    worker claims, and what a study's time estimate plays through)."""
    key = key_of(rows[0][1]) if limit > 1 else None
    same = [int(rows[0][0])]
    if key is not None:
        same += [int(run_id) for run_id, config in rows[1:] if key_of(config) == key]
    # Even batches: 14 runs of one shape at most 8 at once are 7 + 7, not 8 + 6; and no
    # more than this worker's share of what is left, so no worker sits idle while another
    # trains a large batch (9 runs, 2 workers: 3, 3, 2, 1).
    share = -(-len(rows) // max(1, workers))
    return same[: min(even_batch(len(same), limit), share)]


def _count_of(*statuses: str) -> str:
    """SQL counting a study's runs in these statuses (SQLite and PostgreSQL alike)."""
    listed = ", ".join(f"'{status}'" for status in statuses)
    return f"SUM(CASE WHEN r.status IN ({listed}) THEN 1 ELSE 0 END)"


def _study_id(study_id: int | str) -> int:
    text = str(study_id).strip()
    if not is_id_text(text):
        raise StoreError(f"a study is named by its number, not {str(study_id)[:40]!r}")
    number = run_id_from_text(text)  # None: more digits than int() or SQLite takes
    if number is None:
        raise StoreError(f"no study {shortened_id(text)}; `study list` shows them")
    return number
