"""Headless training runs: the run lifecycle around `Trainer.fit`, and the run commands.

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
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from blockviz.core import config as cfg
from blockviz.core import procs
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.store import RunStore, StoreError, StoreLocked, checked

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
HEARTBEAT_S = 2.0
QUEUE_POLL_S = 1.0
FLUSH_EVERY_S = 1.0
# How long a lifecycle write (status, start, end) keeps retrying a locked store before
# the run gives up; its metric rows meanwhile wait in memory (RunStore.defer_when_busy).
LIFECYCLE_PATIENCE_S = 600.0
PENDING_ROWS_KEY = "blockviz_pending_rows"  # checkpoint entry: rows the store had not taken
# Set by rank 0 before fit so the ranks Lightning launches find the run's files.
ENV_RUN_DIR = "BLOCKVIZ_RUN_DIR"
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
)

log = logging.getLogger("blockviz.training.train")

# ---------------------------------------------------------------------- lifecycle parts


class StopRequest:
    """SIGTERM / SIGINT handlers that ask the run to stop after the current step.

    Outside `Trainer.fit` this flag is all there is; during fit Lightning chains its own
    SIGTERM handler in front of ours and stops the loop itself. Ctrl-C takes the same path
    as SIGTERM instead of Lightning's KeyboardInterrupt exit (status 1, no checkpoint).
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Install the handlers (main thread only; elsewhere signals cannot be caught)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in (
            (signal.SIGTERM, self._on_sigterm),
            (signal.SIGINT, self._on_sigint),
        ):
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, handler)

    def uninstall(self) -> None:
        """Restore the handlers that were there before."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        # Whatever handles SIGTERM right now (ours, or Lightning's chain during fit).
        handler = signal.getsignal(signal.SIGTERM)
        if callable(handler):
            handler(signal.SIGTERM, frame)
        else:
            self.requested = True


class Heartbeat:
    """A daemon thread that beats the run's heartbeat (and so flushes the store) every few s."""

    def __init__(self, store: RunStore, run_id: int, interval_s: float = HEARTBEAT_S) -> None:
        self.store = store
        self.run_id = run_id
        self.interval_s = interval_s
        self.step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="blockviz-heartbeat", daemon=True)

    def start(self) -> None:
        """Beat now and then every interval."""
        self.store.heartbeat(self.run_id, self.step)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (waits for the thread)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.store.heartbeat(self.run_id, self.step)
            except StoreError as exc:  # a busy store must not kill training; try again
                log.warning("heartbeat failed: %s", exc)


