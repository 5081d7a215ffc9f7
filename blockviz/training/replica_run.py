"""A batch of replicas in the store: K runs registered, trained as one model, ended each
on its own.

`train --seeds 0,1,2` (`cli_seeds`), a study worker's batch of claimed runs (`train_claimed`)
and `train --resume RUN` of a replica (`resume`) all come here. Each replica is its own run
(row, config.json, vocab.json, train.log, rows, status, final metrics); every member's folder
also holds `replicas.json` (`core.replicas.BATCH_FILE`) naming the batch, and the batch's
checkpoint is `checkpoints/last.ckpt` in the first member's folder (the batch's folder).

Statuses: a replica that diverges is `diverged` at its step at once, the rest go on; when
the fit ends the others are `completed`, or `stopped` (SIGTERM / Ctrl-C: the step finishes,
the batch's checkpoint is written, `train --resume` of any member resumes the members that
were still training), or `failed` (an error: all live members, the traceback in train.log).
A kill -9 leaves them running until the reaper marks them failed; a resume continues them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blockviz.core import config as cfg
from blockviz.core import evaluation, procs, replicas
from blockviz.core.extras import check_logger_available
from blockviz.core.files import atomic_write
from blockviz.core.flags import UsageError, run_config_from_args
from blockviz.core.naming import run_name
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.store import RunStore, StoreError, run_alive
from blockviz.training.final_metrics import final_metrics, summary_text
from blockviz.training.fit import EXIT_OK, Outcome, describe_device, sample_prompt
from blockviz.training.lifecycle import StopRequest, patiently
from blockviz.training.logger import FLUSH_EVERY_S
from blockviz.training.plan import (
    check_memory,
    load_datamodule,
    read_checkpoint,
    resume_overrides,
)
from blockviz.training.registration import failure_exit, wait_for_slot
from blockviz.training.replica_fit import Replica, ReplicaTrainer, build_replicas, fit_batch
from blockviz.training.replicas import LitReplicas
from blockviz.training.run_log import close_log, open_log

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """What a batch is about to train: its members' configs and runs, and where from."""

    configs: list[cfg.RunConfig]
    names: list[str]
    run_ids: list[int | None]  # None: create the run
    checkpoint: Path | None = None
    start_step: int = 0
    schedule_steps: int | None = None
    pending_rows: dict[str, Any] = field(default_factory=dict)
    legacy_eval: bool = False
    # Members (by index) that are in the stacked state but do not train on: a resume's
    # finished or diverged members, a claimed run stopped before it started. Masked out.
    skip: set[int] = field(default_factory=set)


# ------------------------------------------------------------------- the three doors


def cli_seeds(args: argparse.Namespace, seeds: list[int], limit: int) -> int:
    """`train --seeds`: one run per seed, in batches of at most `limit` replicas."""
    base = run_config_from_args(args)
    name = args.name or run_name(base, getattr(args, "preset", None))
    configs = [cfg.replace(base, seed=seed).validate() for seed in seeds]
    names = [f"{name}-s{seed}" for seed in seeds]
    reason = replicas.why_solo(base)
    if reason is not None:
        limit = 1
        print(f"blockviz: these seeds train one after another: {reason}", flush=True)
    groups = replicas.group(list(zip(range(len(configs)), configs, strict=True)), limit)
    worst = EXIT_OK
    stop = StopRequest()  # a stop during one batch (or seed) ends the command there
    stop.install()
    try:
        for number, indices in enumerate(groups):
            if stop.requested:
                left = [seeds[i] for group in groups[number:] for i in group]
                print(f"blockviz: stopped; seeds {left} not started", flush=True)
                break
            if len(indices) == 1:  # alone: exactly the solo `train` of that seed
                worst = max(worst, _train_alone(args, seeds[indices[0]], names[indices[0]]))
                continue
            chosen = [configs[i] for i in indices]
            batch = Batch(chosen, [names[i] for i in indices], [None] * len(indices))
            worst = max(worst, train_batch(args, batch))
    finally:
        stop.uninstall()
    return worst


def _train_alone(args: argparse.Namespace, seed: int, name: str) -> int:
    """One seed of `--seeds` as the plain `train --seed SEED --name NAME` would train it."""
    from blockviz.training.train import cli_main

    solo = argparse.Namespace(**vars(args))
    solo.seeds, solo.cfg_seed, solo.name = None, str(seed), name
    return cli_main(solo)


def train_claimed(args: argparse.Namespace, run_ids: list[int]) -> int:
    """A study worker's batch: the queued runs it claimed, each with its config.json."""
    with RunStore(args.store, create=False) as store:
        configs = [_read_config(store, run_id) for run_id in run_ids]
        names = [store.get_run(run_id).name for run_id in run_ids]
    return train_batch(args, Batch(configs, names, list(run_ids)))


