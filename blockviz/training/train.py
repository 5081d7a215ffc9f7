"""`python -m blockviz train`: the run lifecycle around `Trainer.fit`.

`python -m blockviz train` creates (or takes over, or resumes) a run in the store, waits
for a slot when asked, trains with `LitCharModel` + `BlockProbe` + `StoreLogger`, and
leaves the run in exactly one final status:

    completed   max_steps reached; final metrics recorded                     exit 0
    diverged    a NaN / infinite training loss; `diverged_step` recorded      exit 0
    stopped     SIGTERM or Ctrl-C: the current step finishes, a checkpoint    exit 0
                is written (resume it with --resume)
    failed      an error: the message in the store, the traceback in          exit 1
                <run_dir>/train.log (bad flags, data or config: exit 2)

A killed process (kill -9, out of memory) cannot report; `RunStore.reap_dead` marks it
failed once its heartbeat is stale. Rows logged before a checkpoint are in the store (or,
when the store was locked, inside the checkpoint) before the checkpoint exists, and a
resume first drops what the killed process logged after it, so every series holds each
step once. A store locked by another process never stops a run: rows wait in memory and
lifecycle writes retry. Under DDP only global rank 0 touches the store; the
other ranks (started by Lightning's launcher re-running this command) find the run's
folder in the environment.

This module reads the arguments, checks the run can start, and hands it on; the parts live
beside it: `plan` (what to run), `registration` (the run in the store around its fit),
`fit` (one fit, as every rank runs it), `final_metrics` (what a run records when it ends),
`run_log` (its train.log), `lifecycle` (signals, heartbeat, patience, rank), `logger` (the
store as Lightning's logger and callback).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from blockviz.core import config as cfg
from blockviz.core import hardware, startup_trace
from blockviz.core.extras import check_logger_available
from blockviz.core.flags import (
    UsageError,
    check_threads,
    replicas_from_args,
    run_config_from_args,
    seeds_from_args,
)
from blockviz.store import RunStore, StoreError
from blockviz.training.fit import fit
from blockviz.training.lifecycle import StopRequest, global_rank_from_env
from blockviz.training.logger import FLUSH_EVERY_S
from blockviz.training.plan import (
    RunPlan,
    check_memory,
    load_datamodule,
    plan_new,
    plan_resume,
    read_checkpoint,
    schedule_horizon,
)
from blockviz.training.registration import ENV_LEGACY_EVAL, ENV_RUN_DIR, run_in_store
from blockviz.training.trainer import quiet_lightning

log = logging.getLogger(__name__)


def apply_threads(requested: int | None, max_running: int) -> int:
    """Give torch `requested` CPU threads, else this run's share of the cores; how many."""
    check_threads(requested)
    threads = requested or hardware.default_threads(max(0, int(max_running or 0)))
    torch.set_num_threads(threads)
    return threads


def set_threads(args: argparse.Namespace) -> int:
    """`apply_threads` for the `train` command's `--threads` and `--max_running`."""
    return apply_threads(getattr(args, "threads", None), args.max_running)


def cli_main(args: argparse.Namespace) -> int:
    """`python -m blockviz train`: one run, recorded into the store; prints its id."""
    if args.max_running < 0:
        raise UsageError(f"--max_running: {args.max_running} is not allowed; must be >= 0")
    set_threads(args)
    if global_rank_from_env() != 0:
        return _follower_main(args)
    seeds = seeds_from_args(args)
    if seeds is not None:
        from blockviz.training import replica_run

        return replica_run.cli_seeds(args, seeds, replicas_from_args(args))
    if args.resume is not None and _resumes_a_batch(args):
        from blockviz.training import replica_run

        store = _writer_store(args)
        try:
            return replica_run.resume(args, store, store.get_run(args.resume).id)
        finally:
            _close_quietly(store)
    if args.resume is None and args.run_id is None:
        # A new run: a bad flag, config or dataset must not even create the store file.
        plan = plan_new(args, None)
        datamodule = _preflight(plan)
        store = _writer_store(args)
    else:
        store = _writer_store(args)
        try:
            plan = plan_resume(args, store) if args.resume else plan_new(args, store)
            datamodule = _preflight(plan)
        except (UsageError, ValueError) as exc:
            if args.run_id is not None and not args.resume:
                _mark_failed_quietly(store, args.run_id, str(exc))
            store.close()
            raise
    try:
        return run_in_store(args, store, plan, datamodule)
    finally:
        _close_quietly(store)


def _resumes_a_batch(args: argparse.Namespace) -> bool:
    """Whether `--resume RUN` names a run that trained as a replica of a batch."""
    from blockviz.core.replicas import read_batch_file

    with RunStore(args.store or None, create=False) as store:
        return read_batch_file(store.run_dir(store.get_run(args.resume).id)) is not None


def _preflight(plan: RunPlan) -> Any:
    """Load the data and check the run can start here (memory, logger); the datamodule."""
    datamodule = load_datamodule(plan.config, plan.legacy_eval)
    startup_trace.mark("data loaded")
    check_memory(cfg.replace(plan.config, vocab_size=datamodule.vocab.size))
    check_logger_available(plan.config.train)
    return datamodule


def _writer_store(args: argparse.Namespace) -> RunStore:
    """The store as a training run writes it: buffered, and patient with a locked file.

    A run already in it (`--resume`, `--run_id`) needs the file to exist: a missing one is
    an error, not a new empty store.
    """
    return RunStore(
        args.store or None,
        flush_seconds=FLUSH_EVERY_S,
        defer_when_busy=True,
        create=args.resume is None and args.run_id is None,
    )


def _close_quietly(store: RunStore) -> None:
    """Close the store; a last flush that fails (a full disk) was reported already."""
    try:
        store.close()
    except StoreError as exc:
        log.error("closing the run store: %s", exc)


def _mark_failed_quietly(store: RunStore, run_id: int, message: str) -> None:
    # When the run id itself was the problem, the one-line message already says so.
    with contextlib.suppress(StoreError):
        store.update_run(run_id, status="failed", error=message, ended=time.time())


def _follower_main(args: argparse.Namespace) -> int:
    """A rank > 0 process: the same fit, without the store (rank 0 records everything)."""
    quiet_lightning()
    run_dir_text = os.environ.get(ENV_RUN_DIR)
    run_dir = Path(run_dir_text) if run_dir_text else Path(".")
    config_path = run_dir / "config.json"
    if run_dir_text and config_path.exists():
        config = cfg.RunConfig.from_json(config_path.read_text(encoding="utf-8"))
    else:
        config = run_config_from_args(args)
    checkpoint = run_dir / "checkpoints" / "last.ckpt" if args.resume else None
    plan = RunPlan(config=config, name="", checkpoint=checkpoint)
    if checkpoint is not None:
        # The lr schedule rank 0 keeps (plan_resume): a larger --max_steps must not
        # stretch this rank's decay alone.
        state = read_checkpoint(checkpoint, f"--resume: run {args.resume}'s checkpoint")
        plan.schedule_steps = schedule_horizon(state, config)
    datamodule = load_datamodule(config, os.environ.get(ENV_LEGACY_EVAL) == "1")
    plan.config = cfg.replace(config, vocab_size=datamodule.vocab.size).validate()
    stop = StopRequest()
    stop.install()
    try:
        outcome, _, _ = fit(plan, datamodule, run_dir, stop, None, None, progress=False)
    finally:
        stop.uninstall()
    return outcome.exit_code
