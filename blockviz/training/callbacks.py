"""Callbacks that watch training: train metrics and clocks, and the console line.

`TrainingMonitor` logs the train/* scalars (loss, lr, step time, tokens/s), keeps the
clocks the final metrics report and stops a run whose loss is no longer finite;
`make_trainer` adds one to every Trainer. `ConsoleProgress` draws the status line from
it. (The probes are `blockviz.training.probes`, the checkpoints `blockviz.training.trainer`'s.)

Metric steps: a number recorded "at step s" describes the model after s optimizer
updates. The training loss at step s is the loss of batch s (computed with those
weights, before update s is applied).
"""

from __future__ import annotations

import collections
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TextIO

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

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
    """train/loss, train/lr, train/step_time, train/tokens_per_sec and train/elapsed_s of
    each run the module trains, and the clocks.

    A module trains one run, or K replicas (`LitReplicas`, whose losses come as one (K,)
    tensor a step); each run's rows go to its own loggers (`OneStep.log_run`), and a run
    the module has masked out (`OneStep.live`) is logged no more. train/loss is the
    cross-entropy (with z-loss on, without its term). The per-step losses stay on the
    device; every `log_interval` steps (and at the last step) they reach the host in one
    transfer, every run's together, and each run's mean loss and lr and the throughput of
    those steps are logged at the newest step. On a GPU that transfer is asynchronous
    (into pinned memory) and read at the next logged step, by when it has long arrived, so
    no training step waits for the device (`defer`; a CPU reads at once, as there is
    nothing to wait for): the rows are the same, written one logged step later, and any
    still in flight are read before a checkpoint, a validation and the end. Validation
    (and the checkpointing after it) is left out of the throughput clock; the wall clock
    runs from the first training step to the end of training.

    A non-finite loss ends its run: one of several is handed to `on_diverged(run, step)`
    (which masks it out) and the others go on; when none is left, `TrainingDiverged` is
    raised (not `should_stop`: Lightning would validate and checkpoint the non-finite
    weights on the way out).
    """

    # Read the losses one logged step late; None: on a CUDA device.
    defer: bool | None = None

    def __init__(
        self,
        log_interval: int = 1,
        runs: int = 1,
        on_diverged: Callable[[int, int], None] | None = None,
    ) -> None:
        self.log_interval = log_interval
        self.on_diverged = on_diverged
        self.runs = [_Run(collections.deque(maxlen=RECENT_LOSSES)) for _ in range(runs)]
        self.train_time_s = 0.0  # seconds spent training, validation excluded
        self.tokens_seen = 0  # by each run
        self._fit: tuple[L.Trainer, Any] | None = None  # the fit whose runs are logged
        self._in_flight: _Window | None = None
        self._copies: HostCopies | None = None  # made at the first deferred window (a GPU)
        self._pending_losses: list[torch.Tensor] = []  # each step's, on the device
        self._pending_steps: list[int] = []
        self._pending_lrs: list[float] = []  # each run's, at the step that closes a window
        self._step = 0
        self._fit_started: float | None = None
        self._fit_ended: float | None = None
        self._window_start = 0.0
        self._window_excluded = 0.0  # validation seconds inside the current window
        self._paused_at: float | None = None  # when the current validation began

    def state_dict(self) -> dict[str, Any]:
        """In a checkpoint: each run's per-step losses not logged yet and its recent ones
        (one device->host copy, at checkpoints only); one run's alone, several under
        "runs". Losses in flight are logged first, so the store holds them before the
        checkpoint exists."""
        self.drain()
        steps = self._pending_steps
        pending: list[list[float]] = [[] for _ in self.runs]  # each run's losses of `steps`
        if steps:
            pending = torch.stack(self._pending_losses).float().view(len(steps), -1).T.tolist()
        states = [
            {
                "pending": [
                    [int(step), float(loss)]
                    for step, loss in [*run.carried, *zip(steps, losses, strict=True)]
                ],
                "recent": [float(loss) for loss in run.recent],
            }
            for run, losses in zip(self.runs, pending, strict=True)
        ]
        return states[0] if len(states) == 1 else {"runs": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The losses each restored run carries on with."""
        for run, state in zip(self.runs, state_dict.get("runs") or [state_dict], strict=False):
            run.carried = [(int(step), float(loss)) for step, loss in state.get("pending") or []]
            run.recent.clear()
            run.recent.extend(float(loss) for loss in state.get("recent") or [])

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the throughput and wall clocks."""
        self._fit = (trainer, pl_module)
        self._window_start = self._fit_started = time.perf_counter()
        self._fit_ended = None
        self._window_excluded = 0.0
        self._paused_at = None
        self._pending_losses.clear()
        self._pending_steps.clear()
        self._in_flight = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """Note the step (and at a logged one, the lrs its update will use); resume the
        clock after validation."""
        # Validation ends in callbacks, ModelCheckpoint's best.ckpt last of all; the next
        # training batch is the first moment after all of them.
        if self._paused_at is not None:
            self._window_excluded += time.perf_counter() - self._paused_at
            self._paused_at = None
        self._step = trainer.global_step
        if self.due(self._step, trainer.max_steps):
            # Read before the update: the schedule steps before on_train_batch_end.
            self._pending_lrs = pl_module.run_lrs()

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Keep the batch's losses; every log_interval steps send them to the host and log
        them (on a GPU, those sent at the logged step before)."""
        # Lightning's detached copy of training_step's loss, still on the device: fetching
        # it every step would stall a GPU once per step. With z-loss on, the objective adds
        # a term; "ce" is the cross-entropy alone, what train/loss means in every run.
        self._pending_losses.append(outputs.get("ce", outputs["loss"]))
        self._pending_steps.append(self._step)
        if not self.due(self._step, trainer.max_steps):
            return
        steps = list(self._pending_steps)
        values = torch.stack(self._pending_losses).float().view(len(steps), -1)  # (steps, runs)
        self._pending_losses.clear()
        self._pending_steps.clear()
        tick = self._tick(trainer, len(steps), batch[0].numel() // len(self.runs))
        defer = self.defer if self.defer is not None else values.is_cuda
        ready = None
        if defer and values.is_cuda:
            if self._copies is None or self._copies.size < values.numel():
                self._copies = HostCopies(max(self.log_interval * len(self.runs), values.numel()))
            host, ready = self._copies.send(values.flatten())
            values = host.view(values.shape)
        window = _Window(steps, values, ready, *tick, self._pending_lrs)
        self.drain()  # the window before: arrived long ago
        if defer and self._step + 1 < trainer.max_steps:
            self._in_flight = window
        else:
            self._log(window)

    def drain(self) -> None:
        """Log the losses still on their way to the host (if any)."""
        window, self._in_flight = self._in_flight, None
        if window is not None:
            self._log(window)

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
        """A stop or a failure: log the losses in flight (the last run's divergence among
        them is reported as the fit's outcome)."""
        self.drain()

    def _tick(
        self, trainer: L.Trainer, trained: int, tokens_per_batch: int
    ) -> tuple[float, float, int]:
        """Close the throughput window of the `trained` steps since the last one, now: the
        `_Window`'s now, step_time and world_tokens."""
        now = time.perf_counter()
        elapsed = max(1e-9, now - self._window_start - self._window_excluded)
        self._window_start, self._window_excluded = now, 0.0
        self.train_time_s += elapsed
        world_tokens = tokens_per_batch * trainer.world_size
        self.tokens_seen += world_tokens * trained
        return now, elapsed / trained, world_tokens

    def _log(self, window: _Window) -> None:
        """Every live run's rows of one window (one wait for the transfer); a run whose loss
        is not finite ends there (`on_diverged`, or TrainingDiverged for the last one)."""
        trainer, pl_module = self._fit
        rows = read_host(window.values, window.ready)  # (steps, runs) as lists
        live = [index for index, alive in enumerate(pl_module.live) if alive]
        diverged = []
        for index in live:
            losses = [row[index] for row in rows]
            bad = self._log_run(trainer, pl_module, index, window, losses)
            if bad is not None:
                diverged.append(bad)
        if self.on_diverged is not None:
            for index, step, _ in diverged:
                self.on_diverged(index, step)
        if diverged and len(diverged) == len(live):
            _, step, loss = diverged[-1]
            raise TrainingDiverged(step, loss)

    def _log_run(
        self, trainer: L.Trainer, pl_module: Any, index: int, window: _Window, losses: list[float]
    ) -> tuple[int, int, float] | None:
        """Run `index`'s rows of one window, its `losses` on the host; (index, step, loss)
        where its loss is not finite, else None."""
        run = self.runs[index]
        steps = window.steps
        if run.carried:  # losses of steps before a restore not logged yet
            steps = [step for step, _ in run.carried] + steps
            losses = [loss for _, loss in run.carried] + losses
            run.carried = []
        bad = next((i for i, value in enumerate(losses) if not math.isfinite(value)), None)
        # Under DDP every rank must stop at the same step, whichever rank saw it.
        if trainer.strategy.reduce_boolean_decision(bad is not None, all=False):
            bad = bad if bad is not None else len(losses) - 1
            run.recent.extend(losses[:bad])
            pl_module.log_run(index, {spec.TRAIN_LOSS: losses[bad]}, steps[bad])
            run.last_train = {"step": steps[bad], "loss": losses[bad]}
            return index, steps[bad], losses[bad]
        run.recent.extend(losses)
        metrics = {
            spec.TRAIN_LOSS: sum(losses) / len(losses),
            spec.TRAIN_LR: window.lrs[index],
            spec.TRAIN_STEP_TIME: window.step_time,
            spec.TRAIN_TOKENS_PER_SEC: window.world_tokens / window.step_time,
            # the wall clock at the end of this step (validation included): Live and
            # Compare place steps in time with it
            spec.TRAIN_ELAPSED_S: window.now - (self._fit_started or window.now),
        }
        pl_module.log_run(index, metrics, steps[-1])
        run.last_train = {"step": steps[-1], "loss": metrics[spec.TRAIN_LOSS], **metrics}
        return None

    # -- what the final metrics report ----------------------------------------------------

    def wall_time_s(self) -> float:
        """Seconds from the first training step to the end of training (or now)."""
        if self._fit_started is None:
            return 0.0
        return (self._fit_ended or time.perf_counter()) - self._fit_started

    def tokens_per_sec(self) -> float | None:
        """Tokens per second (each run's) while training, validation excluded (None before
        any)."""
        return self.tokens_seen / self.train_time_s if self.train_time_s > 0 else None

    def recent_train_loss(self, index: int = 0) -> float | None:
        """Mean of run `index`'s last few per-step training losses (None before any)."""
        run = self.runs[index]
        if not run.recent:
            return run.last_train.get("loss")
        return sum(run.recent) / len(run.recent)


@dataclass
class _Run:
    """What the monitor keeps of each run."""

    recent: collections.deque[float]  # the last per-step losses (the final train_loss)
    # Losses of steps before a restore that were not logged yet (host floats): the first
    # log after a resume or a fork averages what the uninterrupted run's would have.
    carried: list[tuple[int, float]] = field(default_factory=list)
    last_train: dict[str, float] = field(default_factory=dict)  # the latest record


class _Window(NamedTuple):
    """Losses of the steps since the last log, on their way to the host, and the
    throughput clock when the window closed."""

    steps: list[int]
    values: torch.Tensor  # (steps, runs) float32: on the host once `ready`, or on a CPU
    ready: torch.cuda.Event | None  # recorded after the copy (None: none to wait for)
    now: float  # perf_counter
    step_time: float  # seconds per step of the window, validation excluded
    world_tokens: int  # tokens per step over all ranks (of each run)
    lrs: list[float]  # each run's, at the last step


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


def read_host(values: torch.Tensor, ready: torch.cuda.Event | None) -> list[Any]:
    """Losses as floats, once their copy is `ready` (the one wait on the device)."""
    if ready is not None:
        ready.synchronize()
    return values.tolist()


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

    refresh_s = 0.25

    def __init__(self, stream: TextIO | None = None, every_n_steps: int | None = None) -> None:
        self.stream = stream or sys.stderr
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
        runs = monitor.runs if monitor is not None else []
        last_train = runs[0].last_train if runs else {}
        last_val = pl_module.last_vals[0] if len(pl_module.live) == 1 else {}
        if len(runs) > 1:  # replicas: each one's loss, a dash for one that trains no more
            live = pl_module.live
            losses = [
                f"{run.last_train['loss']:.4f}" if live[i] and "loss" in run.last_train else "—"
                for i, run in enumerate(runs)
            ]
            parts.append(f"losses {' '.join(losses)}")
        elif "loss" in last_train:
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