def patiently(action: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a store write, retrying while another process holds the store's lock."""
    waiting_since: float | None = None
    while True:
        try:
            return action(*args, **kwargs)
        except StoreLocked:
            now = time.monotonic()
            if waiting_since is None:
                waiting_since = now
                log.warning("the run store is locked by another process; waiting to write")
            elif now - waiting_since > LIFECYCLE_PATIENCE_S:
                raise
            time.sleep(0.5)


# StoreLogger and RunLifecycle subclass Lightning classes. They are defined on first use
# (and reached as module attributes through __getattr__), so `runs`, `show` and `stop`,
# which import this module too, never pay the seconds Lightning takes to import.
_LIGHTNING_CLASSES = ("StoreLogger", "RunLifecycle")


def __getattr__(name: str) -> Any:
    if name in _LIGHTNING_CLASSES:
        return lightning_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def lightning_classes() -> dict[str, type]:
    """{"StoreLogger": ..., "RunLifecycle": ...}, defined once Lightning is imported."""
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import Logger
    from lightning.pytorch.utilities import rank_zero_only
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    class StoreLogger(Logger):
        """A Lightning Logger buffering scalars into a RunStore, flushed about every second."""

        def __init__(
            self, store: RunStore, run_id: int, flush_every_s: float = FLUSH_EVERY_S
        ) -> None:
            super().__init__()
            self.store = store
            self.run_id = run_id
            self.flush_every_s = flush_every_s
            self._last_flush = time.monotonic()

        @property
        def name(self) -> str:
            """Logger name (Lightning shows it in paths it never creates here)."""
            return "blockviz"

        @property
        def version(self) -> int:
            """The run id."""
            return self.run_id

        @rank_zero_only
        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            """No-op: the run's config is already in the store and in config.json."""

        @rank_zero_only
        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            """Buffer one row per metric at `step`; flush when the last flush is old enough."""
            rows = [
                (step or 0, name, float(value))
                for name, value in metrics.items()
                if name not in ("epoch", "step")
            ]
            self.store.log_scalars(self.run_id, rows)
            self.save()

        @rank_zero_only
        def save(self) -> None:
            """Flush buffered rows if the last flush is older than `flush_every_s`."""
            now = time.monotonic()
            if now - self._last_flush >= self.flush_every_s:
                self._last_flush = now
                self.store.flush()

        @rank_zero_only
        def finalize(self, status: str) -> None:
            """Flush everything buffered."""
            self.store.flush()

    class RunLifecycle(Callback):
        """Heartbeat step, stop requests, and the store's rows made safe at each checkpoint."""

        def __init__(
            self,
            stop: StopRequest,
            heartbeat: Heartbeat | None,
            store: RunStore | None = None,
            run_id: int | None = None,
        ) -> None:
            self.stop = stop
            self.heartbeat = heartbeat
            self.store = store
            self.run_id = run_id
            self.stopped_at: int | None = None

        def on_save_checkpoint(
            self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]
        ) -> None:
            """Flush before the checkpoint exists; rows a locked store refused ride inside it.

            So a kill at any moment after a checkpoint at step S leaves every row up to S
            either in the store or in the checkpoint, and a resume from S loses none.
            """
            if self.store is None or self.run_id is None:
                return
            try:
                self.store.flush()
            except StoreError as exc:
                log.warning("flush before checkpoint failed: %s", exc)
            checkpoint[PENDING_ROWS_KEY] = self.store.buffered_rows(self.run_id)

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            """Record the step; turn a stop request Lightning missed into its own stop."""
            if self.heartbeat is not None:
                self.heartbeat.step = trainer.global_step
            if self.stop.requested and not trainer.received_sigterm:
                # The signal came before fit installed Lightning's handler (which resets it).
                raise SIGTERMException

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            """Remember where a stop interrupted fit (LastCheckpoint saved that step)."""
            if isinstance(exception, SIGTERMException):
                self.stopped_at = trainer.global_step

    return {"StoreLogger": StoreLogger, "RunLifecycle": RunLifecycle}


# --------------------------------------------------------------------------- planning


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


def default_run_name(config: cfg.RunConfig) -> str:
    """A readable name from what makes the config what it is, e.g. `pre-layernorm-4x128`."""
    model, train, data = config.model, config.train, config.data
    defaults = cfg.RunConfig()
    norm = (
        "no-norm" if model.norm_position == "none" else f"{model.norm_position}-{model.norm_type}"
    )
    parts = [norm, f"{model.n_layer}x{model.d_model}"]
    if not model.residual:
        parts.append("no-residual")
    if not model.attention:
        parts.append("ffn-only")
    if not model.ffn:
        parts.append("attention-only")
    if model.activation != defaults.model.activation:
        parts.append(model.activation)
    if model.init != defaults.model.init:
        parts.append(f"{model.init}-init")
    if train.lr != defaults.train.lr:
        parts.append(f"lr{train.lr:g}")
    if train.warmup_steps == 0:
        parts.append("no-warmup")
    if data.dataset != defaults.data.dataset:
        parts.append(Path(data.dataset).stem or data.dataset)
    return "-".join(parts)


def _plan_new(args: argparse.Namespace, store: RunStore | None) -> RunPlan:
    from blockviz.cli import UsageError, run_config_from_args

    config = run_config_from_args(args)
    name = args.name or default_run_name(config)
    if store is not None and args.run_id is not None:
        run = store.get_run(args.run_id)
        if run["status"] != "queued":
            raise UsageError(
                f"--run_id {args.run_id}: run {run['name']!r} is {run['status']}, not queued"
            )
        name = args.name or run["name"]
    return RunPlan(config=config, name=name, run_id=args.run_id)


