"""The one lifecycle of a plan in the store (rank 0 only), for one run and for K replicas
alike: register its runs (create them, take over the runner's or a worker's rows, or
resume them), write their config and vocab, open their train.logs, wait as 'queued' for a
slot, fit (`fit.fit`: one run, or replicas of one batched model), and
record how each ended (its status, step and final metrics, or the failure, with the
traceback in train.log). Before a resume, the rows logged after the checkpoint are
dropped and the ones it carried restored.

A batch's members each have a run folder with `replicas.json` (`core.replicas.BATCH_FILE`)
naming the batch; the batch's checkpoints are in a folder of its own
(`core.replicas.batch_folder`), so deleting any member leaves the others resumable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockviz.core import procs, replicas, spec, startup_trace
from blockviz.core.fields import ConfigError
from blockviz.core.files import atomic_write
from blockviz.core.plans import Plan
from blockviz.core.requests import Session
from blockviz.core.spec import ACTIVE_STATUSES, EVAL_SCALARS
from blockviz.core.vocab import DataError
from blockviz.store import RunStore, StoreError
from blockviz.training.final_metrics import final_metrics, recorded_training
from blockviz.training.fit import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Outcome,
    describe_device,
    fit,
)
from blockviz.training.lifecycle import StopRequest, patiently
from blockviz.training.logger import FLUSH_EVERY_S
from blockviz.training.run_log import close_log, open_log

QUEUE_POLL_S = 1.0
# Set by rank 0 before fit so the ranks Lightning launches find the run's files, and
# score on the same windows (a resumed run recorded before the evaluation set).
ENV_RUN_DIR = "BLOCKVIZ_RUN_DIR"
ENV_LEGACY_EVAL = "BLOCKVIZ_LEGACY_EVAL"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ran:
    """How a plan ended: the exit status, and the runs it trained (by member)."""

    exit_code: int
    run_ids: tuple[int, ...] = ()


@dataclass
class _Member:
    """A member as it is registered: its run, folder and the earlier sessions' figures."""

    run_id: int
    name: str
    run_dir: Path
    earlier: dict[str, Any]  # final metrics of the sessions before this one (resume)
    training: bool = True

    @property
    def earlier_s(self) -> float:
        return float(self.earlier.get("time_s") or 0.0)


@contextlib.contextmanager
def writer_store(session: Session, create: bool) -> Iterator[RunStore]:
    """The store as a training run writes it: buffered, and patient with a locked file.
    Only a command that creates its runs may create the file (a missing one is an error
    for a resume, the runner's run or a worker's, not a new empty store)."""
    store = RunStore(
        session.store, flush_seconds=FLUSH_EVERY_S, defer_when_busy=True, create=create
    )
    try:
        yield store
    finally:
        try:
            store.close()
        except StoreError as exc:  # a last flush that fails (a full disk)
            if str(exc) not in _STORE_FAILURES_SAID:  # else the run's failure line said it
                log.error("closing the run store: %s", exc)


def run_plan(plan: Plan, datamodule: Any, store: RunStore, session: Session) -> Ran:
    """Register the plan's runs, wait for a slot, fit, and record each one's end; a failure
    fails every member that trains and has not recorded its end."""
    # Installed before the runs exist, so no signal can leave one 'queued' forever.
    with StopRequest() as stop:
        plan = plan.with_vocab(datamodule.vocab.size)
        members = [_register(store, plan, index, datamodule) for index in range(len(plan.members))]
        ids = tuple(m.run_id for m in members)
        ended = {index for index, member in enumerate(members) if not member.training}
        if len(ended) == len(members):
            return Ran(EXIT_OK, ids)
        # The plan as registered: each member's run, those that do not train masked out,
        # and a new batch's folder of its own.
        registered = tuple(
            dataclasses.replace(planned, run_id=m.run_id, name=m.name, finished=not m.training)
            for planned, m in zip(plan.members, members, strict=True)
        )
        batch_dir = plan.batch_dir
        if plan.batch and batch_dir is None:
            batch_dir = replicas.batch_folder(members[0].run_dir, ids[0])
        plan = dataclasses.replace(plan, members=registered, batch_dir=batch_dir)
        handlers = []
        try:
            for index, member in enumerate(members):
                if member.training:
                    _write_files(plan, index, member, ids, datamodule)
                    handlers.append(open_log(member.run_dir))
            return Ran(_start(plan, datamodule, store, session, stop, members, ended), ids)
        except Exception as exc:
            return Ran(_record_failure(store, _unrecorded(members, ended), exc), ids)
        except BaseException as exc:  # KeyboardInterrupt outside our handlers, SystemExit
            _record_failure(store, _unrecorded(members, ended), exc)
            raise
        finally:
            for handler in handlers:
                close_log(handler)