def resume(args: argparse.Namespace, store: RunStore, run_id: int) -> int:
    """`train --resume RUN` where RUN is a replica: the batch's unfinished members go on."""
    batch = plan_resume(args, store, run_id)
    store.close()
    return train_batch(args, batch)


def batch_of(store: RunStore, run_id: int) -> dict[str, Any] | None:
    """The batch file of a run that trained as a replica (None: a solo run)."""
    return replicas.read_batch_file(store.run_dir(run_id))


# ------------------------------------------------------------------- planning a resume


def plan_resume(args: argparse.Namespace, store: RunStore, run_id: int) -> Batch:
    """The members of RUN's batch that were still training, from its checkpoint."""
    info = batch_of(store, run_id) or {}
    members = [int(m) for m in info.get("runs", [])]
    if run_id not in members:
        raise UsageError(f"--resume: run {run_id}'s replicas.json does not name it")
    leader = int(info.get("leader", members[0]))
    checkpoint = store.run_dir(leader) / "checkpoints" / "last.ckpt"
    if not checkpoint.is_file():
        raise UsageError(f"--resume: run {run_id}'s batch has no checkpoint at {checkpoint}")
    state = read_checkpoint(checkpoint, f"--resume: run {run_id}'s batch checkpoint")
    hparams = state["hyper_parameters"]
    saved = hparams.get("run_configs")
    import torch

    raw = torch.load(checkpoint, map_location="cpu", weights_only=True)
    alive = raw.get("state_dict", {}).get("alive")
    seeds = [((c or {}).get("train") or {}).get("seed") for c in saved or []]
    if alive is None or not isinstance(saved, list) or len(saved) != len(members):
        raise UsageError(
            f"--resume: {checkpoint} is no longer run {run_id}'s batch checkpoint (run "
            f"{leader}, whose folder holds it, trained again since); it cannot resume"
        )
    alive = alive.tolist()
    overrides = resume_overrides(args)
    configs, names, skip = [], [], set()
    for index, (member, live) in enumerate(zip(members, alive, strict=True)):
        try:
            run = store.get_run(member)
        except StoreError:
            raise UsageError(
                f"--resume: run {member} of run {run_id}'s batch is gone; the batch cannot resume"
            ) from None
        if run.status in ACTIVE_STATUSES and run_alive(run):
            raise UsageError(f"--resume: run {member} ({run.name}) is {run.status}; stop it first")
        if (batch_of(store, member) or {}).get("runs") != members:
            raise UsageError(
                f"--resume: run {member} has trained in another batch (or alone) since this "
                f"batch's checkpoint; run {run_id}'s batch cannot resume"
            )
        config = _read_config(store, member)
        if config.train.seed != seeds[index]:
            raise UsageError(
                f"--resume: run {member}'s config does not match its place in the batch "
                f"checkpoint {checkpoint}; the batch cannot resume"
            )
        if overrides:
            config = cfg.replace(config, **overrides).validate()
            reason = replicas.why_solo(config)
            if reason is not None:
                raise UsageError(f"--resume: a batch of replicas cannot change to this: {reason}")
        configs.append(config)
        names.append(run.name)
        if not live or run.status in ("completed", "diverged"):
            skip.add(index)
    if len(skip) == len(members):
        raise UsageError(f"--resume: no run of run {run_id}'s batch is left to train")
    start = state["global_step"]
    if start >= configs[0].train.max_steps:
        raise UsageError(
            f"--resume: run {run_id}'s batch is already at step {start} of max_steps="
            f"{configs[0].train.max_steps}; pass a larger --max_steps"
        )
    # The schedule keeps the horizon the batch started with (a larger --max_steps does not
    # stretch it), as a solo resume does.
    first_max_steps = ((saved[0] or {}).get("train") or {}).get("max_steps")
    horizon = hparams.get("schedule_steps") or first_max_steps or configs[0].train.max_steps
    recorded = store.get_run(run_id).dataset
    return Batch(
        configs,
        names,
        list(members),
        checkpoint=checkpoint,
        start_step=start,
        schedule_steps=int(horizon),
        pending_rows=state["pending_rows"] or {},
        legacy_eval=bool(recorded) and not evaluation.same_text(recorded),
        skip=skip,
    )


def _read_config(store: RunStore, run_id: int) -> cfg.RunConfig:
    path = store.run_dir(run_id) / "config.json"
    try:
        return cfg.RunConfig.from_json(path.read_text(encoding="utf-8"))
    except OSError:
        raise UsageError(f"run {run_id} has no {path}") from None


# ------------------------------------------------------------------- the batch's life


