"""The run queue: a slot to run in, at most N runs 'running' at once."""

from __future__ import annotations

import time
from collections.abc import Callable

from blockviz.store.connection import _Connection, guarded
from blockviz.store.naming import RunRef


class _Queue(_Connection):
    """The part of RunStore that hands out running slots."""

    # From runs.py and liveness.py.
    _resolve: Callable[[RunRef], int]
    reap_dead: Callable[..., list[int]]

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
        """
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
            cursor = self.conn.execute(
                "UPDATE runs SET status = 'running', started = ?, heartbeat = ?, "
                "pid = COALESCE(?, pid), pid_started = COALESCE(?, pid_started) "
                "WHERE id = ? AND status IN ('queued', 'running')",
                (now, now, pid, pid_started if pid is not None else None, run_id),
            )
            self._commit()
        except BaseException:
            self._rollback()
            raise
        return cursor.rowcount == 1

    @guarded
    def queued_still(self, run_id: RunRef) -> bool:
        """Whether the run is still 'queued' (not stopped while it waited for a slot)."""
        run_id = self._resolve(run_id)
        row = self.conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        return row is not None and row[0] == "queued"
