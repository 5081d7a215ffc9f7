"""What `train` is about to do, decided before any run is touched: config, run, checkpoint.

A new run takes its config from the flags (`plan_new`); a resumed one from its folder,
with only hardware and cadence allowed to change, and continues from its last checkpoint
(`plan_resume`, `read_checkpoint`); one whose checkpoint is at max_steps is only finished.
The data is loaded and the model's memory checked here too, so a bad flag, dataset or size
is refused (exit 2) before anything is recorded.
"""

from __future__ import annotations

import argparse
import logging
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from blockviz.core import config as cfg
from blockviz.core import evaluation, params
from blockviz.core.download import DownloadProgress
from blockviz.core.flags import UsageError, config_overrides, run_config_from_args
from blockviz.core.naming import run_name
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.store import RunStore, run_alive
from blockviz.training.data import CharDataModule
from blockviz.training.logger import PENDING_ROWS_KEY

# Train fields a resumed run may change: hardware and cadence, never the maths.
RESUMABLE_FIELDS = (
    "max_steps",
    "accelerator",
    "devices",
    "num_nodes",
    "strategy",
    "precision",
    "compile",
    "log_interval",
    "eval_interval",
    "probe_interval",
    "sample_interval",
    "logger",
    "ckpt_interval",
    "ckpt_keep",
)

log = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """What `train` is about to do: which config, which run, from which checkpoint."""

    config: cfg.RunConfig
    name: str
    run_id: int | None = None  # None: create a new run
    checkpoint: Path | None = None  # resume from here
    start_step: int = 0
    schedule_steps: int | None = None  # where the lr decay ends (None: max_steps)
    pending_rows: dict[str, list[list[Any]]] | None = None  # rows the checkpoint carried
    # A run recorded before the evaluation set keeps scoring on its seed's windows.
    legacy_eval: bool = False
    # A fork or replay (training.fork): a new run from `parent_id`'s checkpoint at start_step.
    parent_id: int | None = None
    fork_kind: str | None = None
    fork_info: dict[str, Any] | None = None
    # The parent's checkpoint as loaded, until `fork.prepared` writes the fork's start.
    loaded: dict[str, Any] | None = None

    @property
    def finishing(self) -> bool:
        """A resume whose checkpoint is at max_steps (the run died after writing it): no
        step left to train, only what the end of a run writes."""
        return self.checkpoint is not None and self.start_step >= self.config.train.max_steps


def plan_new(args: argparse.Namespace, store: RunStore | None) -> RunPlan:
    """A new run from the flags, or the queued run `--run_id` the runner created for them."""
    config = run_config_from_args(args)
    name = args.name or run_name(config, getattr(args, "preset", None))
    if store is not None and args.run_id is not None:
        run = store.get_run(args.run_id)
        if run.status != "queued":
            raise UsageError(
                f"--run_id {args.run_id}: run {run.name!r} is {run.status}, not queued"
            )
        name = args.name or run.name
    return RunPlan(config=config, name=name, run_id=args.run_id)


def plan_resume(args: argparse.Namespace, store: RunStore) -> RunPlan:
    """Run `--resume` continued from its last checkpoint; UsageError when it cannot be."""
    run = store.get_run(args.resume)
    run_id = int(run.id)
    if run.status in ACTIVE_STATUSES and run_alive(run):
        raise UsageError(f"--resume: run {run_id} ({run.name}) is {run.status}; stop it first")
    run_dir = store.run_dir(run_id)
    try:
        config = cfg.RunConfig.from_json((run_dir / "config.json").read_text(encoding="utf-8"))
    except OSError:
        raise UsageError(f"--resume: run {run_id} has no {run_dir / 'config.json'}") from None
    overrides = resume_overrides(args)
    if overrides:
        config = cfg.replace(config, **overrides).validate()
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    if not checkpoint.is_file():
        raise UsageError(f"--resume: run {run_id} has no checkpoint at {checkpoint}")
    state = read_checkpoint(checkpoint, f"--resume: run {run_id}'s checkpoint")
    start_step = state["global_step"]
    # At max_steps, a run that died before it recorded its end is finished (RunPlan.finishing).
    finished = run.status in ("completed", "diverged")
    if start_step > config.train.max_steps or (start_step == config.train.max_steps and finished):
        raise UsageError(
            f"--resume: run {run_id} is already at step {start_step} of max_steps="
            f"{config.train.max_steps}; pass a larger --max_steps"
        )
    recorded = run.dataset
    return RunPlan(
        config=config,
        name=run.name,
        run_id=run_id,
        checkpoint=checkpoint,
        start_step=start_step,
        schedule_steps=schedule_horizon(state, config),
        pending_rows=state["pending_rows"],
        legacy_eval=bool(recorded) and not evaluation.same_text(recorded),
    )


