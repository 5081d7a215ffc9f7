"""KeptCheckpoints: a checkpoint every `ckpt_interval` steps, at most `ckpt_keep` on disk.

The steps a fork or a replay can start from (`core.forks` names the files and says how
they thin out). A checkpoint at step N holds the state after N updates with everything
that ran before it: at a step that is also evaluated, it is written after the evaluation
(as last.ckpt is), so a run restored from it goes on with batch N and never evaluates step
N twice. Each is a full training checkpoint (weights, optimizer, schedule, random state).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from blockviz.core import forks


class KeptCheckpoints(Callback):
    """Writes `step-N.ckpt` every `interval` steps (on the current spacing) and thins."""

    def __init__(self, run_dir: str | Path, interval: int, keep: int, eval_interval: int) -> None:
        self.run_dir = Path(run_dir)
        self.interval, self.keep, self.eval_interval = interval, keep, eval_interval
        self.every = interval  # the spacing now: the interval, doubled by each thinning
        # The kept steps, in memory: every DDP rank thins by them alike (a rank that skipped
        # a save the others make would wait at its barrier forever); rank 0 deletes files.
        self.steps: list[int] = []
        self._due: int | None = None  # a step whose checkpoint waits for its evaluation

    def state_dict(self) -> dict[str, Any]:
        """In last.ckpt: a resumed run goes on with the spacing and kept steps it had."""
        return {"every": self.every, "steps": list(self.steps)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The spacing (a multiple of the interval, else the interval) and kept steps of the
        run resumed."""
        every = state_dict.get("every")
        ok = isinstance(every, int) and every >= self.interval and every % self.interval == 0
        self.every = every if ok else self.interval
        steps = state_dict.get("steps")
        self.steps = sorted(int(s) for s in steps) if isinstance(steps, list) else []

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        """After update N: keep step N now, or after its evaluation when one is due."""
        step = trainer.global_step
        if step % self.interval or step % self.every:
            return
        if step % self.eval_interval == 0:
            self._due = step
            return
        self._save(trainer, pl_module, step)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The evaluation of a due step is done: keep it."""
        if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking:
            return
        if self._due == trainer.global_step:
            self._save(trainer, pl_module, self._due)
        self._due = None

    def _save(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        # The loss is checked for NaN only when it is logged: weights that went non-finite
        # in between are no state to fork from. (Every rank holds the same weights.)
        with torch.no_grad():
            if not all(bool(torch.isfinite(p).all()) for p in pl_module.parameters()):
                return
        trainer.save_checkpoint(forks.kept_path(self.run_dir, step), weights_only=False)
        self.steps = sorted({*self.steps, step})
        self.every, dropped = forks.thinned(self.steps, self.every, self.keep)
        self.steps = [kept for kept in self.steps if kept not in dropped]
        if trainer.is_global_zero:
            for old in dropped:
                with contextlib.suppress(FileNotFoundError):
                    forks.kept_path(self.run_dir, old).unlink()
