"""LitCharModel: what one training step of a CharTransformer is, plus the Trainer factory.

The LightningModule owns the science: next-character cross-entropy, validation metrics,
AdamW with decay / no-decay groups and the warm-up + decay schedule, text generation.
The Trainer owns the engineering (device, precision, DDP, checkpoints) and is built by
`make_trainer` from the run config. Monitoring lives in callbacks (`blockviz.training.probes`).

Metric steps: a number recorded "at step s" describes the model after s optimizer
updates. The training loss at step s is the loss of batch s (computed with those
weights, before update s is applied); validation at step s runs after s updates.
"""

from __future__ import annotations

import collections
import logging
import math
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn

from blockviz.core.config import RunConfig, TrainConfig
from blockviz.training.data import CharVocab, answer_accuracy
from blockviz.training.model import CharTransformer, ModelInputError

LN2 = math.log(2.0)
# How many recent per-step losses the final `train_loss` averages (one batch is noisy).
_RECENT_LOSSES = 50


class TrainingDiverged(Exception):
    """The training loss became NaN or infinite at `step`: a result, reported as such."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"training loss {loss} at step {step}")
        self.step = step
        self.loss = loss


def lr_at(step: int, train: TrainConfig, horizon: int | None = None) -> float:
    """The learning rate used for optimizer update `step` (0-based).

    Linear warm-up from lr/warmup_steps to lr over the first warmup_steps updates, then
    constant, or a cosine / linear decay that reaches min_lr at `horizon` (default
    max_steps) and stays there. A run resumed with a larger max_steps keeps the horizon
    it started with, so its schedule never jumps mid-run.
    """
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    if train.lr_schedule == "constant":
        return train.lr
    end = train.max_steps if horizon is None else horizon
    decay_steps = max(1, end - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / decay_steps)
    if train.lr_schedule == "cosine":
        return train.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (train.lr - train.min_lr)
    return train.lr - progress * (train.lr - train.min_lr)  # linear


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: Linear weight matrices decay; biases, norms and embeddings do not.

    A tied embedding / LM-head matrix is the head Linear's weight too, so it decays.
    """
    decay_ids = {
        id(module.weight)
        for module in model.modules()
        if isinstance(module, nn.Linear) and module.weight.dim() >= 2
    }
    decay, no_decay = [], []
    for param in model.parameters():  # each shared tensor is yielded once
        if param.requires_grad:
            (decay if id(param) in decay_ids else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def resolve_precision(precision: str, accelerator: str) -> str:
    """`auto` -> bf16-mixed on a CUDA GPU that supports it, else 32-true; others pass."""
    if precision != "auto":
        return precision
    wants_cuda = accelerator in ("auto", "gpu")
    if wants_cuda and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


class LitCharModel(L.LightningModule):
    """A CharTransformer trained on next-character prediction.

    `run_config` is `RunConfig.to_dict()` and `vocab_json` is `CharVocab.to_json()`: both
    plain, so the hyperparameters in a checkpoint load with `torch.load(weights_only=True)`.
    """

    def __init__(
        self,
        run_config: dict[str, Any],
        vocab_json: str | None = None,
        schedule_steps: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.config = RunConfig.from_dict(run_config).validate()
        # The step where the lr decay ends: max_steps, or what the run first had when a
        # resume extends it (the checkpoint's hyperparameters carry it on).
        self.schedule_steps = schedule_steps or self.config.train.max_steps
        self.model = CharTransformer(self.config.model)
        self.vocab = CharVocab.from_json(vocab_json) if vocab_json else None
        self.is_ops = self.config.data.dataset == "ops"
        # The module the steps call: the model, or torch.compile's wrapper around the same
        # parameters. Set past nn.Module.__setattr__ so it is not registered as a second
        # submodule: state_dict keys (and checkpoints) are the same with compile on or off,
        # and probes and generation keep using the eager model.
        step_model = torch.compile(self.model) if self.config.train.compile else self.model
        object.__setattr__(self, "_step_model", step_model)
        # Live training state, read by the progress bar, probes and the run lifecycle.
        self.diverged_step: int | None = None
        self.last_train: dict[str, float] = {}
        self.last_val: dict[str, float] = {}
        self.train_time_s = 0.0  # seconds spent training, validation excluded
        self.tokens_seen = 0
        self._fit_started: float | None = None
        self._fit_ended: float | None = None
        self._pending_losses: list[torch.Tensor] = []  # device scalars not yet fetched
        self._pending_steps: list[int] = []
        self._pending_lr = 0.0
        self._recent_losses: collections.deque[float] = collections.deque(maxlen=_RECENT_LOSSES)
        self._window_start = 0.0
        self._window_excluded = 0.0  # validation seconds inside the current window
        self._val_started = 0.0
        self._val_loss_sum: torch.Tensor | None = None
        self._val_batches = 0
        self._answers = [0, 0]  # correct, total (ops only)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V) and the loss when targets are given."""
        return self._step_model(idx, targets)

    # -- training -------------------------------------------------------------------------

    def on_train_start(self) -> None:
        """Start the throughput and wall clocks."""
        self._window_start = self._fit_started = time.perf_counter()
        self._fit_ended = None
        self._window_excluded = 0.0
        self._pending_losses.clear()
        self._pending_steps.clear()

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        """Cross-entropy of next-character predictions on one batch."""
        x, y = batch  # (B, T), (B, T)
        _, loss = self._step_model(x, y)
        # Kept on the device: fetching it every step would stall a GPU once per step.
        self._pending_losses.append(loss.detach())
        self._pending_steps.append(self.global_step)
        # The lr this batch's update will use (Lightning steps the schedule before
        # on_train_batch_end, so read it here).
        self._pending_lr = self.trainer.optimizers[0].param_groups[0]["lr"]
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Every log_interval steps: fetch the losses in one transfer and log them."""
        step = self._pending_steps[-1] if self._pending_steps else self.global_step - 1
        last_step = step + 1 >= self.trainer.max_steps
        if step % self.config.train.log_interval and not last_step:
            return
        self._flush_train_metrics(batch[0].numel())

    def _flush_train_metrics(self, tokens_per_batch: int) -> None:
        """Log mean loss, lr and throughput of the steps since the last flush."""
        if not self._pending_losses:
            return
        losses = torch.stack(self._pending_losses).float().tolist()  # one device->host copy
        steps = list(self._pending_steps)
        self._pending_losses.clear()
        self._pending_steps.clear()
        now = time.perf_counter()
        elapsed = max(1e-9, now - self._window_start - self._window_excluded)
        self._window_start, self._window_excluded = now, 0.0
        self.train_time_s += elapsed
        world_tokens = tokens_per_batch * self.trainer.world_size
        self.tokens_seen += world_tokens * len(steps)
        step_time = elapsed / len(steps)
        bad = next((i for i, value in enumerate(losses) if not math.isfinite(value)), None)
        # Under DDP every rank must stop at the same step, whichever rank saw it.
        if self.trainer.strategy.reduce_boolean_decision(bad is not None, all=False):
            bad = bad if bad is not None else len(losses) - 1
            self._recent_losses.extend(value for value in losses[:bad])
            self.diverged_step = steps[bad]
            self._log_to_loggers({"train/loss": losses[bad]}, steps[bad])
            self.last_train = {"step": steps[bad], "loss": losses[bad]}
            # Raised rather than should_stop: Lightning would validate and checkpoint the
            # non-finite weights on the way out.
            raise TrainingDiverged(steps[bad], losses[bad])
        self._recent_losses.extend(losses)
        metrics = {
            "train/loss": sum(losses) / len(losses),
            "train/lr": self._pending_lr,
            "train/step_time": step_time,
            "train/tokens_per_sec": world_tokens / step_time,
        }
        self._log_to_loggers(metrics, steps[-1])
        self.last_train = {"step": steps[-1], "loss": metrics["train/loss"], **metrics}

    def on_train_end(self) -> None:
        """Stop the wall clock."""
        self._fit_ended = time.perf_counter()

    def wall_time_s(self) -> float:
        """Seconds from the first training step to the end of training (or now)."""
        if self._fit_started is None:
            return 0.0
        return (self._fit_ended or time.perf_counter()) - self._fit_started

    def recent_train_loss(self) -> float | None:
        """Mean of the last few per-step training losses (None before any)."""
        if not self._recent_losses:
            return self.last_train.get("loss")
        return sum(self._recent_losses) / len(self._recent_losses)

    def _log_to_loggers(self, metrics: dict[str, float], step: int) -> None:
        # Straight to the loggers with an explicit step: Lightning's own step counter for
        # logged metrics is off by one against ours and would need a sync per self.log.
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)

    # -- validation -----------------------------------------------------------------------

    def on_validation_start(self) -> None:
        """Stop the throughput clock while validating."""
        self._val_started = time.perf_counter()

    def on_validation_end(self) -> None:
        """Restart the throughput clock (checkpointing ran inside validation too)."""
        self._window_excluded += time.perf_counter() - self._val_started

    def on_validation_epoch_start(self) -> None:
        """Reset the accumulators of one evaluation."""
        self._val_loss_sum = torch.zeros((), device=self.device)
        self._val_batches = 0
        self._answers = [0, 0]

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        """Accumulate the loss (and ops answers) of one validation batch on the device."""
        x, y = batch  # (B, T), (B, T)
        logits, loss = self._step_model(x, y)
        self._val_loss_sum = self._val_loss_sum + loss.detach().float()
        self._val_batches += 1
        if self.is_ops and self.vocab is not None:
            correct, total = answer_accuracy(x, y, logits.argmax(dim=-1), self.vocab)
            self._answers[0] += correct
            self._answers[1] += total

    def on_validation_epoch_end(self) -> None:
        """val/loss, val/bpc (= loss / ln 2), val/ppl and val/answer_acc for ops."""
        if not self._val_batches or self._val_loss_sum is None:
            return
        # Every rank evaluates the same fixed batches, so no cross-rank reduction is needed.
        mean_loss = float(self._val_loss_sum) / self._val_batches
        metrics = {
            "val/loss": mean_loss,
            "val/bpc": mean_loss / LN2,
            "val/ppl": math.exp(mean_loss) if mean_loss < 700 else math.inf,
        }
        if self.is_ops:
            correct, total = self._answers
            metrics["val/answer_acc"] = correct / total if total else math.nan
        # callback_metrics only (ModelCheckpoint monitors val/loss); the store gets the
        # values once, with our step, below.
        self.log("val/loss", mean_loss, logger=False, prog_bar=False)
        self._log_to_loggers(metrics, self.global_step)
        self.last_val = {"step": self.global_step, **metrics}

    # -- optimisation ---------------------------------------------------------------------

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW (decay / no-decay groups) and a LambdaLR stepped every optimizer step."""
        train = self.config.train
        # Not fused: Lightning refuses gradient clipping with optimizers that unscale
        # gradients themselves, and the probes must see unscaled gradients anyway.
        optimizer = torch.optim.AdamW(
            param_groups(self.model, train.weight_decay),
            lr=train.lr,
            betas=(train.beta1, train.beta2),
        )

        def multiplier(step: int) -> float:
            return lr_at(step, train, self.schedule_steps) / train.lr

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }

    # -- generation -----------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        prompt: str,
        max_new_tokens: int = 200,
        temperature: float = 1.0,
        top_k: int | None = None,
        seed: int | None = None,
    ) -> str:
        """The text sampled after `prompt` (the prompt itself not included).

        Characters the vocabulary lacks are replaced; an empty prompt starts from a newline
        (or the first symbol). A `seed` makes the sample reproducible without touching the
        global random state that training uses.
        """
        if self.vocab is None:
            raise ModelInputError("this model has no vocabulary; build it with vocab_json")
        ids = self.vocab.encode(prompt, replace_unknown=True)
        if not ids:
            ids = [self.vocab.index("\n") if "\n" in self.vocab else 0]
        block_size = self.config.model.block_size
        context = torch.tensor([ids[-block_size:]], dtype=torch.long, device=self.device)  # (1, T)
        was_training = self.model.training
        self.model.eval()
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=cuda, enabled=seed is not None):
                if seed is not None:
                    torch.manual_seed(seed)
                out = self.model.generate(context, max_new_tokens, temperature, top_k)  # (1, T+N)
        finally:
            self.model.train(was_training)
        return self.vocab.decode(out[0, context.size(1) :])


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
        last_train = getattr(pl_module, "last_train", {})
        last_val = getattr(pl_module, "last_val", {})
        if "loss" in last_train:
            parts.append(f"loss {last_train['loss']:.4f}")
        if "val/loss" in last_val:
            parts.append(f"val {last_val['val/loss']:.4f}")
        if "train/tokens_per_sec" in last_train:
            parts.append(_format_rate(last_train["train/tokens_per_sec"]))
        done = step - self._start_step
        if done > 0:
            elapsed = time.perf_counter() - self._start
            parts.append(f"ETA {_format_duration(elapsed / done * (max_steps - step))}")
        return " | ".join(parts)


