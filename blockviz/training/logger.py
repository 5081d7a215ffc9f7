"""The run store inside Lightning: a Logger for scalars and a Callback for the run's life.

`StoreLogger` buffers what `self.log` records into the `RunStore`, flushed about every
second. `RunLifecycle` keeps the heartbeat's step, turns a stop request into Lightning's
own stop, and makes the store's rows safe before each checkpoint exists.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from blockviz.core import startup_trace
from blockviz.store import RunStore, StoreError
from blockviz.training.lifecycle import Heartbeat, StopRequest

FLUSH_EVERY_S = 1.0
PENDING_ROWS_KEY = "blockviz_pending_rows"  # checkpoint entry: rows the store had not taken

log = logging.getLogger(__name__)


class StoreLogger(Logger):
    """A Lightning Logger buffering scalars into a RunStore, flushed about every second."""

    def __init__(self, store: RunStore, run_id: int, flush_every_s: float = FLUSH_EVERY_S) -> None:
        super().__init__()
        self.store = store
        self.run_id = run_id
        self.flush_every_s = flush_every_s
        # The first rows (step 0's loss) are flushed at once, so the Live page has a point
        # to draw as soon as the first step ends; after that, about every flush_every_s.
        self._last_flush = -math.inf

    @property
    def name(self) -> str:
        """Logger name (Lightning shows it in paths it never creates here)."""
        return "blockviz"

    @property
    def version(self) -> int:
        """The run id."""
        return self.run_id

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """No-op: the run's config is already in the store and in config.json."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Buffer one row per metric at `step`; flush when the last flush is old enough."""
        rows = [
            (step or 0, name, float(value))
            for name, value in metrics.items()
            if name not in ("epoch", "step")
        ]
        self.store.log_scalars(self.run_id, rows)
        self.save()

    @rank_zero_only
    def save(self) -> None:
        """Flush buffered rows if the last flush is older than `flush_every_s`."""
        now = time.monotonic()
        if now - self._last_flush >= self.flush_every_s:
            self._last_flush = now
            self.store.flush()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Flush everything buffered."""
        self.store.flush()


class RunLifecycle(Callback):
    """Heartbeat step, stop requests, and the store's rows made safe at each checkpoint
    (of the runs `run_ids`: one, or a batch's replicas)."""

    def __init__(
        self,
        stop: StopRequest,
        heartbeats: Sequence[Heartbeat] = (),
        store: RunStore | None = None,
        run_ids: Sequence[int | None] = (None,),
    ) -> None:
        self.stop = stop
        self.heartbeats = list(heartbeats)
        self.store = store
        self.run_ids = list(run_ids)
        self.stopped_at: int | None = None

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Flush before the checkpoint exists; rows a locked store refused ride inside it
        (a batch's by run id).

        So a kill at any moment after a checkpoint at step S leaves every row up to S
        either in the store or in the checkpoint, and a resume from S loses none.
        """
        if self.store is None:
            return
        try:
            self.store.flush()
        except StoreError as exc:
            log.warning("flush before checkpoint failed: %s", exc)
        rows = {str(run_id): self.store.buffered_rows(run_id) for run_id in self.run_ids}
        checkpoint[PENDING_ROWS_KEY] = rows if len(rows) > 1 else next(iter(rows.values()))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Mark the end of Lightning's set-up for the start-up trace (benchmarks only)."""
        startup_trace.mark("fit set up, first step begins")

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Record the step; turn a stop request Lightning missed into its own stop."""
        startup_trace.mark("first step done")
        for heartbeat in self.heartbeats:
            heartbeat.step = trainer.global_step
        if self.stop.requested and not trainer.received_sigterm:
            # The signal came before fit installed Lightning's handler (which resets it).
            raise SIGTERMException

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Remember where a stop interrupted fit (LastCheckpoint saved that step)."""
        if isinstance(exception, SIGTERMException):
            self.stopped_at = trainer.global_step