def _register(store: RunStore, plan: Plan, index: int, datamodule: Any) -> _Member:
    """Create member `index`'s run, or take over its row ('queued', this process); a run
    stopped before this process registered stays stopped and does not train."""
    member = plan.members[index]
    config = member.config
    if member.finished:
        return _Member(int(member.run_id), member.name, store.run_dir(member.run_id), {}, False)
    me = procs.identity_of()
    fields = {
        "status": "queued",
        "pid": os.getpid(),
        "pid_started": me.started if me else None,
        "max_steps": config.train.max_steps,
        "dataset": datamodule.fingerprint,
    }
    if member.run_id is None:
        fork = plan.fork
        if fork is not None:
            fields.update(parent_id=fork.parent_id, fork_step=plan.start_step)
            fields.update(fork_kind=fork.kind, fork_info=dict(fork.info))
        run_id = patiently(store.create_run, member.name, config.to_json(), **fields)
        if fork is not None:
            patiently(store.copy_history, fork.parent_id, run_id, plan.start_step, EVAL_SCALARS)
        # The name as stored (sanitized, made unique): the one `show NAME` finds.
        return _Member(run_id, store.get_run(run_id).name, store.run_dir(run_id), {})
    run_id = int(member.run_id)
    earlier: dict[str, Any] = {}
    if plan.checkpoint is not None:  # a resumed run's time so far counts on
        earlier = store.get_run(run_id).final or {}
        if plan.finishing and not earlier:  # killed before it wrote them: from its rows
            earlier = recorded_training(store, run_id)
        fields["stop_requested"] = None  # a Stop asked before the resume is spent
    # A run the runner or a worker created and someone stopped before this process
    # registered stays stopped (a resume takes over its stopped run on purpose).
    unless = () if plan.checkpoint is not None else ("stopped",)
    clear = {"ended": None, "error": None, "final": None, "diverged_step": None}
    taken = patiently(store.take_over, run_id, unless, config=config.to_json(), **clear, **fields)
    if not taken:
        print(f"blockviz: run {run_id} was stopped before it started", flush=True)
        return _Member(run_id, member.name, store.run_dir(run_id), {}, False)
    if store.get_run(run_id).name != member.name:  # `--run_id N --name NAME`
        patiently(store.rename_run, run_id, member.name)
    return _Member(run_id, member.name, store.run_dir(run_id), earlier)


def _write_files(
    plan: Plan, index: int, member: _Member, ids: tuple[int, ...], datamodule: Any
) -> None:
    """A training member's folder: config.json, vocab.json and, in a new batch, its batch
    file (a run trained alone from the start is no longer a replica)."""
    run_dir = member.run_dir
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    if plan.checkpoint is None and plan.batch:
        replicas.write_batch_file(run_dir, ids, index, batch=int(plan.batch_dir.name))
    elif plan.checkpoint is None:
        (run_dir / replicas.BATCH_FILE).unlink(missing_ok=True)
    atomic_write(run_dir / "config.json", plan.members[index].config.to_json())
    atomic_write(run_dir / "vocab.json", datamodule.vocab.to_json())