def _plan_resume(args: argparse.Namespace, store: RunStore) -> RunPlan:
    from blockviz.cli import UsageError, config_overrides

    run = store.get_run(args.resume)
    run_id = int(run["id"])
    if run["status"] in ACTIVE_STATUSES and procs.is_alive(run["pid"], run.get("pid_started")):
        raise UsageError(
            f"--resume: run {run_id} ({run['name']}) is {run['status']}; stop it first"
        )
    run_dir = store.run_dir(run_id)
    try:
        config = cfg.RunConfig.from_json((run_dir / "config.json").read_text(encoding="utf-8"))
    except OSError:
        raise UsageError(f"--resume: run {run_id} has no {run_dir / 'config.json'}") from None
    overrides = config_overrides(args, list(cfg.SECTIONS))
    changed = sorted(set(overrides) - set(RESUMABLE_FIELDS))
    if changed:
        raise UsageError(
            f"--{changed[0]} cannot change on --resume (the run's maths is fixed); "
            f"allowed: {', '.join('--' + f for f in RESUMABLE_FIELDS)}"
        )
    if overrides:
        config = cfg.replace(config, **overrides).validate()
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    if not checkpoint.is_file():
        raise UsageError(f"--resume: run {run_id} has no checkpoint at {checkpoint}")
    state = read_checkpoint(checkpoint, f"--resume: run {run_id}'s checkpoint")
    start_step = state["global_step"]
    if start_step >= config.train.max_steps:
        raise UsageError(
            f"--resume: run {run_id} is already at step {start_step} of max_steps="
            f"{config.train.max_steps}; pass a larger --max_steps"
        )
    hparams = state["hyper_parameters"]
    first_max_steps = ((hparams.get("run_config") or {}).get("train") or {}).get("max_steps")
    horizon = hparams.get("schedule_steps") or first_max_steps or config.train.max_steps
    return RunPlan(
        config=config,
        name=run["name"],
        run_id=run_id,
        checkpoint=checkpoint,
        start_step=start_step,
        schedule_steps=int(horizon),
        pending_rows=state["pending_rows"],
    )


def read_checkpoint(path: Path, what: str) -> dict[str, Any]:
    """A checkpoint's step, hyperparameters and carried rows; UsageError naming the problem.

    Loaded with weights_only=True: a file holding anything but tensors and plain data is
    refused rather than executed.
    """
    import pickle

    import torch

    from blockviz.cli import UsageError

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
    }


def _global_rank_from_env() -> int:
    """This process's global rank as the launcher set it (0 when launched by a person)."""
    for key in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    node = int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0")) or 0)
    return 0 if local == 0 and node == 0 else max(1, local)


def check_memory(config: cfg.RunConfig) -> None:
    """Refuse (ConfigError, exit 2) a model whose training would not fit in memory.

    Compared with the memory the device has: the GPU's total memory for a CUDA run, the
    host's available memory otherwise (`params.estimate_memory` says what is counted).
    """
    import torch

    from blockviz.core import params

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
        estimate = params.check_fits(config, available)
        log.info("memory estimate %s of %s available", estimate.total, available)


def _datamodule(config: cfg.RunConfig) -> Any:
    from blockviz.core import corpora
    from blockviz.training.data import CharDataModule

    # A first use of Tiny Shakespeare downloads 1.1 MB: the percentage goes to the terminal,
    # or to the run's log when the dashboard launched it; nothing is printed otherwise.
    progress = corpora.DownloadProgress()
    train = config.train
    datamodule = CharDataModule(
        config.data,
        block_size=config.model.block_size,
        batch_size=train.batch_size,
        seed=train.seed,
        eval_iters=train.eval_iters,
        progress=progress,
    )
    try:
        datamodule.setup()
    finally:
        progress.finish()
    return datamodule


