"""Liveness: heartbeats, reaping the dead, and stops asked through the store.

A training process beats while it trains (every couple of seconds, lifecycle.Heartbeat).
A reader that finds a queued or running run whose beat is stale and whose process is gone
marks it failed, so a killed run never stays 'running'. Each run records its host and boot
(core.procs): a run of this machine's boot is judged by its process (`procs.is_alive`: pid
and start time) once its beat is STALE_AFTER_S old; a run of another host, or of this host
before it restarted, cannot be looked up and is failed only when its beat is
REMOTE_STALE_AFTER_S old ($BLOCKVIZ_REMOTE_STALE_S sets another timeout). A reaped run
of a running study is queued again at once, to continue from its checkpoint on whichever
worker of the study claims it next (`studies.requeue_lost`: once per loss, at most
`studies.MAX_LOST` times).

A Stop can be asked through the store (`request_stop`): the run's process reads it with
the heartbeat it writes and stops as if signalled, on whatever host it runs.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from blockviz.core import procs
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.store.connection import Connection, Part, guarded
from blockviz.store.naming import RunRef
from blockviz.store.studies import requeue_lost
from blockviz.store.values import placeholders

if TYPE_CHECKING:
    from blockviz.store.reads import Reads
    from blockviz.store.records import RunRecord
    from blockviz.store.runs import RunLookup
    from blockviz.store.writes import Writes

HEARTBEAT_WRITE_S = 1.0  # a run's heartbeat reaches the file at most this often
STALE_AFTER_S = 30.0  # a run whose process is gone is failed once its beat is this old
# Another host's run: no pid to check, so only a long silence fails it (many heartbeats).
REMOTE_STALE_AFTER_S = 120.0


def remote_stale_after_s() -> float:
    """$BLOCKVIZ_REMOTE_STALE_S when it is a positive number, else REMOTE_STALE_AFTER_S."""
    try:
        value = float(os.environ.get("BLOCKVIZ_REMOTE_STALE_S", ""))
    except ValueError:
        return REMOTE_STALE_AFTER_S
    return value if value > 0 else REMOTE_STALE_AFTER_S


def process_alive(
    host: str | None,
    boot: str | None,
    pid: int | None,
    began: float | None,
    beat: float | None,
    remote_after: float | None = None,
) -> bool:
    """Whether a run's process is alive, as well as this machine can tell: one of this
    machine (this boot) by its pid and start time; another host's by a beat younger than
    `remote_after` (default: the remote timeout)."""
    if procs.is_this_machine(host, boot):
        return procs.is_alive(pid, began)
    window = remote_stale_after_s() if remote_after is None else remote_after
    return beat is not None and time.time() - beat < window


def run_alive(run: RunRecord) -> bool:
    """`process_alive` of a run's record (a queued or running run's process)."""
    return process_alive(run.host, run.boot_id, run.pid, run.pid_started, run.heartbeat)


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
    def request_stop(self, run_id: RunRef) -> bool:
        """Ask a queued or running run to stop, through the store; whether it was active.

        Its process sees the request with its next heartbeat (a few seconds), on any host.
        """
        run_id = self.lookup.id_of(run_id)
        with self.db.transaction() as conn:
            cursor = conn.execute(
                "UPDATE runs SET stop_requested = ? WHERE id = ? "
                f"AND status IN ({placeholders(ACTIVE_STATUSES)})",
                (time.time(), run_id, *ACTIVE_STATUSES),
            )
        return cursor.rowcount == 1

    def stop_requested(self, run_id: int) -> bool:
        """Whether a Stop for the run was read back with one of this store's heartbeats."""
        return int(run_id) in self.writes.stops_requested

    @guarded
    def reap_dead(
        self, stale_after: float = STALE_AFTER_S, remote_stale_after: float | None = None
    ) -> list[int]:
        """Mark queued/running runs whose process is gone and beat is stale as failed (a
        running study's run: queued again, `requeue_lost`); their ids.

        On this machine "gone" means no live, non-zombie process with the run's pid and
        start time (`procs.is_alive`): a pid now used by another process does not keep a
        run alive. Another host's run (or one from before this machine restarted) is gone
        when its beat is `remote_stale_after` old. A read-only store is left as it is.
        """
        if self.db.readonly:
            return []
        now = time.time()
        cutoff = now - stale_after
        remote = remote_stale_after_s() if remote_stale_after is None else remote_stale_after
        remote_cutoff = now - max(remote, stale_after)
        # A plain read first: the dashboard calls this on every refresh and must not
        # queue for the write lock when nothing has died.
        columns = self.db.run_columns
        started_column = "pid_started" if "pid_started" in columns else "NULL"
        study_column = "study_id" if "study_id" in columns else "NULL"
        host_columns = "host, boot_id" if "host" in columns else "NULL, NULL"
        candidates = self.conn.execute(
            f"SELECT id, pid, {started_column}, {host_columns}, "
            "COALESCE(heartbeat, started, created, 0) FROM runs "
            f"WHERE status IN ({placeholders(ACTIVE_STATUSES)}) "
            "AND COALESCE(heartbeat, started, created, 0) < ? "
            # A study's run no worker has claimed yet never had a process to lose.
            f"AND NOT (status = 'queued' AND pid IS NULL AND {study_column} IS NOT NULL)",
            (*ACTIVE_STATUSES, cutoff),
        ).fetchall()
        dead: list[tuple[int, int | None, float, str]] = []
        for run_id, pid, began, host, boot, beat in candidates:
            # Every candidate's beat is older than stale_after already.
            if process_alive(host, boot, pid, began, beat, max(remote, stale_after)):
                continue
            if procs.is_this_machine(host, boot):
                who = f"process {pid}" if pid else "the run's process"
                dead.append((run_id, pid, cutoff, f"{who} exited without reporting"))
            else:
                silent = f"no heartbeat from host {host} for {now - beat:.0f} s"
                dead.append((run_id, pid, remote_cutoff, silent))
        if not dead:
            return []
        reaped: list[int] = []
        with self.db.transaction() as conn:
            for run_id, pid, before, why in sorted(dead):  # the row order a flush keeps
                why = f"{why} (killed or out of memory?)"
                cursor = conn.execute(
                    "UPDATE runs SET status = 'failed', ended = ?, error = ? "
                    "WHERE id = ? AND (pid = ? OR (pid IS NULL AND ? IS NULL)) "
                    f"AND status IN ({placeholders(ACTIVE_STATUSES)}) "
                    "AND COALESCE(heartbeat, started, created, 0) < ?",
                    (
                        now,
                        why,
                        run_id,
                        pid,
                        pid,
                        *ACTIVE_STATUSES,
                        before,
                    ),
                )
                if cursor.rowcount:
                    reaped.append(run_id)
                    self._settle_step(run_id)
                    requeue_lost(conn, run_id, why)
        return reaped

    def _settle_step(self, run_id: int) -> None:
        """Set the run's step to the last step it logged, when its rows got further."""
        logged = self.reads.max_logged_step(run_id)
        if logged is not None:
            self.conn.execute(
                "UPDATE runs SET step = ? WHERE id = ? AND COALESCE(step, 0) < ?",
                (logged, run_id, logged),
            )

    @guarded
    def settle_step(self, run_id: RunRef) -> None:
        """The run's step made consistent with its rows (for a run that ended abruptly)."""
        run_id = self.lookup.id_of(run_id)
        with self.db.transaction():
            self._settle_step(run_id)
