"""The run queue: a slot to run in, at most N runs 'running' at once."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from blockviz.core import procs
from blockviz.store.connection import Connection, Part, guarded
from blockviz.store.naming import RunRef

if TYPE_CHECKING:
    from blockviz.store.liveness import Liveness
    from blockviz.store.runs import RunLookup


class Queue(Part):
    """The part of RunStore that hands out running slots."""

    def __init__(self, db: Connection, lookup: RunLookup, liveness: Liveness) -> None:
        super().__init__(db)
        self.lookup = lookup
        self.liveness = liveness  # the dead hold no slot

    @guarded
    def claim_slot(
        self,
        run_id: RunRef,
        max_running: int,
        *,
        pid: int | None = None,
        pid_started: float | None = None,
    ) -> bool:
        """Atomically make the run 'running' if fewer than max_running (<=0: no limit) are.

        Only a run still 'queued' (or already 'running': it never waits for itself) is
        claimed: one stopped while it waited (Stop marks a queued run 'stopped' itself
        when its process cannot be signalled) stays stopped, and False comes back
        (`queued_still` tells the two Falses apart).

        A slot is a process of this machine: the replicas of one batch (running runs with
        one pid) hold one slot together, the claiming process's own runs hold none against
        it, and runs of other hosts hold none at all.
        """
        run_id = self.lookup.id_of(run_id)
        self.liveness.reap_dead()
        host = procs.this_host()
        with self.db.transaction() as conn:
            if max_running > 0:
                # The slots are this machine's: another host's runs take none of them.
                (running,) = conn.execute(
                    "SELECT COUNT(DISTINCT COALESCE(pid, -id)) FROM runs "
                    "WHERE status = 'running' AND id != ? AND COALESCE(host, ?) = ? "
                    "AND (? IS NULL OR pid IS NULL OR pid != ?)",
                    (run_id, host, host, pid, pid),
                ).fetchone()
                if running >= max_running:
                    return False  # committed: the count was a read
            now = time.time()
            cursor = conn.execute(
                "UPDATE runs SET status = 'running', started = ?, heartbeat = ?, "
                "pid = COALESCE(?, pid), pid_started = COALESCE(?, pid_started) "
                "WHERE id = ? AND status IN ('queued', 'running')",
                (now, now, pid, pid_started if pid is not None else None, run_id),
            )
        return cursor.rowcount == 1

    @guarded
    def queued_still(self, run_id: RunRef) -> bool:
        """Whether the run is still 'queued' (not stopped while it waited for a slot)."""
        run_id = self.lookup.id_of(run_id)
        row = self.conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        return row is not None and row[0] == "queued"