def describe_device(trainer: Any) -> str:
    """`cpu`, `cuda (NVIDIA H100 80GB HBM3)`, `2x cpu (ddp)`..."""
    import torch

    root = trainer.strategy.root_device
    text = root.type
    if root.type == "cuda":
        text = f"cuda ({torch.cuda.get_device_name(root)})"
    world = trainer.world_size
    if world > 1:
        text = (
            f"{world}x {text} ({type(trainer.strategy).__name__.removesuffix('Strategy').lower()})"
        )
    return text


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
    import lightning as L
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from blockviz.training.callbacks import ConsoleProgress, TrainingDiverged
    from blockviz.training.lit import LitCharModel
    from blockviz.training.probes import BlockProbe
    from blockviz.training.sinks import LoggerSink, StoreSink
    from blockviz.training.trainer import make_trainer, run_loggers

    classes = lightning_classes()
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
    lifecycle = classes["RunLifecycle"](stop, heartbeat, store, run_id)
    callbacks: list[Any] = [lifecycle]
    if store is not None:
        sinks: list[Any] = [StoreSink(store, run_id)]
        if extra_loggers:
            sinks.append(LoggerSink(extra_loggers))
        callbacks.append(
            BlockProbe(
                sinks,
                probe_interval=train.probe_interval,
                sample_interval=train.sample_interval,
                prompt=_sample_prompt(datamodule),
            )
        )
    if progress:
        callbacks.append(ConsoleProgress())
    loggers = [classes["StoreLogger"](store, run_id), *extra_loggers] if store is not None else None
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
        "val_loss": _finite_or_none(lit.last_val.get("val/loss")),
        "val_ppl": _finite_or_none(lit.last_val.get("val/ppl")),
        "val_bpc": _finite_or_none(lit.last_val.get("val/bpc")),
        "answer_acc": _finite_or_none(lit.last_val.get("val/answer_acc")),
        "time_s": round(monitor.wall_time_s(), 3),  # training wall time, evaluations included
        "tokens_per_sec": monitor.tokens_per_sec(),  # while training, evaluations excluded
        "steps": outcome.step,
    }


