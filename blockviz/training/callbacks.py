"""Callbacks that watch training: train metrics and clocks, the console line, last.ckpt.

`TrainingMonitor` logs the train/* scalars (loss, lr, step time, tokens/s), keeps the
clocks the final metrics report and stops a run whose loss is no longer finite;
`make_trainer` adds one to every Trainer. `ConsoleProgress` draws the status line from
it. `LastCheckpoint` keeps last.ckpt current. (The probes are `blockviz.training.probes`.)

Metric steps: a number recorded "at step s" describes the model after s optimizer
updates. The training loss at step s is the loss of batch s (computed with those
weights, before update s is applied).
"""

from __future__ import annotations

import collections
import math
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from blockviz.core import spec

# How many recent per-step losses the final `train_loss` averages (one batch is noisy).
RECENT_LOSSES = 50


class TrainingDiverged(Exception):
    """The training loss became NaN or infinite at `step`: a result, reported as such."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"training loss {loss} at step {step}")
        self.step = step
        self.loss = loss


# ---------------------------------------------------------------- the training monitor


class TrainingMonitor(Callback):
    """train/loss, train/lr, train/step_time, train/tokens_per_sec and train/elapsed_s, and
    the clocks.

    train/loss is the cross-entropy (with z-loss on, without its term). The per-step
    losses stay on the device; every `log_interval` steps (and at the last step) they
    reach the host in one transfer and the mean loss, the lr and the throughput of those
    steps are logged at the newest step. On a GPU that transfer is asynchronous (into
    pinned memory) and read at the next logged step, by when it has long arrived, so no
    training step waits for the device (`defer`; a CPU reads at once, as there is nothing
    to wait for): the rows are the same, written one logged step later, and any still in
    flight are read before a checkpoint, a validation and the end. Validation (and the
    checkpointing after it) is left out of the throughput clock; the wall clock runs
    from the first training step to the end of training. A non-finite loss raises
    `TrainingDiverged` (not `should_stop`: Lightning would validate and checkpoint the
    non-finite weights on the way out).
    """

    def __init__(
        self,
        log_interval: int = 1,
        recent_losses: int = RECENT_LOSSES,
        defer: bool | None = None,
    ) -> None:
        self.log_interval = log_interval
        self.defer = defer  # read the losses one logged step late; None: on a CUDA device
        self._in_flight: _Window | None = None
        self._trainer: L.Trainer | None = None  # the one whose loggers take _in_flight
        self._copies: HostCopies | None = None  # made at the first deferred window (a GPU)
        self.last_train: dict[str, float] = {}  # the latest record, for the console line
        self.train_time_s = 0.0  # seconds spent training, validation excluded
        self.tokens_seen = 0
        self._recent_losses: collections.deque[float] = collections.deque(maxlen=recent_losses)
        self._pending_losses: list[torch.Tensor] = []  # device scalars not yet fetched
        self._pending_steps: list[int] = []
        self._pending_lr = 0.0
        self._step = 0
        self._fit_started: float | None = None
        self._fit_ended: float | None = None
        self._window_start = 0.0
        self._window_excluded = 0.0  # validation seconds inside the current window
        self._paused_at: float | None = None  # when the current validation began
        # Losses of steps before a restore that were not logged yet (host floats): the first
        # log after a resume or a fork averages what the uninterrupted run's would have.
        self._carried: list[tuple[int, float]] = []

    def state_dict(self) -> dict[str, Any]:
        """In a checkpoint: the per-step losses not logged yet and the recent ones (one
        device->host copy, at checkpoints only). Losses in flight are logged first, so
        the store holds them before the checkpoint exists."""
        self.drain()
        pending = torch.stack(self._pending_losses).float().tolist() if self._pending_losses else []
        carried = [*self._carried, *zip(self._pending_steps, pending, strict=True)]
        return {
            "pending": [[int(step), float(loss)] for step, loss in carried],
            "recent": [float(loss) for loss in self._recent_losses],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The losses a restored run carries on with."""
        pending = state_dict.get("pending") or []
        self._carried = [(int(step), float(loss)) for step, loss in pending]
        self._recent_losses.clear()
        self._recent_losses.extend(float(loss) for loss in state_dict.get("recent") or [])

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the throughput and wall clocks."""
        self._window_start = self._fit_started = time.perf_counter()
        self._fit_ended = None
        self._window_excluded = 0.0
        self._paused_at = None
        self._pending_losses.clear()
        self._pending_steps.clear()
        self._in_flight = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Note the step and the lr its update will use; resume the clock after validation."""
        self.resume_clock()
        self._step = trainer.global_step
        # Read before the update: Lightning steps the schedule before on_train_batch_end.
        self._pending_lr = trainer.optimizers[0].param_groups[0]["lr"]

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Keep the batch's loss; every log_interval steps send them to the host and log
        them (on a GPU, those sent at the logged step before)."""
        # Lightning's detached copy of training_step's loss, still on the device: fetching
        # it every step would stall a GPU once per step. With z-loss on, the objective adds
        # a term; "ce" is the cross-entropy alone, what train/loss means in every run.
        self._pending_losses.append(outputs.get("ce", outputs["loss"]))
        self._pending_steps.append(self._step)
        if not self.due(self._step, trainer.max_steps):
            return
        values = torch.stack(self._pending_losses).float()  # (steps,) on the device
        steps = list(self._pending_steps)
        self._pending_losses.clear()
        self._pending_steps.clear()
        tick = self.tick(trainer, len(steps), batch[0].numel())
        defer = self.defer if self.defer is not None else values.is_cuda
        ready = None
        if defer and values.is_cuda:
            if self._copies is None or self._copies.size < len(steps):
                self._copies = HostCopies(max(self.log_interval, len(steps)))
            values, ready = self._copies.send(values)
        if self._in_flight is not None:
            self.drain()  # the window before: arrived long ago
        if defer and self._step + 1 < trainer.max_steps:
            self._in_flight = _Window(steps, values, ready, tick, self._pending_lr)
            self._trainer = trainer
        else:
            self._log_losses(trainer, steps, read_host(values, ready), self._pending_lr, tick)

    def drain(self) -> None:
        """Log the losses still on their way to the host (if any)."""
        window, self._in_flight = self._in_flight, None
        if window is not None:
            losses = read_host(window.values, window.ready)
            self._log_losses(self._trainer, window.steps, losses, window.lr, window.tick)

    def due(self, step: int, max_steps: int) -> bool:
        """Whether step `step`'s loss is logged (with those before it not logged yet)."""
        return step % self.log_interval == 0 or step + 1 >= max_steps

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Stop the throughput clock while validating; log the losses in flight."""
        if self._paused_at is None:
            self._paused_at = time.perf_counter()
        self.drain()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Stop the wall clock."""
        self._fit_ended = time.perf_counter()
        self.drain()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """A stop or a failure: log the losses in flight (a divergence among them is
        reported as the run's outcome)."""
        self.drain()

    def resume_clock(self) -> None:
        """Restart the throughput clock paused by a validation (if one is paused)."""
        # Validation ends in callbacks, ModelCheckpoint's best.ckpt last of all; the next
        # training batch is the first moment after all of them.
        if self._paused_at is not None:
            self._window_excluded += time.perf_counter() - self._paused_at
            self._paused_at = None

    def record(
        self, trainer: L.Trainer, steps: list[int], losses: list[float], lr: float, tick: _Tick
    ) -> None:
        """Log mean loss, lr and throughput of a window of steps: `steps` and their
        `losses` (host floats), the last one's `lr`, and the `tick` that closed the window.
        A batch of replicas calls it for each replica with its column of the batch's one
        transfer, as this monitor logs its own."""
        self._log_losses(trainer, list(steps), list(losses), lr, tick)

    def tick(self, trainer: L.Trainer, trained: int, tokens_per_batch: int) -> _Tick:
        """Close the throughput window of the `trained` steps since the last one, now."""
        now = time.perf_counter()
        elapsed = max(1e-9, now - self._window_start - self._window_excluded)
        self._window_start, self._window_excluded = now, 0.0
        self.train_time_s += elapsed
        world_tokens = tokens_per_batch * trainer.world_size
        self.tokens_seen += world_tokens * trained
        return _Tick(now, elapsed / trained, world_tokens)

    def _log_losses(
        self, trainer: L.Trainer, steps: list[int], losses: list[float], lr: float, tick: _Tick
    ) -> None:
        """The rows of one window; a non-finite loss among them raises TrainingDiverged."""
        if self._carried:
            steps = [step for step, _ in self._carried] + steps
            losses = [loss for _, loss in self._carried] + losses
            self._carried = []
        now, step_time, world_tokens = tick
        bad = next((i for i, value in enumerate(losses) if not math.isfinite(value)), None)
        # Under DDP every rank must stop at the same step, whichever rank saw it.
        if trainer.strategy.reduce_boolean_decision(bad is not None, all=False):
            bad = bad if bad is not None else len(losses) - 1
            self._recent_losses.extend(losses[:bad])
            _log(trainer, {spec.TRAIN_LOSS: losses[bad]}, steps[bad])
            self.last_train = {"step": steps[bad], "loss": losses[bad]}
            raise TrainingDiverged(steps[bad], losses[bad])
        self._recent_losses.extend(losses)
        metrics = {
            spec.TRAIN_LOSS: sum(losses) / len(losses),
            spec.TRAIN_LR: lr,
            spec.TRAIN_STEP_TIME: step_time,
            spec.TRAIN_TOKENS_PER_SEC: world_tokens / step_time,
            # the wall clock at the end of this step (validation included): Live and
            # Compare place steps in time with it
            spec.TRAIN_ELAPSED_S: now - (self._fit_started or now),
        }
        _log(trainer, metrics, steps[-1])
        self.last_train = {"step": steps[-1], "loss": metrics[spec.TRAIN_LOSS], **metrics}

    # -- what the final metrics report ----------------------------------------------------

    def wall_time_s(self) -> float:
        """Seconds from the first training step to the end of training (or now)."""
        if self._fit_started is None:
            return 0.0
        return (self._fit_ended or time.perf_counter()) - self._fit_started

    def tokens_per_sec(self) -> float | None:
        """Tokens per second while training, validation excluded (None before any)."""
        return self.tokens_seen / self.train_time_s if self.train_time_s > 0 else None

    def recent_train_loss(self) -> float | None:
        """Mean of the last few per-step training losses (None before any)."""
        if not self._recent_losses:
            return self.last_train.get("loss")
        return sum(self._recent_losses) / len(self._recent_losses)