def _start(
    plan: Plan,
    datamodule: Any,
    store: RunStore,
    session: Session,
    stop: StopRequest,
    members: list[_Member],
    ended: set[int],
) -> int:
    """The registered plan's start (its first line, a resume's series continued), its wait
    for a slot and its fit (one run, or replicas of one batched model), each member's end
    recorded (into `ended`) as it comes. The exit status."""
    training = [m for m in members if m.training]
    started = plan.start_text()  # its first line: printed, and in train.log with its config
    print(f"blockviz: {started}; store {store.where}", flush=True)
    log.info("%s with config %s", started, plan.config.to_json(indent=None))
    for member, planned in zip(members, plan.members, strict=True):
        if member.training and plan.checkpoint is not None:
            # A resume: drop the rows logged after the checkpoint, restore the rows it carried.
            dropped = patiently(store.truncate_after, member.run_id, plan.start_step)
            rows = planned.pending_rows
            restored = store.restore_rows(member.run_id, rows) if rows else 0
            log.info(
                f"run {member.run_id} resuming at step {plan.start_step}: dropped {dropped} "
                f"rows logged after the checkpoint, restored {restored} rows it carried"
            )
    note = plan.horizon_note()
    if note is not None:
        print(f"blockviz: run {training[0].run_id}: {note}", flush=True)
        log.info(note)
    if not wait_for_slot(store, training[0].run_id, session.max_running, stop):
        for member in training:
            patiently(store.update_run, member.run_id, status="stopped", ended=time.time())
            what = f"run {member.run_id} ({member.name})"
            print(f"blockviz: {what} stopped while queued", flush=True)
        return EXIT_OK
    startup_trace.mark("slot claimed")
    if not plan.batch:
        os.environ[ENV_RUN_DIR] = str(members[0].run_dir)
        os.environ[ENV_LEGACY_EVAL] = "1" if plan.legacy_eval else "0"

    def on_ready(trainer: Any, lit: Any) -> None:
        startup_trace.mark("model and Trainer built")
        device = describe_device(trainer)
        if plan.batch:
            device += f", {len(members)} replicas"
        for member in training:
            # Backdated by the earlier sessions' time, so started..ended spans it all.
            patiently(
                store.update_run,
                member.run_id,
                status="running",
                started=time.time() - member.earlier_s,
                device=device,
                precision=str(trainer.precision),
                n_params=lit.n_params(),
                step=plan.start_step,
            )

    def record(index: int, outcome: Outcome, lit: Any, trainer: Any) -> None:
        final = final_metrics(lit, trainer, outcome, index)
        _record_end(store, plan, members[index], outcome, final)
        ended.add(index)

    ids = [m.run_id for m in members]
    dirs = [m.run_dir for m in members]
    fit(plan, datamodule, dirs, ids, store, stop, session.progress, on_ready, record)
    store.flush()
    return EXIT_OK


def _unrecorded(members: list[_Member], ended: set[int]) -> list[_Member]:
    return [m for index, m in enumerate(members) if index not in ended]


def _record_end(
    store: RunStore, plan: Plan, member: _Member, outcome: Outcome, final: dict[str, Any]
) -> None:
    """A member's status, step and final metrics, and its one printed line."""
    final["time_s"] = round(float(final["time_s"] or 0.0) + member.earlier_s, 3)
    if plan.finishing:  # nothing trained in this session: its training figures are earlier
        final["train_loss"] = member.earlier.get("train_loss")
        final["tokens_per_sec"] = member.earlier.get("tokens_per_sec")
    patiently(
        store.update_run,
        member.run_id,
        status=outcome.status,
        ended=time.time(),
        step=outcome.step,
        final=final,
        diverged_step=outcome.step if outcome.status == "diverged" else None,
    )
    where = f" at step {outcome.step}" if outcome.status in ("diverged", "stopped") else ""
    what = f"run {member.run_id} ({member.name}) {outcome.status}{where}"
    print(f"blockviz: {what}: {spec.final_text(final)}", flush=True)
    log.info("%s: %s", what, json.dumps(final))


def fail_runs(store: RunStore, run_ids: list[int], message: str) -> None:
    """Runs that could not start (a bad config or dataset) or that a failure ended: failed
    with the one-line message and their step settled on their rows, unless they ended
    already; a store that cannot record it is logged."""
    for run_id in run_ids:
        try:
            if store.get_run(run_id).status in ACTIVE_STATUSES:
                patiently(
                    store.update_run, run_id, status="failed", ended=time.time(), error=message
                )
                store.settle_step(run_id)
        except StoreError as exc:
            log.error("could not record the failure: %s", exc)


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


# The store errors a run's failure line has printed in this process: closing the store
# after such a failure fails the same way, and need not say it a second time.
_STORE_FAILURES_SAID: set[str] = set()


def _record_failure(store: RunStore, members: list[_Member], exc: BaseException) -> int:
    """The members still active end failed with a one-line error (the traceback goes to
    train.log); the exit status (2 for a bad config or dataset, 1 otherwise)."""
    message = f"{type(exc).__name__}: {exc}".strip()
    log.error("failed:\n%s", "".join(traceback.format_exception(exc)))
    with contextlib.suppress(StoreError):
        store.flush()  # what can still be written, so the step below matches the rows
    fail_runs(store, [m.run_id for m in members], message)
    what = ", ".join(f"{m.run_id} ({m.name})" for m in members)
    if isinstance(exc, (DataError, ConfigError)):
        print(f"blockviz train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    plural = "s" if len(members) > 1 else ""
    if isinstance(exc, StoreError):
        _STORE_FAILURES_SAID.add(str(exc))
    print(
        f"blockviz: run{plural} {what} failed: {message} (traceback in train.log)", file=sys.stderr
    )
    return EXIT_FAILED