def _write_json(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


_LOG_TARGETS = ("blockviz.training.train", "blockviz.store", "py.warnings")


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
    from blockviz.training.trainer import quiet_lightning

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
    from blockviz.training.trainer import release_lightning_log

    release_lightning_log(handler)
    for name in _LOG_TARGETS:
        logging.getLogger(name).removeHandler(handler)
    logging.captureWarnings(False)
    with contextlib.suppress(OSError):  # a full disk cannot take the last buffered lines
        handler.close()


def cli_main(args: argparse.Namespace) -> int:
    """`python -m blockviz train`: one run, recorded into the store; prints its id."""
    if _global_rank_from_env() != 0:
        return _follower_main(args)
    from blockviz.cli import UsageError

    if args.max_running < 0:
        raise UsageError(f"--max_running: {args.max_running} is not allowed; must be >= 0")
    if args.resume is None and args.run_id is None:
        # A new run: a bad flag, config or dataset must not even create the store file.
        plan = _plan_new(args, None)
        datamodule = _datamodule(plan.config)
        check_memory(cfg.replace(plan.config, vocab_size=datamodule.vocab.size))
        store = _writer_store(args)
    else:
        store = _writer_store(args)
        try:
            plan = _plan_resume(args, store) if args.resume else _plan_new(args, store)
            datamodule = _datamodule(plan.config)
            check_memory(cfg.replace(plan.config, vocab_size=datamodule.vocab.size))
        except (UsageError, ValueError) as exc:
            if args.run_id is not None and not args.resume:
                _mark_failed_quietly(store, args.run_id, str(exc))
            store.close()
            raise
    try:
        return _run(args, store, plan, datamodule)
    finally:
        _close_quietly(store)


def _writer_store(args: argparse.Namespace) -> RunStore:
    """The store as a training run writes it: buffered, and patient with a locked file."""
    return RunStore(args.store or None, flush_seconds=FLUSH_EVERY_S, defer_when_busy=True)


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
    earlier_s = 0.0  # training time of the sessions before this one (resume)
    if plan.run_id is None:
        run_id = patiently(
            store.create_run, plan.name, lifecycle_fields.pop("config"), **lifecycle_fields
        )
    else:
        run_id = plan.run_id
        if plan.checkpoint is not None:  # a resumed run's time so far counts on
            earlier_s = float((store.get_run(run_id).get("final") or {}).get("time_s") or 0.0)
        patiently(
            store.update_run,
            run_id,
            ended=None,
            error=None,
            final=None,
            diverged_step=None,
            **lifecycle_fields,
        )
        if args.name and not args.resume:
            patiently(store.rename_run, run_id, args.name)
    name = store.get_run(run_id)["name"]
    run_dir = store.run_dir(run_id)
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        _write_json(run_dir / "config.json", config.to_json())
        _write_json(run_dir / "vocab.json", vocab.to_json())
    except OSError as exc:
        return _record_failure(store, run_id, name, exc)
    os.environ[ENV_RUN_DIR] = str(run_dir)
    handler = _open_log(run_dir)
    verb = f"resuming from step {plan.start_step}" if plan.checkpoint else "started"
    print(f"blockviz: run {run_id} ({name}) {verb}; store {store.path}", flush=True)
    log.info("run %s (%s) %s with config %s", run_id, name, verb, config.to_json(indent=None))
    if plan.checkpoint is not None:
        _continue_series(store, run_id, plan)

    try:
        if not _wait_for_slot(store, run_id, args.max_running, stop):
            patiently(store.update_run, run_id, status="stopped", ended=time.time())
            print(f"blockviz: run {run_id} ({name}) stopped while queued", flush=True)
            return EXIT_OK
        # Backdated by the earlier sessions' time, so started..ended spans all the training.
        started = time.time() - earlier_s

        def on_ready(trainer: Any, lit: Any) -> None:
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
        summary = ", ".join(
            f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
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
    from blockviz.training.data import DataError

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
    from blockviz.cli import run_config_from_args
    from blockviz.training.trainer import quiet_lightning

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
    datamodule = _datamodule(config)
    plan.config = cfg.replace(config, vocab_size=datamodule.vocab.size).validate()
    stop = StopRequest()
    stop.install()
    try:
        outcome, _, _ = _fit(plan, datamodule, run_dir, stop, None, None, progress=False)
    finally:
        stop.uninstall()
    return outcome.exit_code


# ------------------------------------------------------------------------ run commands


def _open_store(args: argparse.Namespace) -> RunStore:
    """The store for reading: writable when it can be (to mark dead runs), else read-only;
    a damaged file is reported as corrupt rather than read."""
    return checked(RunStore.open_readable(args.store or None))


def _fmt(value: Any, spec: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def cli_runs(args: argparse.Namespace) -> int:
    """`python -m blockviz runs`: one line per run (id, name, status, step, val loss, device)."""
    with _open_store(args) as store:
        store.reap_dead()  # a read-only store is listed as it is
        frame = store.runs_frame()
    if args.json:
        records = json.loads(frame.to_json(orient="records"))
        print(json.dumps(records, indent=2))
        return EXIT_OK
    if frame.empty:
        print("no runs yet; start one with `python -m blockviz train --preset baby-cpu`")
        return EXIT_OK
    header = ("id", "name", "status", "step", "val loss", "device")
    rows = [
        (
            str(row.id),
            str(row.name),
            str(row.status),
            f"{_fmt(row.step)}/{_fmt(row.max_steps)}",
            _fmt(row.val_loss, ".4f"),
            str(row.device) if isinstance(row.device, str) and row.device else "-",
        )
        for row in frame.itertuples()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for line in [header, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    return EXIT_OK


def _config_summary(config: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not config:
        return []
    try:
        run_config = cfg.RunConfig.from_dict(config)
    except cfg.ConfigError:
        return [("config", json.dumps(config))]
    m, t, d = run_config.model, run_config.train, run_config.data
    norm = "no norm" if m.norm_position == "none" else f"{m.norm_position}-{m.norm_type}"
    sublayers = (
        "attention + ffn"
        if m.attention and m.ffn
        else ("attention only" if m.attention else "ffn only")
    )
    model = (
        f"{m.n_layer} layers x {m.n_head} heads, d_model {m.d_model}, ctx {m.block_size}, {norm}, "
        f"{sublayers}, {m.activation} x{m.ffn_mult}, residual {'on' if m.residual else 'off'}, "
        f"init {m.init}, dropout {m.dropout:g}"
    )
    schedule = "constant" if t.lr_schedule == "constant" else f"{t.lr_schedule} to {t.min_lr:g}"
    train = (
        f"{t.max_steps} steps x batch {t.batch_size}, AdamW lr {t.lr:g} {schedule} after "
        f"{t.warmup_steps} warm-up steps, betas ({t.beta1:g}, {t.beta2:g}), wd {t.weight_decay:g}, "
        f"clip {t.grad_clip:g}, seed {t.seed}"
    )
    return [("model", model), ("train", train), ("data", f"{d.dataset} (val {d.val_fraction:g})")]


def _when(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def cli_show(args: argparse.Namespace) -> int:
    """`python -m blockviz show RUN`: config summary, status, final metrics, last sample."""
    with _open_store(args) as store:
        store.reap_dead()
        run = store.get_run(args.run)
        samples = store.samples(run["id"], limit=1)
        final = store.final_metrics([run["id"]])
    last_sample = (
        None
        if samples.empty
        else {
            "step": int(samples.iloc[0]["step"]),
            "prompt": str(samples.iloc[0]["prompt"]),
            "text": str(samples.iloc[0]["text"]),
        }
    )
    metrics = {} if final.empty else json.loads(final.iloc[[0]].to_json(orient="records"))[0]
    if args.json:
        print(
            json.dumps(
                {**run, "final_metrics": metrics, "last_sample": last_sample}, indent=2, default=str
            )
        )
        return EXIT_OK
    lines: list[tuple[str, str]] = [
        ("run", f"{run['id']} ({run['name']})"),
        (
            "status",
            str(run["status"])
            + (f" at step {run['diverged_step']}" if run["diverged_step"] is not None else ""),
        ),
        ("step", f"{_fmt(run['step'])}/{_fmt(run['max_steps'])}"),
        ("created", _when(run["created"])),
        ("started", _when(run["started"])),
        ("ended", _when(run["ended"])),
        ("device", f"{run['device'] or '-'}, precision {run['precision'] or '-'}"),
        ("params", _fmt(run["n_params"], ",")),
    ]
    dataset = run.get("dataset") or {}
    if dataset:
        size = f"{dataset.get('n_chars', 0):,} chars, vocab {dataset.get('vocab_size')}"
        lines.append(("dataset", f"{dataset.get('name')}: {size}"))
    lines += _config_summary(run.get("config"))
    shown = (
        "train_loss",
        "val_loss",
        "val_bpc",
        "val_ppl",
        "answer_acc",
        "time_s",
        "tokens_per_sec",
    )
    values = [
        f"{key} {_fmt(metrics.get(key), '.4g')}" for key in shown if metrics.get(key) is not None
    ]
    if values:
        lines.append(("metrics", ", ".join(values)))
    if run.get("error"):
        lines.append(("error", str(run["error"])))
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label.ljust(width)}  {value}")
    if last_sample is not None:
        print(f"\nlast sample (step {last_sample['step']}, prompt {last_sample['prompt']!r}):")
        print(last_sample["prompt"] + last_sample["text"])
    return EXIT_OK


def cli_stop(args: argparse.Namespace) -> int:
    """`python -m blockviz stop RUN`: SIGTERM to the run's own process (see runner.stop_run)."""
    from blockviz import runner

    with RunStore(args.store or None) as store:
        run = store.get_run(args.run)
        label = f"run {run['id']} ({run['name']})"
        outcome = runner.stop_run(store, int(run["id"]))
    if outcome.ok:
        print(f"{label}: {outcome.message}")
        return EXIT_OK
    print(f"{label}: {outcome.message}", file=sys.stderr)
    return EXIT_FAILED