def train_batch(args: argparse.Namespace, batch: Batch) -> int:
    """Load the data, register the members, fit them as one, record each one's end."""
    first = batch.configs[0]
    datamodule = load_datamodule(first, batch.legacy_eval)
    datamodule.replica_seeds = [c.train.seed for c in batch.configs]
    configs = [cfg.replace(c, vocab_size=datamodule.vocab.size).validate() for c in batch.configs]
    check_memory(configs[0], copies=len(configs))
    check_logger_available(first.train)
    # Only a batch that creates its runs may create the store (a worker's or a resume's
    # runs are in it already: a missing file is an error, not a new empty store).
    create = all(run_id is None for run_id in batch.run_ids)
    store = RunStore(
        args.store or None, flush_seconds=FLUSH_EVERY_S, defer_when_busy=True, create=create
    )
    stop = StopRequest()
    stop.install()
    try:
        return _register_and_fit(args, store, batch, configs, datamodule, stop)
    finally:
        stop.uninstall()
        try:
            store.close()
        except StoreError as exc:
            log.error("closing the run store: %s", exc)


def _register_and_fit(
    args: argparse.Namespace,
    store: RunStore,
    batch: Batch,
    configs: list[cfg.RunConfig],
    datamodule: Any,
    stop: StopRequest,
) -> int:
    me = procs.identity_of()
    ids: list[int] = []
    skip = set(batch.skip)
    resumed = batch.checkpoint is not None
    for index, (config, name, run_id) in enumerate(
        zip(configs, batch.names, batch.run_ids, strict=True)
    ):
        fields = {
            "status": "queued",
            "pid": os.getpid(),
            "pid_started": me.started if me else None,
            "max_steps": config.train.max_steps,
            "dataset": datamodule.fingerprint,
        }
        if run_id is None:
            ids.append(patiently(store.create_run, name, config.to_json(), **fields))
            continue
        ids.append(run_id)
        if index in skip:
            continue
        unless = () if resumed else ("stopped",)
        clear = {"ended": None, "error": None, "final": None, "diverged_step": None}
        fields["config"] = config.to_json()  # a resume may change max_steps or cadence
        if not patiently(store.take_over, run_id, unless, **clear, **fields):
            skip.add(index)  # stopped before this process registered: it stays stopped
    if len(skip) == len(ids):
        print("blockviz: every run of this batch was stopped before it started", flush=True)
        return EXIT_OK
    try:
        return _prepare_and_fit(args, store, batch, configs, datamodule, stop, ids, skip)
    except Exception as exc:  # before the fit (files, rows, the model): every member fails
        training = [run_id for index, run_id in enumerate(ids) if index not in skip]
        return _fail_unstarted(store, training, exc)


def _fail_unstarted(store: RunStore, run_ids: list[int], exc: Exception) -> int:
    """Members a batch took over but could not start training: failed, with the error."""
    return _fail(store, run_ids, f"runs {', '.join(map(str, run_ids))}", exc, "could not start")


def _fail(store: RunStore, run_ids: list[int], what: str, exc: BaseException, how: str) -> int:
    """The runs still active end failed with the one-line error (traceback in train.log);
    the exit status."""
    import traceback

    message = f"{type(exc).__name__}: {exc}".strip()
    log.error("batch %s:\n%s", how, "".join(traceback.format_exception(exc)))
    try:
        store.flush()  # what can still be written, so the step below matches the rows
    except StoreError as flush_exc:
        log.error("flushing the store: %s", flush_exc)
    for run_id in run_ids:
        try:
            if store.get_run(run_id).status in ACTIVE_STATUSES:
                patiently(
                    store.update_run, run_id, status="failed", ended=time.time(), error=message
                )
                store.settle_step(run_id)
        except StoreError as store_exc:
            log.error("could not record the failure: %s", store_exc)
    return failure_exit(exc, what, message)


