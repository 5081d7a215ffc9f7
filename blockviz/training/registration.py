"""The run in the store around its fit (rank 0 only): register it (create it, take over
the runner's row, or resume it), write its config and vocab, open its train.log, wait as
'queued' for a slot, fit, and record how it ended (its status, step and final metrics, or
the failure, with the traceback in train.log). Before a resume, the rows logged after the
checkpoint are dropped and the ones it carried restored.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import traceback
from typing import Any

from blockviz.core import config as cfg
from blockviz.core import procs, replicas, startup_trace
from blockviz.core.files import atomic_write
from blockviz.core.spec import EVAL_SCALARS
from blockviz.core.vocab import DataError
from blockviz.store import RunStore, StoreError
from blockviz.training.final_metrics import final_metrics, recorded_training, summary_text
from blockviz.training.fit import EXIT_FAILED, EXIT_OK, EXIT_USAGE, describe_device, fit
from blockviz.training.lifecycle import StopRequest, patiently
from blockviz.training.plan import RunPlan
from blockviz.training.run_log import close_log, open_log

QUEUE_POLL_S = 1.0
# Set by rank 0 before fit so the ranks Lightning launches find the run's files, and
# score on the same windows (a resumed run recorded before the evaluation set).
ENV_RUN_DIR = "BLOCKVIZ_RUN_DIR"
ENV_LEGACY_EVAL = "BLOCKVIZ_LEGACY_EVAL"

log = logging.getLogger(__name__)


def run_in_store(args: argparse.Namespace, store: RunStore, plan: RunPlan, datamodule: Any) -> int:
    """Register the run, wait for a slot, fit, and record the outcome."""
    stop = StopRequest()
    stop.install()  # before the run exists, so no signal can leave it 'queued' forever
    try:
        return _register_and_fit(args, store, plan, datamodule, stop)
    finally:
        stop.uninstall()


def _register_and_fit(
    args: argparse.Namespace, store: RunStore, plan: RunPlan, datamodule: Any, stop: StopRequest
) -> int:
    """The body of `run_in_store`, with the stop handlers already in place."""
    vocab = datamodule.vocab
    config = cfg.replace(plan.config, vocab_size=vocab.size).validate()
    plan.config = config
    me = procs.identity_of()
    lifecycle_fields = {
        "config": config.to_json(),
        "status": "queued",
        "pid": os.getpid(),
        "pid_started": me.started if me else None,
        "max_steps": config.train.max_steps,
        "dataset": datamodule.fingerprint,
    }
    earlier: dict[str, Any] = {}  # final metrics of the sessions before this one (resume)
    earlier_s = 0.0  # training time of the sessions before this one (resume)
    if plan.run_id is None:
        if plan.parent_id is not None:
            lifecycle_fields.update(
                parent_id=plan.parent_id,
                fork_step=plan.start_step,
                fork_kind=plan.fork_kind,
                fork_info=plan.fork_info,
            )
        run_id = patiently(
            store.create_run, plan.name, lifecycle_fields.pop("config"), **lifecycle_fields
        )
        plan.run_id = run_id  # the caller learns which run it became (a replay reads it)
        if plan.parent_id is not None:
            patiently(store.copy_history, plan.parent_id, run_id, plan.start_step, EVAL_SCALARS)
    else:
        run_id = plan.run_id
        if plan.checkpoint is not None:  # a resumed run's time so far counts on
            earlier = store.get_run(run_id).final or {}
            if plan.finishing and not earlier:  # killed before it wrote them: from its rows
                earlier = recorded_training(store, run_id)
            earlier_s = float(earlier.get("time_s") or 0.0)
        # A run the runner created and someone stopped before this process registered
        # stays stopped (a resume takes over its stopped run on purpose, and a Stop asked
        # through the store before the resume is spent).
        unless = () if plan.checkpoint is not None else ("stopped",)
        if plan.checkpoint is not None:
            lifecycle_fields["stop_requested"] = None
        taken = patiently(
            store.take_over,
            run_id,
            unless,
            ended=None,
            error=None,
            final=None,
            diverged_step=None,
            **lifecycle_fields,
        )
        if not taken:
            print(f"blockviz: run {run_id} was stopped before it started", flush=True)
            return EXIT_OK
        if args.name and not args.resume:
            patiently(store.rename_run, run_id, args.name)
    name = store.get_run(run_id).name
    run_dir = store.run_dir(run_id)
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        if plan.checkpoint is None:  # trained alone from the start: no longer a replica
            (run_dir / replicas.BATCH_FILE).unlink(missing_ok=True)
        atomic_write(run_dir / "config.json", config.to_json())
        atomic_write(run_dir / "vocab.json", vocab.to_json())
    except OSError as exc:
        return _record_failure(store, run_id, name, exc)
    os.environ[ENV_RUN_DIR] = str(run_dir)
    os.environ[ENV_LEGACY_EVAL] = "1" if plan.legacy_eval else "0"
    handler = open_log(run_dir)
    verb = f"resuming from step {plan.start_step}" if plan.checkpoint else "started"
    if plan.parent_id is not None:
        verb = f"{plan.fork_kind} of run {plan.parent_id} from step {plan.start_step}"
    if plan.finishing:
        verb = (
            f"finishing: its last checkpoint is at max_steps ({plan.start_step}), no step to train"
        )
    print(f"blockviz: run {run_id} ({name}) {verb}; store {store.where}", flush=True)
    log.info("run %s (%s) %s with config %s", run_id, name, verb, config.to_json(indent=None))
    if plan.checkpoint is not None:
        _continue_series(store, run_id, plan)

    try:
        if not wait_for_slot(store, run_id, args.max_running, stop):
            patiently(store.update_run, run_id, status="stopped", ended=time.time())
            print(f"blockviz: run {run_id} ({name}) stopped while queued", flush=True)
            return EXIT_OK
        startup_trace.mark("slot claimed")
        # Backdated by the earlier sessions' time, so started..ended spans all the training.
        started = time.time() - earlier_s

        def on_ready(trainer: Any, lit: Any) -> None:
            startup_trace.mark("model and Trainer built")
            patiently(
                store.update_run,
                run_id,
                status="running",
                started=started,
                device=describe_device(trainer),
                precision=str(trainer.precision),
                n_params=lit.model.n_params(),
                step=plan.start_step,
            )

        try:
            outcome, trainer, lit = fit(
                plan, datamodule, run_dir, stop, store, run_id, not args.no_progress, on_ready
            )
        except Exception as exc:
            return _record_failure(store, run_id, name, exc)
        except BaseException as exc:  # KeyboardInterrupt outside our handlers, SystemExit
            _record_failure(store, run_id, name, exc)
            raise
        final = final_metrics(lit, trainer, outcome)
        final["time_s"] = round(float(final["time_s"] or 0.0) + earlier_s, 3)
        if plan.finishing:  # nothing trained in this session: its training figures are earlier
            final["train_loss"] = earlier.get("train_loss")
            final["tokens_per_sec"] = earlier.get("tokens_per_sec")
        patiently(
            store.update_run,
            run_id,
            status=outcome.status,
            ended=time.time(),
            step=outcome.step,
            final=final,
            diverged_step=outcome.step if outcome.status == "diverged" else None,
        )
        store.flush()
        summary = summary_text(final)
        where = f" at step {outcome.step}" if outcome.status in ("diverged", "stopped") else ""
        print(f"blockviz: run {run_id} ({name}) {outcome.status}{where}: {summary}", flush=True)
        log.info("run %s %s%s: %s", run_id, outcome.status, where, json.dumps(final))
        return outcome.exit_code
    finally:
        close_log(handler)


def _continue_series(store: RunStore, run_id: int, plan: RunPlan) -> None:
    """Before a resume: drop rows logged after the checkpoint, restore rows it carried."""
    dropped = patiently(store.truncate_after, run_id, plan.start_step)
    restored = store.restore_rows(run_id, plan.pending_rows) if plan.pending_rows else 0
    log.info(
        "resuming at step %s: dropped %s rows logged after the checkpoint, restored %s rows "
        "it carried",
        plan.start_step,
        dropped,
        restored,
    )
    first = plan.config.train.max_steps
    schedule = plan.config.train.lr_schedule
    if plan.schedule_steps and plan.schedule_steps != first and schedule != "constant":
        note = (
            f"the {schedule} lr schedule keeps its horizon of {plan.schedule_steps} steps: "
            "lr reaches min_lr there and stays at it"
        )
        print(f"blockviz: run {run_id}: {note}", flush=True)
        log.info(note)


def wait_for_slot(store: RunStore, run_id: int, max_running: int, stop: StopRequest) -> bool:
    """Wait as 'queued' until fewer than max_running runs run; False if stopped meanwhile."""
    announced = False
    while not stop.requested:
        me = procs.identity_of()
        if patiently(
            store.claim_slot,
            run_id,
            max_running,
            pid=os.getpid(),
            pid_started=me.started if me else None,
        ):
            return True
        if not patiently(store.queued_still, run_id):
            return False  # stopped while it waited (its Stop could not signal it)
        if not announced:
            print(
                f"blockviz: run {run_id} queued: {max_running} run(s) already running", flush=True
            )
            announced = True
        store.heartbeat(run_id, 0)
        time.sleep(QUEUE_POLL_S)
    return False


def _record_failure(store: RunStore, run_id: int, name: str, exc: BaseException) -> int:
    """Status failed with a one-line error; the traceback goes to train.log."""
    message = f"{type(exc).__name__}: {exc}".strip()
    log.error("run %s failed:\n%s", run_id, "".join(traceback.format_exception(exc)))
    with contextlib.suppress(StoreError):
        store.flush()  # what can still be written, so the step below matches the rows
    try:
        patiently(store.update_run, run_id, status="failed", ended=time.time(), error=message)
        store.settle_step(run_id)
    except StoreError as store_exc:
        log.error("could not record the failure: %s", store_exc)
    return failure_exit(exc, f"run {run_id} ({name})", message)


def failure_exit(exc: BaseException, what: str, message: str) -> int:
    """Print the one line a failed run ends with; its exit status (2 for a bad config or
    dataset, 1 otherwise)."""
    if isinstance(exc, (DataError, cfg.ConfigError)):
        print(f"blockviz train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"blockviz: {what} failed: {message} (traceback in train.log)", file=sys.stderr)
    return EXIT_FAILED