class _Tick(NamedTuple):
    """The throughput clock when a window of steps closed."""

    now: float  # perf_counter
    step_time: float  # seconds per step of the window, validation excluded
    world_tokens: int  # tokens per step over all ranks


class _Window(NamedTuple):
    """Losses of the steps since the last log, on their way to the host."""

    steps: list[int]
    values: torch.Tensor  # (steps,) float32: on the host once `ready`, or on a CPU device
    ready: torch.cuda.Event | None  # recorded after the copy (None: none to wait for)
    tick: _Tick
    lr: float


class HostCopies:
    """Two pinned host buffers of `size` values and their CUDA events, used in turn: one
    window's losses arrive in one while the other's are read. Made once, so a logged step
    allocates nothing and creates no event."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.buffers = torch.empty((2, size), pin_memory=True)  # float32
        self.events = [torch.cuda.Event(), torch.cuda.Event()]
        self.turn = 0

    def send(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
        """Start copying device `values` (at most `size`) to the host; where they will
        be and the event recorded after the copy."""
        host, ready = self.buffers[self.turn, : values.numel()], self.events[self.turn]
        host.copy_(values, non_blocking=True)
        ready.record()
        self.turn ^= 1
        return host, ready


def read_host(values: torch.Tensor, ready: torch.cuda.Event | None) -> list[float]:
    """Losses as floats, once their copy is `ready` (the one wait on the device)."""
    if ready is not None:
        ready.synchronize()
    return values.tolist()


def _log(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    # Straight to the loggers with an explicit step: Lightning's own step counter for
    # logged metrics is off by one against ours and would need a sync per self.log.
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def training_monitor(trainer: L.Trainer) -> TrainingMonitor | None:
    """The trainer's TrainingMonitor (`make_trainer` adds one), or None."""
    return next((cb for cb in trainer.callbacks if isinstance(cb, TrainingMonitor)), None)


