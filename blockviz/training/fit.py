"""One fit of one run, as every rank runs it: the model, the callbacks (lifecycle, probes,
progress), the loggers and the Trainer, then `Trainer.fit`, read back as an `Outcome`
(completed, diverged or stopped, at which step; `fit_loop`, which a batch of replicas
shares). Rank 0 passes the store; the other ranks fit the same way without it. Also the
exit codes of the `train` command.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from blockviz.core import hardware
from blockviz.core.plans import Plan
from blockviz.store import RunStore
from blockviz.training.callbacks import ConsoleProgress, TrainingDiverged
from blockviz.training.lifecycle import Heartbeat, StopRequest
from blockviz.training.lit import LitCharModel
from blockviz.training.logger import RunLifecycle, StoreLogger
from blockviz.training.probes import BlockProbe
from blockviz.training.sinks import LoggerSink, StoreSink
from blockviz.training.trainer import make_trainer, run_loggers

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# What the fits hand back as each run ends: (member index, outcome, its model, its Trainer).
Record = Callable[[int, "Outcome", Any, Any], None]


@dataclass(frozen=True)
class Outcome:
    """How a fit ended."""

    status: str
    step: int


def fit(
    plan: Plan,
    datamodule: Any,
    run_dirs: list[Path],
    run_ids: list[int | None],
    store: RunStore | None,
    stop: StopRequest,
    progress: bool,
    on_ready: Callable[[Any, list[Any]], None],
    record: Record,
) -> None:
    """A plan of one run (`replica_fit.fit_replicas`'s signature): build model, callbacks
    and Trainer, fit, and hand the end to `record`; every rank runs this the same way."""
    config, run_dir, run_id = plan.config, run_dirs[0], run_ids[0]
    loggers, probe = None, None  # rank 0's: its rows, --logger files and probe
    if store is not None:
        loggers, probe = watchers(plan, config, store, run_id, run_dir, sample_prompt(datamodule))
    L.seed_everything(config.train.seed, workers=False, verbose=False)
    lit = LitCharModel(
        config.to_dict(), datamodule.vocab.to_json(), schedule_steps=plan.schedule_steps
    )
    heartbeat = Heartbeat(store, run_id) if store is not None else None
    lifecycle = RunLifecycle(stop, [heartbeat] if heartbeat is not None else [], store, run_id)
    callbacks: list[Any] = [lifecycle, *([probe] if probe is not None else [])]
    if progress:
        callbacks.append(ConsoleProgress())
    trainer = make_trainer(config, callbacks, loggers, run_dir)
    on_ready(trainer, [lit])
    if heartbeat is not None:
        heartbeat.step = plan.start_step
        heartbeat.start()

    def finish() -> None:
        # Lightning skips the whole loop of a fit restored at max_steps, on_train_end with
        # it: the end's text sample and attention map are written here instead.
        if probe is not None:
            probe.on_train_end(trainer, lit)

    try:
        scored = lambda step: lit.last_val.get("step") == step  # noqa: E731
        outcome = fit_loop(trainer, lit, datamodule, plan, stop, lifecycle, scored, finish)
    finally:
        if heartbeat is not None:
            heartbeat.stop()
    record(0, outcome, lit, trainer)


def watchers(
    plan: Plan, config: Any, store: RunStore, run_id: int, run_dir: Path, prompt: str
) -> tuple[list[Any], BlockProbe]:
    """A run's loggers (its store rows, and its --logger files in `run_dir`) and its
    probe, writing to both."""
    train = config.train
    resume_step = plan.start_step if plan.checkpoint is not None else None
    extra = run_loggers(train, run_dir, resume_step)
    sinks = [StoreSink(store, run_id), *([LoggerSink(extra)] if extra else [])]
    probe = BlockProbe(
        sinks,
        probe_interval=train.probe_interval,
        sample_interval=train.sample_interval,
        prompt=prompt,
    )
    return [StoreLogger(store, run_id), *extra], probe


def fit_loop(
    trainer: Any,
    lit: Any,
    datamodule: Any,
    plan: Plan,
    stop: StopRequest,
    lifecycle: RunLifecycle,
    scored: Callable[[int], bool],
    finish: Callable[[], None],
) -> Outcome:
    """`Trainer.fit` from the plan's checkpoint, read back as an Outcome; the last
    evaluation done when the fit ended without it (`scored(step)`: whether it has one at
    `step`). `finish` writes what the end of training writes, for a plan only finishing."""
    train = plan.config.train
    if stop.requested:
        return Outcome("stopped", plan.start_step)
    try:
        trainer.fit(lit, datamodule=datamodule, ckpt_path=plan.checkpoint, weights_only=True)
        step = trainer.global_step
        if plan.finishing:
            finish()
        if step < train.max_steps:  # ended early without an exception (on_train_end saved)
            return Outcome("stopped", step)
        if not scored(step):
            trainer.validate(lit, datamodule=datamodule, verbose=False, weights_only=True)
        return Outcome("completed", step)
    except TrainingDiverged as exc:
        return Outcome("diverged", exc.step)
    except SIGTERMException:
        step = lifecycle.stopped_at or trainer.global_step
        if step and step % train.eval_interval == 0 and not scored(step):
            # The stop interrupted this step's evaluation: finish it, so the resumed run
            # (which starts after the evaluation) does not miss the point for good.
            with contextlib.suppress(SIGTERMException):
                trainer.validate(lit, datamodule=datamodule, verbose=False, weights_only=True)
        return Outcome("stopped", step)


def sample_prompt(datamodule: Any) -> str:
    """The fixed prompt of text samples: a newline, or the text's first character."""
    return "\n" if "\n" in datamodule.vocab else datamodule.corpus.text[0]


def describe_device(trainer: Any) -> str:
    """`cpu, 1 thread`, `cuda (NVIDIA H100 80GB HBM3), 16 threads`, `2x cpu (ddp), 1 thread`..."""
    root = trainer.strategy.root_device
    text = root.type
    if root.type == "cuda":
        text = f"cuda ({torch.cuda.get_device_name(root)})"
    world = trainer.world_size
    if world > 1:
        text = (
            f"{world}x {text} ({type(trainer.strategy).__name__.removesuffix('Strategy').lower()})"
        )
    return f"{text}, {hardware.threads_text(torch.get_num_threads())}"
