"""The plans that read the store or a checkpoint (the `Plan` itself is `core.plans`'):
a new run or the runner's queued one (`plan_new`), a study worker's claimed runs
(`plan_claimed`), and a resumed run or batch (`plan_resume`, `read_checkpoint`), with only
hardware and cadence allowed to change, continuing from its last checkpoint (one whose
checkpoint is at max_steps is only finished). The data is loaded and the model's memory
checked here too, so a bad flag, dataset or size is refused (exit 2) before anything is
recorded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from blockviz.core import config as cfg
from blockviz.core import evaluation, forks, params, procs, replicas
from blockviz.core.download import DownloadProgress
from blockviz.core.flags import UsageError, build_config
from blockviz.core.naming import run_name
from blockviz.core.plans import Member, Plan, resume_overrides, schedule_horizon
from blockviz.core.requests import Session, TrainRequest
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.store import RunRecord, RunStore, StoreError, run_alive
from blockviz.training.data import CharDataModule
from blockviz.training.logger import PENDING_ROWS_KEY

log = logging.getLogger(__name__)


def plan_new(request: TrainRequest, store: RunStore | None) -> Plan:
    """A new run from the flags, or the queued run `--run_id` the runner created for them."""
    config = build_config(request.source)
    name = request.name or run_name(config, request.preset)
    if store is not None and request.run_id is not None:
        run = store.get_run(request.run_id)
        if run.status != "queued":
            raise UsageError(
                f"--run_id {request.run_id}: run {run.name!r} is {run.status}, not queued"
            )
        name = request.name or run.name
    return Plan((Member(config, name, request.run_id),))


def plan_claimed(store: RunStore, run_ids: list[int]) -> Plan:
    """A study worker's queued runs (one, or replicas of one batch), each with its
    config.json; runs that trained before (queued again with their rows) continue from
    their checkpoint, as `--resume` of the first does."""
    if store.get_run(run_ids[0]).started is not None:
        return plan_resume(TrainRequest(Session(), resume=str(run_ids[0])), store)
    members = [Member(read_config(store, i), store.get_run(i).name, i) for i in run_ids]
    return Plan(tuple(members))


def read_config(store: RunStore, run_id: int, what: str = "") -> cfg.RunConfig:
    """A run's config.json; UsageError when it has none."""
    path = store.run_dir(run_id) / "config.json"
    try:
        return cfg.RunConfig.from_json(path.read_text(encoding="utf-8"))
    except OSError:
        raise UsageError(f"{what}run {run_id} has no {path}") from None


def plan_resume(request: TrainRequest, store: RunStore) -> Plan:
    """Run `--resume` continued from its last checkpoint, with the members of its batch
    that were still training when it trained as a replica; UsageError when it cannot be."""
    run = store.get_run(request.resume)
    run_id = int(run.id)
    run_dir = store.run_dir(run_id)
    batch = replicas.read_batch_file(run_dir)
    what = f"run {run_id}'s batch" if batch is not None else f"run {run_id}"
    ids = [int(i) for i in batch["runs"]] if batch is not None else [run_id]
    checkpoint = replicas.checkpoint_path(run_dir, store.run_dir)
    if not checkpoint.is_file():
        raise UsageError(f"--resume: {what} has no checkpoint at {checkpoint}")
    checkpoint, state, note = resumable_checkpoint(checkpoint, f"--resume: {what}'s checkpoint")
    overrides = resume_overrides(request.source.fields)
    start = state["global_step"]
    pending = state["pending_rows"] or {}
    if batch is None:
        members = [_resumed(store, ids, 0, None, overrides, start, pending)]
    else:
        saved = _saved_members(state, checkpoint, run_id, len(ids))
        members = [
            _resumed(store, ids, index, saved[index], overrides, start, pending.get(str(i)))
            for index, i in enumerate(ids)
        ]
    training = [m for m in members if not m.finished]
    max_steps = (training or members)[0].config.train.max_steps
    if start > max_steps or (not training and start >= max_steps):
        raise UsageError(
            f"--resume: {what} is already at step {start} of max_steps={max_steps}; "
            "pass a larger --max_steps"
        )
    if not training:
        raise UsageError(f"--resume: no run of {what} is left to train")
    recorded = run.dataset
    return Plan(
        tuple(members),
        checkpoint=checkpoint,
        start_step=start,
        schedule_steps=schedule_horizon(state, members[0].config),
        legacy_eval=bool(recorded) and not evaluation.same_text(recorded),
        batch_dir=checkpoint.parent.parent if batch is not None else None,
        checkpoint_note=note,
    )


