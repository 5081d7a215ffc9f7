"""Liveness: heartbeats, and reaping the dead.

A training process beats while it trains. A reader that finds a queued or running run
whose process is gone (`procs.is_alive`: pid and start time) and whose beat is stale marks
it failed, so a killed run never stays 'running'.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from blockviz.core import procs
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.store.connection import Connection, Part, guarded
from blockviz.store.naming import RunRef
from blockviz.store.values import placeholders

if TYPE_CHECKING:
    from blockviz.store.reads import Reads
    from blockviz.store.runs import RunLookup
    from blockviz.store.writes import Writes

HEARTBEAT_WRITE_S = 1.0  # a run's heartbeat reaches the file at most this often
STALE_AFTER_S = 30.0  # a run whose process is gone is failed once its beat is this old


class Liveness(Part):
    """The part of RunStore that knows which runs are alive."""

    def __init__(self, db: Connection, lookup: RunLookup, writes: Writes, reads: Reads) -> None:
        super().__init__(db)
        self.lookup = lookup
        self.writes = writes  # beats wait there for a flush
        self.reads = reads  # the last step a run logged

    @guarded
    def heartbeat(self, run_id: int, step: int) -> None:
        """Record that the run is alive at `step`; written now, or with the next flush."""
        run_id = int(run_id)
        self.writes.pending_beats[run_id] = (time.time(), int(step))
        # At most one write a second per run; a held beat rides along with the next flush.
        written = self.writes.beats_written.get(run_id)
        if written is None or time.monotonic() - written >= HEARTBEAT_WRITE_S:
            self.writes.flush()

    @guarded
    def reap_dead(self, stale_after: float = STALE_AFTER_S) -> list[int]:
        """Mark queued/running runs whose process is gone and beat is stale as failed.

        "Gone" means no live, non-zombie process with the run's pid and start time
        (`procs.is_alive`): a pid now used by another process does not keep a run alive.
        A read-only store is left as it is.
        """
        if self.db.readonly:
            return []
        now = time.time()
        cutoff = now - stale_after
        # A plain read first: the dashboard calls this on every refresh and must not
        # queue for the write lock when nothing has died.
        started_column = "pid_started" if "pid_started" in self.db.run_columns else "NULL"
        study_column = "study_id" if "study_id" in self.db.run_columns else "NULL"
        candidates = self.conn.execute(
            f"SELECT id, pid, {started_column} FROM runs "
            f"WHERE status IN ({placeholders(ACTIVE_STATUSES)}) "
            "AND COALESCE(heartbeat, started, created, 0) < ? "
            # A study's run no worker has claimed yet never had a process to lose.
            f"AND NOT (status = 'queued' AND pid IS NULL AND {study_column} IS NOT NULL)",
            (*ACTIVE_STATUSES, cutoff),
        ).fetchall()
        dead = [
            (run_id, pid) for run_id, pid, began in candidates if not procs.is_alive(pid, began)
        ]
        if not dead:
            return []
        reaped: list[int] = []
        with self.db.transaction() as conn:
            for run_id, pid in dead:
                who = f"process {pid}" if pid else "the run's process"
                cursor = conn.execute(
                    f"UPDATE runs SET status = 'failed', ended = ?, error = ? "
                    f"WHERE id = ? AND pid IS ? AND status IN ({placeholders(ACTIVE_STATUSES)}) "
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
        return reaped

    def _settle_step(self, run_id: int) -> None:
        """Set the run's step to the last step it logged, when its rows got further."""
        logged = self.reads.max_logged_step(run_id)
        if logged is not None:
            self.conn.execute(
                "UPDATE runs SET step = MAX(COALESCE(step, 0), ?) WHERE id = ?", (logged, run_id)
            )

    @guarded
    def settle_step(self, run_id: RunRef) -> None:
        """The run's step made consistent with its rows (for a run that ended abruptly)."""
        run_id = self.lookup.id_of(run_id)
        with self.db.transaction():
            self._settle_step(run_id)
