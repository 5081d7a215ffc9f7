"""`python -m blockviz train`: one run (or one per seed) recorded into the store.

This module takes the request `blockviz.cli` read from the flags, plans, checks the plan
can start (`preflight`), and hands it to the one lifecycle every run kind shares
(`registration.run_plan`; docs/architecture.md, "The run lifecycle", maps its parts), which
leaves each run in exactly one final status: completed, diverged, stopped (with a
checkpoint, resumable) or failed (docs/internals.md, "How a run ends", gives each one's
exit status). `train --seeds` trains one run per seed, several at once as replicas of one
batched model (`replicas`); each replica is a run of its own, ending in its own status.

Under DDP only global rank 0 touches the store; the other ranks (started by Lightning's
launcher re-running this command) fit the same way without it, finding the run's folder
in the environment (`_follower_main`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from blockviz.core import config as cfg
from blockviz.core import hardware, startup_trace
from blockviz.core.extras import check_logger_available
from blockviz.core.flags import UsageError, build_config, check_threads
from blockviz.core.plans import Member, Plan, plan_seeds, schedule_horizon
from blockviz.core.requests import Session, TrainRequest
from blockviz.training.fit import EXIT_OK, fit
from blockviz.training.lifecycle import StopRequest, global_rank_from_env
from blockviz.training.plan import (
    check_memory,
    load_datamodule,
    plan_new,
    plan_resume,
    read_checkpoint,
)
from blockviz.training.registration import (
    ENV_LEGACY_EVAL,
    ENV_RUN_DIR,
    Ran,
    fail_runs,
    run_plan,
    writer_store,
)
from blockviz.training.trainer import quiet_lightning


def apply_threads(requested: int | None, max_running: int) -> int:
    """Give torch `requested` CPU threads, else this run's share of the cores; how many."""
    check_threads(requested)
    threads = requested or hardware.default_threads(max(0, int(max_running or 0)))
    torch.set_num_threads(threads)
    return threads


def main(request: TrainRequest) -> int:
    """`python -m blockviz train`: one run (or one per seed), recorded into the store."""
    apply_threads(request.session.threads, request.session.max_running)
    if global_rank_from_env() != 0:
        return _follower_main(request)
    if request.seeds is not None:
        return _train_seeds(request)
    if request.resume is None and request.run_id is None:
        # A new run: a bad flag, config or dataset must not even create the store file.
        return train(plan_new(request, None), request.session, create=True).exit_code
    with writer_store(request.session, create=False) as store:
        try:
            plan = plan_resume(request, store) if request.resume else plan_new(request, store)
            datamodule = preflight(plan)
        except (UsageError, ValueError) as exc:
            if request.run_id is not None and not request.resume:
                fail_runs(store, [request.run_id], str(exc))
            raise
        return run_plan(plan, datamodule, store, request.session).exit_code


def train(plan: Plan, session: Session, create: bool = False) -> Ran:
    """Check the plan can start (data, memory, logger), then train it in the store."""
    datamodule = preflight(plan)
    with writer_store(session, create) as store:
        return run_plan(plan, datamodule, store, session)


def _train_seeds(request: TrainRequest) -> int:
    """`train --seeds`: the batches one after another; a stop ends the command there."""
    plans = plan_seeds(request)
    worst = EXIT_OK
    with StopRequest() as stop:  # a stop during one batch (or seed) ends the command there
        for number, plan in enumerate(plans):
            if stop.requested:
                left = [m.config.train.seed for p in plans[number:] for m in p.members]
                print(f"blockviz: stopped; seeds {left} not started", flush=True)
                break
            worst = max(worst, train(plan, request.session, create=True).exit_code)
    return worst


def preflight(plan: Plan) -> Any:
    """Load the data and check the plan can start here (memory, logger); the datamodule."""
    datamodule = load_datamodule(plan.config, plan.legacy_eval)
    if plan.batch:
        datamodule.replica_seeds = [m.config.train.seed for m in plan.members]
    startup_trace.mark("data loaded")
    config = cfg.replace(plan.config, vocab_size=datamodule.vocab.size)
    check_memory(config, copies=len(plan.members))
    check_logger_available(plan.config.train)
    return datamodule


def _follower_main(request: TrainRequest) -> int:
    """A rank > 0 process: the same fit, without the store (rank 0 records everything)."""
    quiet_lightning()
    run_dir_text = os.environ.get(ENV_RUN_DIR)
    run_dir = Path(run_dir_text) if run_dir_text else Path(".")
    config_path = run_dir / "config.json"
    if run_dir_text and config_path.exists():
        config = cfg.RunConfig.from_json(config_path.read_text(encoding="utf-8"))
    else:
        config = build_config(request.source)
    checkpoint = run_dir / "checkpoints" / "last.ckpt" if request.resume else None
    schedule_steps = None
    if checkpoint is not None:
        # The lr schedule rank 0 keeps (plan_resume): a larger --max_steps must not
        # stretch this rank's decay alone.
        state = read_checkpoint(checkpoint, f"--resume: run {request.resume}'s checkpoint")
        schedule_steps = schedule_horizon(state, config)
    datamodule = load_datamodule(config, os.environ.get(ENV_LEGACY_EVAL) == "1")
    plan = Plan(
        (Member(config, ""),), checkpoint=checkpoint, schedule_steps=schedule_steps
    ).with_vocab(datamodule.vocab.size)
    ignore = lambda *args: None  # noqa: E731  (rank 0 records)
    with StopRequest() as stop:
        fit(plan, datamodule, [run_dir], [None], None, stop, False, ignore, ignore)
    return EXIT_OK
