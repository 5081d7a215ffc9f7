"""One fit of a plan, one run or a batch of replicas, as every rank runs it: the model,
the callbacks (lifecycle, probes, progress), the loggers and the Trainer, then
`Trainer.fit`, read back as an `Outcome` (completed, diverged or stopped, at which step).
Rank 0 passes the store; the other ranks fit the same way without it. Also the exit codes
of the `train` command.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from blockviz.core import config as cfg
from blockviz.core import hardware
from blockviz.core.plans import Plan
from blockviz.store import RunStore
from blockviz.training.callbacks import ConsoleProgress, TrainingDiverged, TrainingMonitor
from blockviz.training.lifecycle import Heartbeat, StopRequest
from blockviz.training.lit import LitCharModel
from blockviz.training.logger import RunLifecycle, StoreLogger
from blockviz.training.probes import BlockProbe
from blockviz.training.replicas import LitReplicas
from blockviz.training.sinks import LoggerSink, StoreSink
from blockviz.training.trainer import make_trainer, run_loggers

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

log = logging.getLogger(__name__)

# What the fits hand back as each run ends: (member index, outcome, the module, its Trainer).
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
    on_ready: Callable[[Any, Any], None],
    record: Record,
) -> None:
    """A plan's one fit, of one run (`LitCharModel`) or of its K members as replicas of
    one batched model (`LitReplicas`, in the batch's folder): build the model, each run's
    watchers and the Trainer, fit, and hand each member's end to `record` (a replica that
    diverged at once, the others when the fit ends). Every rank runs this the same way;
    only rank 0 has the store (and a batch has one rank)."""
    config, vocab = plan.config, datamodule.vocab.to_json()
    if plan.batch:
        lit = LitReplicas([m.config.to_dict() for m in plan.members], vocab, plan.schedule_steps)
    else:
        L.seed_everything(config.train.seed, workers=False, verbose=False)
        lit = LitCharModel(config.to_dict(), vocab, schedule_steps=plan.schedule_steps)
    ended = {
        i: Outcome("skipped", plan.start_step) for i, m in enumerate(plan.members) if m.finished
    }
    # Rank 0's: each training member's loggers (its rows, its --logger files), probe sinks
    # (to both) and heartbeat, and the probe of them all.
    loggers: list[list[Any]] = [[] for _ in plan.members]
    sinks: list[list[Any]] = [[] for _ in plan.members]
    heartbeats: dict[int, Heartbeat] = {}
    watch: list[BlockProbe] = []
    if store is not None:
        resume_step = plan.start_step if plan.checkpoint is not None else None
        for i, member in enumerate(plan.members):
            if i not in ended:
                extra = run_loggers(member.config.train, run_dirs[i], resume_step)
                loggers[i] = [StoreLogger(store, run_ids[i]), *extra]
                sinks[i] = [StoreSink(store, run_ids[i]), *([LoggerSink(extra)] if extra else [])]
                heartbeats[i] = Heartbeat(store, run_ids[i])
        train = config.train
        probe = BlockProbe(
            run_sinks=sinks,
            probe_interval=train.probe_interval,
            sample_interval=train.sample_interval,
            # the text samples' prompt: a newline, or the text's first character
            prompt="\n" if "\n" in datamodule.vocab else datamodule.corpus.text[0],
        )
        watch = [probe]
    lifecycle = RunLifecycle(stop, list(heartbeats.values()), store, run_ids)
    callbacks = [lifecycle, *watch, *([ConsoleProgress()] if progress else [])]
    if plan.batch:

        def on_diverged(index: int, step: int) -> None:
            lit.mark_diverged(index, step)
            ended[index] = Outcome("diverged", step)
            heartbeats[index].stop()  # its row is final: no more beats, no more steps
            record(index, ended[index], lit, trainer)

        lit.replica_loggers = loggers  # each replica's, not the Trainer's
        lit.out = list(ended)
        monitor = TrainingMonitor(config.train.log_interval, runs=lit.k, on_diverged=on_diverged)
        shared = cfg.replace(config, grad_clip=0.0)  # clipping is per replica (the module's)
        trainer = make_trainer(shared, callbacks, None, plan.batch_dir, monitor=monitor)
    else:
        trainer = make_trainer(config, callbacks, loggers[0] or None, run_dirs[0])
    on_ready(trainer, lit)
    for heartbeat in heartbeats.values():
        heartbeat.step = plan.start_step
        heartbeat.start()
    try:
        outcome = fit_loop(trainer, lit, datamodule, plan, stop, lifecycle, watch)
    finally:
        for heartbeat in heartbeats.values():
            heartbeat.stop()
        if plan.batch:  # not the Trainer's loggers: closed here (a csv writer keeps rows
            # until it saves; a TensorBoard writer holds a file and a thread)
            _close([logger for run in loggers for logger in run[1:]])
    if plan.batch and outcome.status == "diverged":  # the last one diverged (recorded)
        outcome = Outcome("stopped", outcome.step)
    for index in range(len(plan.members)):
        if index not in ended:
            record(index, outcome, lit, trainer)


def _close(loggers: list[Any]) -> None:
    """Finalize `--logger` writers a Trainer does not own; one that cannot write never
    fails the run."""
    for logger in loggers:
        try:
            logger.finalize("success")
        except Exception as exc:
            log.warning("closing a logger: %s", exc)


def fit_loop(
    trainer: Any,
    lit: Any,
    datamodule: Any,
    plan: Plan,
    stop: StopRequest,
    lifecycle: RunLifecycle,
    watch: list[BlockProbe],
) -> Outcome:
    """`Trainer.fit` from the plan's checkpoint, read back as an Outcome; the last
    evaluation done when the fit ended without it. For a plan only finishing, the probes
    (`watch`) write what the end of training writes."""
    train = plan.config.train

    def scored(step: int) -> bool:  # whether every live run has its evaluation of `step`
        latest = [last for last, alive in zip(lit.last_vals, lit.live, strict=True) if alive]
        return all(last.get("step") == step for last in latest)

    if stop.requested:
        return Outcome("stopped", plan.start_step)
    try:
        trainer.fit(lit, datamodule=datamodule, ckpt_path=plan.checkpoint, weights_only=True)
        step = trainer.global_step
        if plan.finishing:
            # Lightning skips the whole loop of a fit restored at max_steps, on_train_end
            # with it: the end's text sample and attention map are written here instead.
            for probe in watch:
                probe.on_train_end(trainer, lit)
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