# ---------------------------------------------------------------------------- the Trainer

# Lightning's info lines and "possible user" warnings that say nothing to a blockviz user:
# our loaders are in-process tensor indexing (no workers needed), logging cadence is ours.
_QUIET_WARNINGS = (
    r".*does not have many workers.*",
    r".*number of training batches.*logging interval.*",
    r".*litlogger.*",
    r".*sync_dist=True.*",
    r".*GPU available but not used.*",
    r".*`isinstance\(treespec, LeafSpec\)` is deprecated.*",
    r".*Checkpoint directory .* exists and is not empty.*",
    r".*`training_step` returned `None`.*",
)
_LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")


def quiet_lightning(handler: logging.Handler | None = None) -> None:
    """Keep the console for our progress line: Lightning's chatter goes to `handler` (or nowhere).

    Call `release_lightning_log(handler)` to detach a handler given here.
    """
    for pattern in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name in _LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            # Lightning installs a console StreamHandler of its own; files stay.
            if isinstance(old, logging.StreamHandler) and not isinstance(old, logging.FileHandler):
                logger.removeHandler(old)
        logger.propagate = False
        if handler is not None:
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
        else:
            logger.setLevel(logging.WARNING)


def release_lightning_log(handler: logging.Handler) -> None:
    """Detach a handler that `quiet_lightning` attached."""
    for name in _LIGHTNING_LOGGERS:
        logging.getLogger(name).removeHandler(handler)


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