# ---------------------------------------------------------------------------- the console


def _format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _format_rate(tokens_per_sec: float) -> str:
    if tokens_per_sec >= 1e6:
        return f"{tokens_per_sec / 1e6:.2f}M tok/s"
    if tokens_per_sec >= 1e3:
        return f"{tokens_per_sec / 1e3:.1f}k tok/s"
    return f"{tokens_per_sec:.0f} tok/s"


class ConsoleProgress(Callback):
    """One status line on stderr: step, loss, val loss, tokens/s, ETA.

    On a terminal the line redraws in place at most every `refresh_s`; otherwise (a log
    file, a pipe) a full line is printed every `every_n_steps` steps and at the end.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        refresh_s: float = 0.25,
        every_n_steps: int | None = None,
    ) -> None:
        self.stream = stream or sys.stderr
        self.refresh_s = refresh_s
        self.every_n_steps = every_n_steps
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_draw = 0.0
        self._start = 0.0
        self._start_step = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Remember where and when this session of training began (for the ETA)."""
        self._start = time.perf_counter()
        self._start_step = trainer.global_step
        if self.every_n_steps is None:
            self.every_n_steps = max(10, trainer.max_steps // 20)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Redraw (terminal) or print (pipe) when due; cheap otherwise."""
        if not trainer.is_global_zero:
            return
        step = trainer.global_step
        if self.interactive:
            now = time.perf_counter()
            if now - self._last_draw < self.refresh_s and step < trainer.max_steps:
                return
            self._last_draw = now
            self.stream.write("\r" + self.status_line(trainer, pl_module) + "\033[K")
        elif step % self.every_n_steps == 0 or step >= trainer.max_steps:
            self.stream.write(self.status_line(trainer, pl_module) + "\n")
        self.stream.flush()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """End the redrawn line so later output starts on a fresh one."""
        if self.interactive and trainer.is_global_zero:
            self.stream.write("\r" + self.status_line(trainer, pl_module) + "\033[K\n")
            self.stream.flush()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Leave the cursor on a fresh line when training is interrupted."""
        self.on_train_end(trainer, pl_module)

    def status_line(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str:
        """`step 120/2000 | loss 2.3456 | val 2.4012 | 41.2k tok/s | ETA 1:23`."""
        step, max_steps = trainer.global_step, trainer.max_steps
        parts = [f"step {step}/{max_steps}"]
        monitor = training_monitor(trainer)
        last_train = monitor.last_train if monitor is not None else {}
        last_val = getattr(pl_module, "last_val", {})
        if "loss" in last_train:
            parts.append(f"loss {last_train['loss']:.4f}")
        if spec.VAL_LOSS in last_val:
            parts.append(f"val {last_val[spec.VAL_LOSS]:.4f}")
        if spec.TRAIN_TOKENS_PER_SEC in last_train:
            parts.append(_format_rate(last_train[spec.TRAIN_TOKENS_PER_SEC]))
        done = step - self._start_step
        if done > 0:
            elapsed = time.perf_counter() - self._start
            parts.append(f"ETA {_format_duration(elapsed / done * (max_steps - step))}")
        return " | ".join(parts)


# ---------------------------------------------------------------------------- last.ckpt


class LastCheckpoint(Callback):
    """`last.ckpt`: the newest state, after every evaluation, at the end and on a stop.

    (Lightning 2.6's `save_last` only rewrites last.ckpt when a top-k checkpoint was saved
    in the same step, i.e. when validation improved, so it can lag far behind.)
    """

    def __init__(self, dirpath: str | Path) -> None:
        self.path = Path(dirpath) / "last.ckpt"
        self.saved_step: int | None = None

    def save(self, trainer: L.Trainer) -> None:
        """Write last.ckpt unless this step is already saved."""
        if self.saved_step != trainer.global_step:
            trainer.save_checkpoint(self.path, weights_only=False)  # full state, for resume
            self.saved_step = trainer.global_step

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After each evaluation during fit."""
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self.save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """At the final step, so a resume with a larger max_steps starts there."""
        self.save(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """On SIGTERM / Ctrl-C: the state after the last finished step."""
        if isinstance(exception, SIGTERMException):
            self.save(trainer)
