"""The Trainer of a run: device, precision, DDP, cadence, checkpoints, loggers, quiet logs.

`make_trainer` turns a `RunConfig` into a Lightning Trainer; the engineering lives here
and in Lightning, never in the LightningModule (`blockviz.training.lit`).
"""

from __future__ import annotations

import errno
import logging
import shutil
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from blockviz.core import spec
from blockviz.core.config import RunConfig
from blockviz.core.config_train import TrainConfig
from blockviz.core.extras import check_logger_available
from blockviz.core.files import atomic_file
from blockviz.training.callbacks import TrainingMonitor
from blockviz.training.keep import KeptCheckpoints

# Where `--logger` writes, inside the run's folder.
TENSORBOARD_DIR = "tensorboard"
# A checkpoint write that fails with less than this free on its disk failed for want of
# room: torch's writer reports a short write as a RuntimeError without the ENOSPC behind it.
FULL_BELOW_BYTES = 1 << 20
CSV_DIR = "csv"


def resolve_precision(precision: str, accelerator: str) -> str:
    """`auto` -> bf16-mixed on a CUDA GPU that supports it, else 32-true; others pass."""
    if precision != "auto":
        return precision
    wants_cuda = accelerator in ("auto", "gpu")
    if wants_cuda and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


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


class AtomicCheckpointIO(TorchCheckpointIO):
    """Every checkpoint (last, best, kept) written beside its target and renamed over it
    (`core.files.atomic_file`): a full disk or a kill during the write leaves the file
    before it whole, and nothing in /tmp. (Lightning's own writes through an fsspec
    transaction whose temporary file sits in /tmp and is then copied over the target: a
    full disk left `last.ckpt` corrupt, a kill -9 during the copy an empty one.)"""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(f".{target.name[:40]}.*.part"):  # a killed write's
            stale.unlink(missing_ok=True)
        with atomic_file(target) as handle:
            try:
                torch.save(checkpoint, handle)
            except RuntimeError as exc:  # torch's writer hides ENOSPC ("unexpected pos")
                free = shutil.disk_usage(target.parent).free
                if free >= FULL_BELOW_BYTES:
                    raise
                raise OSError(
                    errno.ENOSPC,
                    f"the disk of {target.parent} is full ({free:,} bytes free) while "
                    f"writing {target.name}; the checkpoint before it is whole: free some "
                    "space, then resume the run (train --resume RUN)",
                ) from exc


def run_loggers(train: TrainConfig, run_dir: str | Path, resume_step: int | None) -> list[Logger]:
    """The Lightning loggers `train.logger` asks for, writing into the run's folder.

    tensorboard: event files in <run_dir>/tensorboard, one per training session; a resumed
    session hides what an earlier one logged after the checkpoint (`purge_step`), as the
    store drops those rows. csv: <run_dir>/csv/version_<n>/metrics.csv, one folder per
    session (Lightning's CSV writer replaces an existing metrics.csv).
    """
    check_logger_available(train)
    if train.logger == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        purge = {} if resume_step is None else {"purge_step": resume_step + 1}
        return [
            TensorBoardLogger(
                run_dir, name=TENSORBOARD_DIR, version="", default_hp_metric=False, **purge
            )
        ]
    if train.logger == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return [CSVLogger(run_dir, name=CSV_DIR)]
    return []


def make_trainer(
    run_cfg: RunConfig,
    callbacks: Sequence[Callback] = (),
    logger: Logger | Iterable[Logger] | None = None,
    run_dir: str | Path = ".",
    *,
    monitor: TrainingMonitor | None = None,
) -> L.Trainer:
    """A Trainer for the run: device, precision, DDP, cadence, checkpoints (the module
    clips its gradients itself: `lit.OneStep`).

    Every Trainer gets a `TrainingMonitor` (train metrics, clocks, divergence; `monitor`,
    or one of one run), after `callbacks` so that it sees each event after them: the
    wall clock includes the probe's last sample, and a diverged step still has its probe
    records written.
    """
    train = run_cfg.train
    monitor = monitor or TrainingMonitor(train.log_interval)
    dirpath = Path(run_dir) / "checkpoints"
    checkpoints: list[Callback] = [LastCheckpoint(dirpath)]
    kept: list[Callback] = []
    # A batch of replicas (a monitor of K runs) keeps only last.ckpt: "best" has no meaning
    # for K runs at once, and a kept step's checkpoint would hold K models.
    if len(monitor.runs) == 1:
        # best.ckpt on the lowest val/loss
        best = ModelCheckpoint(
            dirpath=dirpath,
            filename="best",
            monitor=spec.VAL_LOSS,
            mode="min",
            save_top_k=1,
            save_last=False,
            auto_insert_metric_name=False,
            enable_version_counter=False,
        )
        checkpoints = [best, *checkpoints]
        if train.ckpt_interval:
            # Last: the step's records are handed on and its loss known finite first.
            kept = [
                KeptCheckpoints(run_dir, train.ckpt_interval, train.ckpt_keep, train.eval_interval)
            ]
    return L.Trainer(
        accelerator=train.accelerator,
        devices=train.devices,
        num_nodes=train.num_nodes,
        strategy=train.strategy,
        precision=resolve_precision(train.precision, train.accelerator),
        max_steps=train.max_steps,
        max_epochs=-1,  # the training loader never ends; max_steps does
        val_check_interval=train.eval_interval,
        check_val_every_n_epoch=None,  # count val_check_interval in steps across "epochs"
        limit_val_batches=train.eval_iters,
        num_sanity_val_steps=0,
        callbacks=[*checkpoints, *callbacks, monitor, *kept],
        logger=list(logger) if isinstance(logger, Iterable) else (logger or False),
        log_every_n_steps=train.log_interval,
        enable_model_summary=False,
        enable_progress_bar=False,  # ConsoleProgress, when wanted, is one of `callbacks`
        use_distributed_sampler=False,  # the data module gives each rank its own windows
        default_root_dir=str(run_dir),
        plugins=[AtomicCheckpointIO()],
    )