def schedule_horizon(state: dict[str, Any], config: cfg.RunConfig) -> int:
    """Where the lr decay of a resumed run ends: the horizon `read_checkpoint`'s `state`
    carries (the run's first max_steps), not a larger --max_steps given to the resume.

    Every rank of a DDP run must use it: DDP averages the gradients, not the updates, so
    ranks on different schedules would drift apart.
    """
    hparams = state["hyper_parameters"]
    first_max_steps = ((hparams.get("run_config") or {}).get("train") or {}).get("max_steps")
    return int(hparams.get("schedule_steps") or first_max_steps or config.train.max_steps)


def resume_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields `--resume` was given; UsageError when one may not change."""
    overrides = config_overrides(args, list(cfg.SECTIONS))
    changed = sorted(set(overrides) - set(RESUMABLE_FIELDS))
    if changed:
        raise UsageError(
            f"--{changed[0]} cannot change on --resume (the run's maths is fixed); "
            f"allowed: {', '.join('--' + f for f in RESUMABLE_FIELDS)}"
        )
    return overrides


def read_checkpoint(path: Path, what: str) -> dict[str, Any]:
    """A checkpoint's step, hyperparameters and carried rows; UsageError naming the problem.

    Loaded with weights_only=True: a file holding anything but tensors and plain data is
    refused rather than executed.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else "refused"
        raise UsageError(
            f"{what} {path} holds objects that safe loading (weights_only) refuses ({reason}); "
            "it was not written by blockviz or has been altered"
        ) from None
    except Exception as exc:  # truncated or garbled: torch raises RuntimeError, EOFError...
        raise UsageError(
            f"{what} {path} is truncated or corrupt ({type(exc).__name__}); it cannot be "
            "resumed from: delete it to start over, or restore it"
        ) from None
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise UsageError(f"{what} {path} is not a blockviz training checkpoint (no global_step)")
    hparams = state.get("hyper_parameters")
    pending = state.get(PENDING_ROWS_KEY)
    return {
        "global_step": step,
        "hyper_parameters": hparams if isinstance(hparams, dict) else {},
        "pending_rows": pending if isinstance(pending, dict) else None,
        "loaded": state,  # the whole checkpoint as loaded (a fork rewrites it)
    }


def check_memory(config: cfg.RunConfig, copies: int = 1) -> None:
    """Refuse (ConfigError, exit 2) a model whose training would not fit in memory.

    Compared with the memory the device has: the GPU's total memory for a CUDA run, the
    host's available memory otherwise (`params.estimate_memory` says what is counted).
    """
    train = config.train
    use_cuda = train.accelerator == "gpu" or (
        train.accelerator == "auto" and torch.cuda.is_available()
    )
    if use_cuda and torch.cuda.is_available():
        available: int | None = torch.cuda.mem_get_info()[1]
    elif use_cuda or train.accelerator == "mps":
        return  # no device here to compare with; Lightning says so on its own
    else:
        # Several CPU processes (DDP) on one host share its memory.
        available = params.available_host_memory()
        if available is not None:
            available //= max(1, train.devices)
    if available is not None:
        # Replicas of one batch hold `copies` models, optimizers and activations at once.
        estimate = params.check_fits(config, available // max(1, copies))
        log.info("memory estimate %s of %s available", estimate.total, available)


def load_datamodule(config: cfg.RunConfig, legacy_eval: bool = False) -> CharDataModule:
    """The run's data, set up (read, encoded, split); DataError when it cannot be.

    `legacy_eval`: score on the windows the training seed draws, as runs recorded before
    the evaluation set did (a resume of one of them).
    """
    # A first use of Tiny Shakespeare downloads 1.1 MB: the percentage goes to the terminal,
    # or to the run's log when the dashboard launched it; nothing is printed otherwise.
    progress = DownloadProgress()
    train = config.train
    datamodule = CharDataModule(
        config.data,
        block_size=config.model.block_size,
        batch_size=train.batch_size,
        seed=train.seed,
        eval_iters=train.eval_iters,
        progress=progress,
        legacy_eval=legacy_eval,
    )
    try:
        datamodule.setup()
    finally:
        progress.finish()
    return datamodule