def _prepare_and_fit(
    args: argparse.Namespace,
    store: RunStore,
    batch: Batch,
    configs: list[cfg.RunConfig],
    datamodule: Any,
    stop: StopRequest,
    ids: list[int],
    skip: set[int],
) -> int:
    """Write the members' files, continue their series, wait for a slot, fit."""
    training = [i for n, i in enumerate(ids) if n not in skip]
    # The batch's folder, where its checkpoint lives: a resume keeps the one it had; a new
    # batch takes its first member that trains (one stopped before it started never does).
    owner = batch.checkpoint.parent.parent if batch.checkpoint is not None else None
    leader_id = next((i for i in ids if owner == store.run_dir(i)), training[0])
    leader = store.run_dir(leader_id)
    run_dirs = [store.run_dir(i) for i in ids]
    handlers = []
    try:
        for index, (run_dir, config) in enumerate(zip(run_dirs, configs, strict=True)):
            if index in skip:
                continue
            (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            atomic_write(run_dir / "config.json", config.to_json())
            atomic_write(run_dir / "vocab.json", datamodule.vocab.to_json())
            replicas.write_batch_file(run_dir, ids, index, leader_id)
            handlers.append(open_log(run_dir))
        names = [store.get_run(i).name for i in ids]
        verb = f"resuming from step {batch.start_step}" if batch.checkpoint else "started"
        print(
            f"blockviz: runs {', '.join(map(str, training))} ({len(training)} replicas of one "
            f"batch) {verb}; store {store.where}",
            flush=True,
        )
        if batch.checkpoint is not None:
            for run_id in training:
                patiently(store.truncate_after, run_id, batch.start_step)
                rows = (batch.pending_rows or {}).get(str(run_id))
                if rows:
                    store.restore_rows(run_id, rows)
        if args.max_running and not wait_for_slot(store, training[0], args.max_running, stop):
            for run_id in training:
                patiently(store.update_run, run_id, status="stopped", ended=time.time())
            print(f"blockviz: runs {ids} stopped while queued", flush=True)
            return EXIT_OK
        batch.skip = skip
        return _fit_and_record(
            args, store, batch, configs, ids, names, run_dirs, leader, datamodule, stop
        )
    finally:
        for handler in handlers:
            close_log(handler)


def _fit_and_record(
    args: argparse.Namespace,
    store: RunStore,
    batch: Batch,
    configs: list[cfg.RunConfig],
    ids: list[int],
    names: list[str],
    run_dirs: list[Path],
    leader: Path,
    datamodule: Any,
    stop: StopRequest,
) -> int:
    vocab_json = datamodule.vocab.to_json()
    lit = LitReplicas([c.to_dict() for c in configs], vocab_json, batch.schedule_steps)
    prompt = sample_prompt(datamodule)
    resume_step = batch.start_step if batch.checkpoint is not None else None
    members = build_replicas(configs, ids, store, run_dirs, prompt, resume_step)
    for index in batch.skip:
        members[index].outcome = Outcome("skipped", batch.start_step)
    started = time.time()
    trainer_box: list[Any] = []

    def on_ready(trainer: Any) -> None:
        trainer_box.append(trainer)
        for replica in members:
            if replica.outcome is not None:
                continue
            patiently(
                store.update_run,
                replica.run_id,
                status="running",
                started=started,
                device=describe_device(trainer) + f", {len(members)} replicas",
                precision=str(trainer.precision),
                n_params=lit.views[replica.index].model.n_params(),
                step=batch.start_step,
            )

    def on_diverged(replica: Replica, step: int) -> None:
        replica.outcome = Outcome("diverged", step)
        replica.heartbeat.stop()  # its row is final: no more beats, no more steps
        _record_end(store, lit, trainer_box[0], replica, names[replica.index])

    try:
        outcome, trainer = fit_batch(
            lit,
            members,
            datamodule,
            leader,
            stop,
            store,
            batch.checkpoint,
            batch.start_step,
            on_diverged,
            progress=not args.no_progress,
            on_ready=on_ready,
        )
    except Exception as exc:
        return _record_failure(store, members, names, exc)
    except BaseException as exc:
        _record_failure(store, members, names, exc)
        raise
    for replica in members:
        if replica.outcome is None:
            replica.outcome = (
                outcome if outcome.status != "diverged" else Outcome("stopped", outcome.step)
            )
            _record_end(store, lit, trainer, replica, names[replica.index])
    store.flush()
    return EXIT_OK


def _record_end(
    store: RunStore, lit: LitReplicas, trainer: Any, replica: Replica, name: str
) -> None:
    """A replica's status, step and final metrics, and its one printed line."""
    outcome = replica.outcome
    view = ReplicaTrainer(trainer, lit, replica)
    final = final_metrics(lit.views[replica.index], view, outcome)
    patiently(
        store.update_run,
        replica.run_id,
        status=outcome.status,
        ended=time.time(),
        step=outcome.step,
        final=final,
        diverged_step=outcome.step if outcome.status == "diverged" else None,
    )
    where = f" at step {outcome.step}" if outcome.status in ("diverged", "stopped") else ""
    print(
        f"blockviz: run {replica.run_id} ({name}) {outcome.status}{where}: {summary_text(final)}",
        flush=True,
    )
    log.info("run %s %s%s: %s", replica.run_id, outcome.status, where, json.dumps(final))


def _record_failure(
    store: RunStore, members: list[Replica], names: list[str], exc: BaseException
) -> int:
    """Every member still training fails with the one-line error (traceback in train.log)."""
    training = [r.run_id for r in members if r.outcome is None]
    return _fail(store, training, f"runs {', '.join(names)}", exc, "failed")