def _saved_members(
    state: dict[str, Any], checkpoint: Path, run_id: int, count: int
) -> list[tuple[cfg.RunConfig, bool]]:
    """Each member's config in a batch's checkpoint and whether it was still training
    there; UsageError when the checkpoint is not this batch's."""
    saved = state["hyper_parameters"].get("run_configs")
    alive = (state["loaded"].get("state_dict") or {}).get("alive")
    try:
        if alive is None or not isinstance(saved, list) or len(saved) != count:
            raise ValueError("not this batch's")
        configs = [cfg.RunConfig.from_dict(config) for config in saved]
    except (ValueError, TypeError, AttributeError):
        raise UsageError(
            f"--resume: {checkpoint} is no longer run {run_id}'s batch checkpoint (the run "
            "whose folder holds it trained again since); it cannot resume"
        ) from None
    return list(zip(configs, [bool(live) for live in alive.tolist()], strict=True))


def _resumed(
    store: RunStore,
    batch: list[int],
    index: int,
    saved: tuple[cfg.RunConfig, bool] | None,
    overrides: dict[str, Any],
    start: int,
    rows: Any,
) -> Member:
    """Member `index` of a resume (of `batch`, its runs' ids): its config with the
    resume's changes, and whether it trains on. `saved`: a batch member's config in the
    checkpoint, and whether it was still training there (not diverged)."""
    run_id = batch[index]
    try:
        run = store.get_run(run_id) if saved is None or saved[1] else None
    except StoreError:
        if saved is None:
            raise
        run = None  # a member deleted since: the others go on without it
    if run is None:  # out of the batch (masked in its checkpoint, or gone): it stays out
        config = cfg.replace(saved[0], **overrides).validate() if overrides else saved[0]
        return Member(config, f"run {run_id}", run_id, finished=True)
    if run.status in ACTIVE_STATUSES and run_alive(run) and not _claimed_here(run):
        raise UsageError(f"--resume: run {run_id} ({run.name}) is {run.status}; stop it first")
    config = read_config(store, run_id, "--resume: ")
    if saved is not None:
        if (replicas.read_batch_file(store.run_dir(run_id)) or {}).get("runs") != batch:
            raise UsageError(
                f"--resume: run {run_id} has trained in another batch (or alone) since this "
                f"batch's checkpoint; run {batch[0]}'s batch cannot resume"
            )
        if config.train.seed != saved[0].train.seed:
            raise UsageError(
                f"--resume: run {run_id}'s config does not match its place in its batch's "
                "checkpoint; the batch cannot resume"
            )
    if overrides:
        config = cfg.replace(config, **overrides).validate()
        reason = replicas.why_solo(config) if saved is not None else None
        if reason is not None:
            raise UsageError(f"--resume: a batch of replicas cannot change to this: {reason}")
    # At max_steps, a run that died before it recorded its end is finished (Plan.finishing).
    done = run.status in ("completed", "diverged") and start >= config.train.max_steps
    stopped = saved is not None and run.status == "diverged"
    pending = rows if isinstance(rows, dict) else None
    return Member(config, str(run.name), run_id, finished=done or stopped, pending_rows=pending)


def _claimed_here(run: RunRecord) -> bool:
    """Whether this process holds the run (a study worker resuming runs it claimed)."""
    return run.pid == os.getpid() and procs.is_this_machine(run.host, run.boot_id)


class DamagedCheckpoint(UsageError):
    """A checkpoint file that is truncated or garbled (not one that was altered)."""


def resumable_checkpoint(checkpoint: Path, what: str) -> tuple[Path, dict[str, Any], str | None]:
    """(path, state, note) of the checkpoint a resume starts from: `checkpoint`, or when it
    is damaged the newest kept checkpoint beside it that reads (the note says so);
    UsageError when none does."""
    try:
        return checkpoint, read_checkpoint(checkpoint, what), None
    except DamagedCheckpoint as damaged:
        folder = checkpoint.parent.parent
        for step in reversed(forks.kept_steps(folder)):
            kept = forks.kept_path(folder, step)
            with contextlib.suppress(UsageError):
                state = read_checkpoint(kept, what)
                note = f"{checkpoint.name} is damaged; from {kept.name}, the newest good one"
                return kept, state, note
        raise damaged from None


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
        raise DamagedCheckpoint(
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
