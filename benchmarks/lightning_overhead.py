"""Where the per-step overhead of `blockviz train` comes from, in CPU time per step.

Three loops train the same baby-cpu model on the same batches with the same AdamW, schedule
and clipping, with no probes, samples, logger or validation:

- `plain`: a bare PyTorch loop;
- `lightning-bare`: a minimal LightningModule (training_step + configure_optimizers) in a
  Trainer with checkpointing, logging and the progress bar off: Lightning's own loop;
- `blockviz`: LitCharModel in `make_trainer`'s Trainer (checkpoint callbacks, our per-step
  loss bookkeeping), still without probes.

CPU time (`time.process_time`) per step is robust to other processes on a shared machine,
which wall time is not; one torch thread keeps it equal to the work done.

    .venv/bin/python benchmarks/lightning_overhead.py --steps 120 --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lightning as L
import torch

from blockviz.core import config as cfg
from blockviz.core.bounds import MAX_STEPS
from blockviz.training.data import CharDataModule
from blockviz.training.lit import LitCharModel, lr_at, param_groups
from blockviz.training.model import CharTransformer
from blockviz.training.trainer import make_trainer, quiet_lightning

WARMUP_STEPS = 5  # left out of the medians (first-call allocations)


class StepClock(L.Callback):
    """CPU time between consecutive training batches."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self._last: float | None = None

    def on_train_batch_start(self, *args: object) -> None:
        """Record the time since the previous batch started."""
        now = time.process_time()
        if self._last is not None:
            self.steps.append(now - self._last)
        self._last = now


class MinimalModule(L.LightningModule):
    """The least a LightningModule needs: a step and an optimizer."""

    def __init__(self, run: cfg.RunConfig) -> None:
        super().__init__()
        self.run = run
        self.model = CharTransformer(run.model)

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        """Next-character loss."""
        x, y = batch
        return self.model(x, y)[1]

    def configure_optimizers(self) -> dict:
        """The same AdamW and schedule as LitCharModel."""
        train = self.run.train
        optimizer = torch.optim.AdamW(
            param_groups(self.model, train.weight_decay),
            lr=train.lr,
            betas=(train.beta1, train.beta2),
        )
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: lr_at(s, train) / train.lr
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def plain(run: cfg.RunConfig, dm: CharDataModule) -> list[float]:
    """A bare PyTorch loop; CPU seconds per step."""
    train = run.train
    torch.manual_seed(train.seed)
    model = CharTransformer(run.model)
    optimizer = torch.optim.AdamW(
        param_groups(model, train.weight_decay), lr=train.lr, betas=(train.beta1, train.beta2)
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, train) / train.lr)
    batches = iter(dm.train_dataloader())
    steps, last = [], None
    for _ in range(train.max_steps):
        now = time.process_time()
        if last is not None:
            steps.append(now - last)
        last = now
        x, y = next(batches)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        loss.item()
    return steps


def lightning_bare(run: cfg.RunConfig, dm: CharDataModule) -> list[float]:
    """Lightning's loop around a minimal module; CPU seconds per step."""
    clock = StepClock()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=run.train.max_steps,
        max_epochs=-1,
        gradient_clip_val=run.train.grad_clip,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        callbacks=[clock],
        use_distributed_sampler=False,
    )
    torch.manual_seed(run.train.seed)
    trainer.fit(MinimalModule(run), train_dataloaders=dm.train_dataloader())
    return clock.steps


def blockviz(run: cfg.RunConfig, dm: CharDataModule) -> list[float]:
    """LitCharModel in make_trainer's Trainer, probes off; CPU seconds per step."""
    clock = StepClock()
    with tempfile.TemporaryDirectory() as run_dir:
        lit = LitCharModel(run.to_dict(), dm.vocab.to_json())
        make_trainer(run, [clock], None, run_dir).fit(lit, datamodule=dm)
    return clock.steps


def main() -> int:
    """Alternate the three loops and print the median CPU ms per step of each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quiet_lightning()
    run = cfg.preset("baby-cpu")
    dm = CharDataModule(run.data, run.model.block_size, run.train.batch_size, eval_iters=1)
    dm.setup()
    run = cfg.replace(
        run,
        vocab_size=dm.vocab.size,
        max_steps=args.steps,
        eval_interval=MAX_STEPS,
        warmup_steps=5,
    )
    loops: dict[str, Callable[[cfg.RunConfig, CharDataModule], list[float]]] = {
        "plain": plain,
        "lightning-bare": lightning_bare,
        "blockviz": blockviz,
    }
    times: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.reps):
        for name, loop in loops.items():
            times[name] += loop(run, dm)[WARMUP_STEPS:]
    base = statistics.median(times["plain"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:15s} {1e3 * median:7.2f} ms/step CPU  (+{1e3 * (median - base):5.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
