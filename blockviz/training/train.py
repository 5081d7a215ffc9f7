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

The parts live beside this module: `plan` (what to run), `lifecycle` (signals,
heartbeat, patience, rank), `logger` (the store as Lightning's logger and callback).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from blockviz.core import config as cfg
from blockviz.core import hardware, procs, startup_trace
from blockviz.core.extras import check_logger_available
from blockviz.core.files import atomic_write
from blockviz.core.flags import UsageError, check_threads, run_config_from_args
from blockviz.core.spec import (
    TRAIN_ELAPSED_S,
    TRAIN_LOSS,
    TRAIN_STEP_TIME,
    TRAIN_TOKENS_PER_SEC,
    VAL_ANSWER_ACC,
    VAL_ANSWER_BASELINE,
    VAL_BPC,
    VAL_LOSS,
    VAL_PPL,
    final_header,
)
from blockviz.core.vocab import DataError
from blockviz.store import RunStore, StoreError
from blockviz.training.callbacks import ConsoleProgress, TrainingDiverged
from blockviz.training.lifecycle import Heartbeat, StopRequest, global_rank_from_env, patiently
from blockviz.training.lit import LitCharModel
from blockviz.training.logger import FLUSH_EVERY_S, RunLifecycle, StoreLogger
from blockviz.training.plan import RunPlan, check_memory, load_datamodule, plan_new, plan_resume
from blockviz.training.probes import BlockProbe
from blockviz.training.sinks import LoggerSink, StoreSink
from blockviz.training.trainer import (
    make_trainer,
    quiet_lightning,
    release_lightning_log,
    run_loggers,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
QUEUE_POLL_S = 1.0
# Set by rank 0 before fit so the ranks Lightning launches find the run's files, and
# score on the same windows (a resumed run recorded before the evaluation set).
ENV_RUN_DIR = "BLOCKVIZ_RUN_DIR"
ENV_LEGACY_EVAL = "BLOCKVIZ_LEGACY_EVAL"

log = logging.getLogger(__name__)


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


def apply_threads(requested: int | None, max_running: int) -> int:
    """Give torch `requested` CPU threads, else this run's share of the cores; how many."""
    check_threads(requested)
    threads = requested or hardware.default_threads(max(0, int(max_running or 0)))
    torch.set_num_threads(threads)
    return threads


def set_threads(args: argparse.Namespace) -> int:
    """`apply_threads` for the `train` command's `--threads` and `--max_running`."""
    return apply_threads(getattr(args, "threads", None), args.max_running)


# ---------------------------------------------------------------------------- training


@dataclass
class Outcome:
    """How a fit ended."""

    status: str
    step: int
    error: str | None = None
    exit_code: int = EXIT_OK


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _fit(
    plan: RunPlan,
    datamodule: Any,
    run_dir: Path,
    stop: StopRequest,
    store: RunStore | None,
    run_id: int | None,
    progress: bool,
    on_ready: Any = None,
) -> tuple[Outcome, Any, Any]:
    """Build model, callbacks and Trainer and fit; every rank runs this the same way."""
    config = plan.config
    train = config.train
    # Rank 0 also writes TensorBoard / CSV files into run_dir when --logger asks.
    resume_step = plan.start_step if plan.checkpoint is not None else None
    extra_loggers = run_loggers(train, run_dir, resume_step) if store is not None else []
    L.seed_everything(train.seed, workers=False, verbose=False)
    lit = LitCharModel(
        config.to_dict(), datamodule.vocab.to_json(), schedule_steps=plan.schedule_steps
    )
    heartbeat = Heartbeat(store, run_id) if store is not None else None
    lifecycle = RunLifecycle(stop, heartbeat, store, run_id)
    callbacks: list[Any] = [lifecycle]
    probe: BlockProbe | None = None
    if store is not None:
        sinks: list[Any] = [StoreSink(store, run_id)]
        if extra_loggers:
            sinks.append(LoggerSink(extra_loggers))
        probe = BlockProbe(
            sinks,
            probe_interval=train.probe_interval,
            sample_interval=train.sample_interval,
            prompt=_sample_prompt(datamodule),
        )
        callbacks.append(probe)
    if progress:
        callbacks.append(ConsoleProgress())
    loggers = [StoreLogger(store, run_id), *extra_loggers] if store is not None else None
    trainer = make_trainer(config, callbacks, loggers, run_dir)
    if on_ready is not None:
        on_ready(trainer, lit)
    if heartbeat is not None:
        heartbeat.step = plan.start_step
        heartbeat.start()
    try:
        if stop.requested:
            return Outcome("stopped", plan.start_step), trainer, lit
        trainer.fit(lit, datamodule=datamodule, ckpt_path=plan.checkpoint, weights_only=True)
        step = trainer.global_step
        if plan.finishing and probe is not None:
            # Lightning skips the whole loop of a fit restored at max_steps, on_train_end
            # with it: the end's text sample and attention map are written here instead.
            probe.on_train_end(trainer, lit)
        if step < train.max_steps:  # ended early without an exception (on_train_end saved)
            return Outcome("stopped", step), trainer, lit
        if lit.last_val.get("step") != step:
            trainer.validate(lit, datamodule=datamodule, verbose=False, weights_only=True)
        return Outcome("completed", step), trainer, lit
    except TrainingDiverged as exc:
        return Outcome("diverged", exc.step), trainer, lit
    except SIGTERMException:
        step = lifecycle.stopped_at or trainer.global_step
        if step and step % train.eval_interval == 0 and lit.last_val.get("step") != step:
            # The stop interrupted this step's evaluation: finish it, so the resumed run
            # (which starts after the evaluation) does not miss the point for good.
            with contextlib.suppress(SIGTERMException):
                trainer.validate(lit, datamodule=datamodule, verbose=False, weights_only=True)
        return Outcome("stopped", step), trainer, lit
    finally:
        if heartbeat is not None:
            heartbeat.stop()


def _sample_prompt(datamodule: Any) -> str:
    """The fixed prompt of text samples: a newline, or the text's first character."""
    return "\n" if "\n" in datamodule.vocab else datamodule.corpus.text[0]


def _final_metrics(lit: Any, trainer: Any, outcome: Outcome) -> dict[str, float | int | None]:
    from blockviz.training.callbacks import training_monitor

    monitor = training_monitor(trainer)
    return {
        "train_loss": _finite_or_none(monitor.recent_train_loss()),
        "val_loss": _finite_or_none(lit.last_val.get(VAL_LOSS)),
        "val_ppl": _finite_or_none(lit.last_val.get(VAL_PPL)),
        "val_bpc": _finite_or_none(lit.last_val.get(VAL_BPC)),
        "answer_acc": _finite_or_none(lit.last_val.get(VAL_ANSWER_ACC)),
        "answer_baseline": _finite_or_none(lit.last_val.get(VAL_ANSWER_BASELINE)),
        "time_s": round(monitor.wall_time_s(), 3),  # training wall time, evaluations included
        "tokens_per_sec": monitor.tokens_per_sec(),  # while training, evaluations excluded
        "steps": outcome.step,
    }


def _recorded_training(store: RunStore, run_id: int) -> dict[str, float | None]:
    """train_loss, time_s and tokens_per_sec as `_final_metrics` has them, from the run's
    train/* rows: for a run that died after its last step, before it recorded them.

    Each row is the mean of the steps since the row before it, so rows are weighted by the
    steps they cover; time_s is the last session's wall clock at its last step.
    """
    from blockviz.training.callbacks import RECENT_LOSSES

    names = [TRAIN_LOSS, TRAIN_STEP_TIME, TRAIN_TOKENS_PER_SEC, TRAIN_ELAPSED_S]
    frame = store.scalars(run_id, names=names)
    series = {
        name: dict(zip(rows["step"], rows["value"], strict=True))
        for name, rows in frame.groupby("name")
    }
    loss = series.get(TRAIN_LOSS, {})
    if not loss:
        return {}
    steps = sorted(loss)
    covered = {step: step - before for before, step in zip([-1, *steps[:-1]], steps, strict=True)}
    start = steps[-1] - RECENT_LOSSES  # the window: the last RECENT_LOSSES steps
    weights = {step: min(covered[step], step - start) for step in steps if step > start}
    step_time, rate = series.get(TRAIN_STEP_TIME, {}), series.get(TRAIN_TOKENS_PER_SEC, {})
    timed = [step for step in step_time if step in rate and step in covered]
    seconds = sum(step_time[step] * covered[step] for step in timed)
    tokens = sum(rate[step] * step_time[step] * covered[step] for step in timed)
    elapsed = series.get(TRAIN_ELAPSED_S, {})
    return {
        "train_loss": _finite_or_none(
            sum(loss[step] * w for step, w in weights.items()) / sum(weights.values())
        ),
        "time_s": elapsed[max(elapsed)] if elapsed else None,
        "tokens_per_sec": _finite_or_none(tokens / seconds) if seconds > 0 else None,
    }


# "blockviz.training" covers every module of the package (lifecycle, logger, plan, ...).
_LOG_TARGETS = ("blockviz.training", "blockviz.store", "py.warnings")


class RunLogHandler(logging.FileHandler):
    """train.log; when it cannot be written (a full disk) it drops lines without a word.

    logging's default prints a traceback to stderr for every line it cannot write
    (hundreds on a full disk); the run's one-line outcome says what happened instead.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8")
        self.write_error: str | None = None

    def handleError(self, record: logging.LogRecord) -> None:
        """Remember the first error; print nothing."""
        if self.write_error is None:
            exc = sys.exc_info()[1]
            self.write_error = getattr(exc, "strerror", None) or str(exc) or "write failed"


def _open_log(run_dir: Path) -> logging.Handler:
    """Route our log, Lightning's messages and Python warnings into <run_dir>/train.log."""
    handler = RunLogHandler(run_dir / "train.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    quiet_lightning(handler)
    logging.captureWarnings(True)
    for name in _LOG_TARGETS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return handler


def _close_log(handler: logging.Handler) -> None:
    release_lightning_log(handler)
    for name in _LOG_TARGETS:
        logging.getLogger(name).removeHandler(handler)
    logging.captureWarnings(False)
    with contextlib.suppress(OSError):  # a full disk cannot take the last buffered lines
        handler.close()


def cli_main(args: argparse.Namespace) -> int:
    """`python -m blockviz train`: one run, recorded into the store; prints its id."""
    if args.max_running < 0:
        raise UsageError(f"--max_running: {args.max_running} is not allowed; must be >= 0")
    set_threads(args)
    if global_rank_from_env() != 0:
        return _follower_main(args)
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
        return _run(args, store, plan, datamodule)
    finally:
        _close_quietly(store)


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


def _run(args: argparse.Namespace, store: RunStore, plan: RunPlan, datamodule: Any) -> int:
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
    """The body of `_run`, with the stop handlers already in place."""
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
        run_id = patiently(
            store.create_run, plan.name, lifecycle_fields.pop("config"), **lifecycle_fields
        )
    else:
        run_id = plan.run_id
        if plan.checkpoint is not None:  # a resumed run's time so far counts on
            earlier = store.get_run(run_id).final or {}
            if plan.finishing and not earlier:  # killed before it wrote them: from its rows
                earlier = _recorded_training(store, run_id)
            earlier_s = float(earlier.get("time_s") or 0.0)
        # A run the runner created and someone stopped before this process registered
        # stays stopped (a resume takes over its stopped run on purpose).
        unless = () if plan.checkpoint is not None else ("stopped",)
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
        atomic_write(run_dir / "config.json", config.to_json())
        atomic_write(run_dir / "vocab.json", vocab.to_json())
    except OSError as exc:
        return _record_failure(store, run_id, name, exc)
    os.environ[ENV_RUN_DIR] = str(run_dir)
    os.environ[ENV_LEGACY_EVAL] = "1" if plan.legacy_eval else "0"
    handler = _open_log(run_dir)
    verb = f"resuming from step {plan.start_step}" if plan.checkpoint else "started"
    if plan.finishing:
        verb = (
            f"finishing: its last checkpoint is at max_steps ({plan.start_step}), no step to train"
        )
    print(f"blockviz: run {run_id} ({name}) {verb}; store {store.path}", flush=True)
    log.info("run %s (%s) %s with config %s", run_id, name, verb, config.to_json(indent=None))
    if plan.checkpoint is not None:
        _continue_series(store, run_id, plan)

    try:
        if not _wait_for_slot(store, run_id, args.max_running, stop):
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
            outcome, trainer, lit = _fit(
                plan, datamodule, run_dir, stop, store, run_id, not args.no_progress, on_ready
            )
        except Exception as exc:
            return _record_failure(store, run_id, name, exc)
        except BaseException as exc:  # KeyboardInterrupt outside our handlers, SystemExit
            _record_failure(store, run_id, name, exc)
            raise
        final = _final_metrics(lit, trainer, outcome)
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
        # The labels every view gives these metrics (`show`, Compare, the report).
        summary = ", ".join(
            f"{final_header(key)} = {value:.4g}"
            if isinstance(value, float)
            else f"{final_header(key)} = {value}"
            for key, value in final.items()
            if value is not None
        )
        where = f" at step {outcome.step}" if outcome.status in ("diverged", "stopped") else ""
        print(f"blockviz: run {run_id} ({name}) {outcome.status}{where}: {summary}", flush=True)
        log.info("run %s %s%s: %s", run_id, outcome.status, where, json.dumps(final))
        return outcome.exit_code
    finally:
        _close_log(handler)


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


def _wait_for_slot(store: RunStore, run_id: int, max_running: int, stop: StopRequest) -> bool:
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
    if isinstance(exc, (DataError, cfg.ConfigError)):
        print(f"blockviz train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(
        f"blockviz: run {run_id} ({name}) failed: {message} (traceback in train.log)",
        file=sys.stderr,
    )
    return EXIT_FAILED


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
    datamodule = load_datamodule(config, os.environ.get(ENV_LEGACY_EVAL) == "1")
    plan.config = cfg.replace(config, vocab_size=datamodule.vocab.size).validate()
    stop = StopRequest()
    stop.install()
    try:
        outcome, _, _ = _fit(plan, datamodule, run_dir, stop, None, None, progress=False)
    finally:
        stop.uninstall()
    return outcome.exit_code