def checkpoint_callbacks(run_dir: str | Path) -> list[Callback]:
    """best.ckpt on the lowest val/loss and last.ckpt as LastCheckpoint keeps it."""
    dirpath = Path(run_dir) / "checkpoints"
    best = ModelCheckpoint(
        dirpath=dirpath,
        filename="best",
        monitor="val/loss",
        mode="min",
        save_top_k=1,
        save_last=False,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )
    return [best, LastCheckpoint(dirpath)]


def make_trainer(
    run_cfg: RunConfig,
    callbacks: Sequence[Callback] = (),
    logger: Logger | Iterable[Logger] | None = None,
    run_dir: str | Path = ".",
) -> L.Trainer:
    """A Trainer for the run: device, precision, DDP, clipping, cadence, checkpoints."""
    train = run_cfg.train
    return L.Trainer(
        accelerator=train.accelerator,
        devices=train.devices,
        num_nodes=train.num_nodes,
        strategy=train.strategy,
        precision=resolve_precision(train.precision, train.accelerator),
        max_steps=train.max_steps,
        max_epochs=-1,  # the training loader never ends; max_steps does
        gradient_clip_val=train.grad_clip or None,
        val_check_interval=train.eval_interval,
        check_val_every_n_epoch=None,  # count val_check_interval in steps across "epochs"
        limit_val_batches=train.eval_iters,
        num_sanity_val_steps=0,
        callbacks=[*checkpoint_callbacks(run_dir), *callbacks],
        logger=list(logger) if isinstance(logger, Iterable) else (logger or False),
        log_every_n_steps=train.log_interval,
        enable_model_summary=False,
        enable_progress_bar=False,  # ConsoleProgress, when wanted, is one of `callbacks`
        use_distributed_sampler=False,  # the data module gives each rank its own windows
        default_root_dir=str(run_dir),
    )
