"""Launch, watch and stop training runs as background processes (torch-free).

A run is `python -m blockviz train --config <run_dir>/config.json ...`, the same command a
user types on a GPU box, started in its own session so it outlives the browser tab, a
Streamlit rerun and a Streamlit restart. The run row is created here first (status
'queued'); the train process then waits for a free slot (`--max_running`, polled through
`RunStore.claim_slot`) and records everything else itself. Queuing therefore needs no
scheduler daemon: every queued run is a sleeping process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from blockviz.core import hardware, procs, replicas, spec
from blockviz.core.config import RunConfig
from blockviz.core.corpora import BUILTIN
from blockviz.core.files import atomic_write
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.store import RunRecord, RunStore

PROJECT_DIR = Path(__file__).resolve().parent.parent
LOG_NAME = "train.log"
CONFIG_NAME = "config.json"
# How long launch() watches a new process for an immediate crash (bad interpreter, bad
# flags) before handing back; slower failures land in the run's status and log.
STARTUP_WATCH_S = 1.0
STOP_WATCH_S = 0.5  # how long stop() waits to see whether the signal killed the process
ETA_WINDOW = 20  # recent train/step_time records the ETA averages over

# Popen objects of the children this process started. Polling them reaps finished ones,
# so a crashed or killed run never lingers as a zombie (every page polls through
# `active`, `stop` or `reap`).
_children: dict[int, subprocess.Popen[bytes]] = {}


class LaunchError(ValueError):
    """A run could not be started; carries the run id (if one was created) and its log tail."""

    def __init__(self, message: str, run_id: int | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.run_id = run_id
        self.log_tail = log_tail


@dataclass(frozen=True)
class ActiveRun:
    """A queued or running run with its progress."""

    id: int
    name: str
    status: str
    step: int
    max_steps: int
    eta_s: float | None  # None while there is nothing to estimate from
    shown: str = ""  # what the pages call it: `spec.shown_status` (queued -> starting)

    @property
    def waiting(self) -> bool:
        """Queued with every slot taken: really waiting for a free slot."""
        return self.status == "queued" and self.shown == "queued"

    @property
    def label(self) -> str:
        """Its status in words: `running`, `starting`, or `queued · waiting for a free slot`."""
        if self.waiting:
            return f"{self.shown} · {spec.WAITING_FOR_SLOT}"
        return self.shown or self.status

    @property
    def fraction(self) -> float:
        """Progress in [0, 1]."""
        if self.max_steps <= 0:
            return 0.0
        return min(max(self.step / self.max_steps, 0.0), 1.0)


def adopt_child(proc: subprocess.Popen[bytes]) -> None:
    """Keep a child this process started (a run or a study worker), to be reaped later."""
    _children[proc.pid] = proc


def reap_children() -> None:
    """Poll the children this process started; forget (and so reap) the finished ones."""
    for pid, proc in list(_children.items()):
        if proc.poll() is not None:
            del _children[pid]


def reap(store: RunStore) -> list[int]:
    """Collect this process's finished children, then mark runs whose process died failed.

    Every page that lists or shows runs calls this (or `active`) on each refresh, so a
    run killed with kill -9 reads `failed` everywhere within 35 s (a 30 s stale heartbeat
    plus the refresh).
    """
    reap_children()
    return store.reap_dead()


def default_max_running() -> int:
    """How many runs may train at once: $BLOCKVIZ_MAX_RUNNING, else one per GPU or CPU core."""
    return hardware.default_slots()


def with_absolute_dataset(run_config: RunConfig) -> RunConfig:
    """The config with a file dataset made absolute: the run's working directory differs."""
    dataset = run_config.data.dataset
    if dataset in BUILTIN:
        return run_config
    path = Path(dataset).expanduser()
    if not path.is_file():
        raise LaunchError(
            f"dataset {dataset!r} is neither a built-in corpus ({', '.join(BUILTIN)}) nor an "
            "existing file; choose a built-in corpus or upload a text file"
        )
    copy = RunConfig.from_dict(run_config.to_dict())
    copy.data.dataset = str(path.resolve())
    return copy


def launch(
    run_config: RunConfig,
    name: str | None,
    store: RunStore,
    max_running: int | None = None,
    tags: str | Iterable[str] = (),
) -> int:
    """Start a run in the background and return its id; LaunchError if it dies at once.

    `tags` label the run (the Playground tags its auto-runs `core.tags.AUTO_TAG`).
    """
    run_config = with_absolute_dataset(run_config.validate())
    slots = default_max_running() if max_running is None else max_running
    run_id = store.create_run(
        name or "run",
        run_config.to_json(),
        status="queued",
        max_steps=run_config.train.max_steps,
        tags=tags,
    )
    run_dir = store.run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / CONFIG_NAME
    atomic_write(config_path, run_config.to_json())
    command = [
        sys.executable,
        "-m",
        "blockviz",
        "train",
        "--config",
        str(config_path),
        "--store",
        store.location.text,
        "--run_id",
        str(run_id),
        "--max_running",
        str(slots),
        "--no_progress",
    ]
    try:
        proc = _spawn(command, store, run_id)
    except OSError as exc:
        message = f"could not start the training process ({exc.strerror or exc})"
        store.update_run(run_id, status="failed", ended=time.time(), error=message)
        raise LaunchError(message, run_id) from None
    _watch_startup(proc, store, run_id)
    return run_id


def spawn_logged(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `command` in its own session, its output appended to `log_path`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    reap_children()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command,
            cwd=PROJECT_DIR,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            # Its own session: closing the tab or stopping Streamlit (Ctrl-C signals the
            # terminal's process group) leaves the run going.
            start_new_session=True,
        )
    adopt_child(proc)
    return proc


def _spawn(command: list[str], store: RunStore, run_id: int) -> subprocess.Popen[bytes]:
    """Start `command` in its own session, output appended to the run's log; records its pid."""
    proc = spawn_logged(command, store.run_dir(run_id) / LOG_NAME)
    child = procs.identity_of(proc.pid)
    store.update_run(run_id, pid=proc.pid, pid_started=child.started if child else None)
    return proc


def _watch_startup(
    proc: subprocess.Popen[bytes], store: RunStore, run_id: int, resumed: bool = False
) -> None:
    """Poll the new process briefly; a non-zero exit becomes a failed run and a LaunchError.

    A resume refused before it took the run over (`resumed`) leaves the run as it was and
    names the log's reason, not the run's earlier error.
    """
    deadline = time.monotonic() + STARTUP_WATCH_S
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            break
        time.sleep(0.05)
    else:
        return
    if code == 0:
        return
    tail = log_tail(store, run_id)
    last_line = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
    run = store.get_run(run_id)
    if run.status in ACTIVE_STATUSES:
        store.update_run(
            run_id,
            status="failed",
            ended=time.time(),
            error=last_line or f"the training process exited with status {code}",
        )
    elif not resumed:
        last_line = run.error or last_line
    reason = last_line or f"exit status {code}"
    raise LaunchError(f"run {run_id} failed to start: {reason}", run_id, tail)


@dataclass(frozen=True)
class StopOutcome:
    """What a stop did, in a few words, and whether the run is (being) stopped."""

    message: str
    ok: bool = True


def stop_run(store: RunStore, run_id: int) -> StopOutcome:
    """Ask a queued or running run to stop: SIGTERM to the run's own process, never another.

    The one stop behind the dashboard's Stop buttons and `blockviz stop`. The signal goes
    only to the process whose pid AND start time the run recorded (`procs.signal_own`), so
    a pid reused by an unrelated process is never hit. The run catches SIGTERM, finishes
    its step, checkpoints and records `stopped` itself; one still starting (no handler
    yet) dies, and the stop is recorded here. Without a live process of its own, a queued
    run is marked `stopped` and a running one `failed` (it died without reporting).
    """
    reap_children()
    run = store.get_run(run_id)
    status, pid, began = run.status, run.pid, run.pid_started
    if status not in ACTIVE_STATUSES:
        return StopOutcome(f"already {status}")
    if pid is not None and not procs.is_this_machine(run.host, run.boot_id):
        # Another machine's process: no signal reaches it, the store does (its heartbeat
        # reads the request within a few seconds and it stops as if signalled). A queued
        # run is marked stopped at once: its process finds it so and never starts.
        store.request_stop(run_id)
        if status == "queued":
            store.update_run(run_id, status="stopped", ended=time.time())
            return StopOutcome(f"was queued on host {run.host}; marked stopped")
        return StopOutcome(f"stop requested; the run on host {run.host} stops at its next beat")
    if pid == os.getpid():
        # Only a run recorded by this very process (test fakes) lands here; never signal
        # ourselves, it would take the dashboard down.
        return StopOutcome("not stopped: the run belongs to this process", ok=False)
    if procs.signal_own(pid, began):
        deadline = time.monotonic() + STOP_WATCH_S
        while time.monotonic() < deadline:
            if store.get_run(run_id).status not in ACTIVE_STATUSES:
                return StopOutcome("stop requested")  # it recorded the stop itself
            reap_children()
            if not procs.is_alive(pid, began):
                break
            time.sleep(0.05)
        else:
            return StopOutcome("stop requested")
        if store.get_run(run_id).status in ACTIVE_STATUSES:
            store.update_run(run_id, status="stopped", ended=time.time())
            return StopOutcome("stopped")
        return StopOutcome("stop requested")
    if status == "queued":
        store.update_run(run_id, status="stopped", ended=time.time())
        return StopOutcome("was queued; marked stopped")
    # Running, but no process of its own is here: it died without reporting.
    store.update_run(
        run_id,
        status="failed",
        ended=time.time(),
        error=f"process {pid} exited without reporting (killed or out of memory?)",
    )
    store.settle_step(run_id)
    return StopOutcome(f"its process {pid} is gone; marked failed")


def stop(store: RunStore, run_id: int) -> str:
    """`stop_run`'s message: what the pages show."""
    return stop_run(store, run_id).message


def shown_in(runs: pd.DataFrame, max_running: int | None = None) -> dict[int, str]:
    """Every run of `runs` (a `runs_frame` of the whole store) -> the word every page and
    the CLI show its state by (`spec.RUN_STATES`): its status, a queued run `starting`
    while a slot is free for it (`spec.shown_status`)."""
    slots = default_max_running() if max_running is None else max_running
    running = int((runs["status"] == "running").sum())
    waiting = study_waiting(runs)
    queued = sorted(int(i) for i in runs.loc[(runs["status"] == "queued") & ~waiting, "id"])
    # A study's run no worker has claimed yet waits for its study, not for a slot: queued.
    shown = {int(i): str(s) for i, s in zip(runs["id"], runs["status"], strict=True)}
    for position, run_id in enumerate(queued):  # the oldest queued run gets a slot first
        shown[run_id] = spec.shown_status("queued", running + position, slots)
    return shown


def shown_statuses(store: RunStore, max_running: int | None = None) -> dict[int, str]:
    """What the pages call each run: a queued one `starting` while a slot is free.

    A just-launched run is 'queued' in the store until its process (importing torch,
    loading the data) claims a slot; it is only waiting when the slots are taken by the
    running runs and the queued runs launched before it. `max_running` defaults to what
    `launch` gives its runs (`default_max_running`).
    """
    return shown_in(store.runs_frame(), max_running)


def study_waiting(runs: pd.DataFrame) -> pd.Series:
    """Which rows of a `runs_frame` are study runs still waiting for a worker to claim them."""
    if "study_id" not in runs.columns:
        return pd.Series(False, index=runs.index)
    return (runs["status"] == "queued") & runs["study_id"].notna() & runs["pid"].isna()


def active(store: RunStore, max_running: int | None = None) -> list[ActiveRun]:
    """Queued and running runs, oldest first, with step, max_steps, an ETA and `shown`.

    A study's runs that no worker has claimed yet are left out: the Studies page counts
    them; each joins this list when a worker takes it.
    """
    reap(store)
    runs = store.runs_frame()
    shown = shown_in(runs, max_running)
    runs = runs[runs["status"].isin(ACTIVE_STATUSES) & ~study_waiting(runs)]
    out = []
    for row in runs.itertuples(index=False):
        step = 0 if pd.isna(row.step) else int(row.step)
        max_steps = 0 if pd.isna(row.max_steps) else int(row.max_steps)
        eta = eta_s(store, int(row.id), step, max_steps) if row.status == "running" else None
        word = shown[int(row.id)]
        out.append(ActiveRun(int(row.id), row.name, row.status, step, max_steps, eta, word))
    return out


def eta_s(store: RunStore, run_id: int, step: int, max_steps: int) -> float | None:
    """Seconds left: the median recent step time, else the rate since the run started.

    Every page shows this one estimate. Recent steps rather than the pace since `started`,
    which a resumed run resets while its step count starts from the checkpoint.
    """
    # Step 0 is left out: it pays for start-up and compilation. The median shrugs off the
    # odd slow step (an evaluation, a checkpoint) that would swing a mean.
    times = store.scalars(
        run_id, names=spec.TRAIN_STEP_TIME, after_step=max(step - 4 * ETA_WINDOW, 0)
    ).dropna(subset=["value"])
    if len(times):
        recent = times.tail(ETA_WINDOW)
        # The scalars may run ahead of the heartbeat's step by a second or two.
        done = max(step, int(recent["step"].max()) + 1)
        return float(recent["value"].median()) * max(max_steps - done, 0)
    run = store.get_run(run_id)
    started, beat = run.started, run.heartbeat
    if step > 0 and started and beat and beat > started:
        return (beat - started) / step * max(max_steps - step, 0)
    return None


def log_tail(store: RunStore, run_id: int, lines: int = 40) -> str:
    """The last `lines` lines of the run's train.log ('' when there is none yet)."""
    path = store.run_dir(run_id) / LOG_NAME
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            # 64 KiB holds far more than 40 lines of a training log; no need to read it all.
            log.seek(max(0, size - 65536))
            data = log.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(deque(text.splitlines(), maxlen=lines))


# ---------------------------------------------------------------------------- resume


def resume_blocker(run: RunRecord, checkpoint_exists: bool) -> str | None:
    """Why `train --resume` cannot continue this run (plain text), or None when it can.

    What `plan_resume` refuses, read without torch: an active run, no last.ckpt, a completed
    run. A stopped or failed run at its max_steps is offered: killed after its final
    checkpoint, the resume finishes it without training. A diverged run is not offered: its
    last checkpoint may already hold the non-finite weights.
    """
    status = run.status
    if status in ACTIVE_STATUSES:
        return f"it is {status}"
    if status == "diverged":
        return "it diverged; its last checkpoint may hold non-finite weights (Edit & relaunch)"
    if status == "completed":
        max_steps = run.max_steps
        return "it completed" + (f": it reached max_steps ({max_steps:,})" if max_steps else "")
    if not checkpoint_exists:
        return "it has no checkpoint to continue from"
    return None


def checkpoint_path(store: RunStore, run_id: int) -> Path:
    """The checkpoint `train --resume` continues from: the run's own, or for a replica its
    batch's (in the batch's first member's folder)."""
    return replicas.checkpoint_path(store.run_dir(run_id), store.run_dir)


def resume(store: RunStore, run_id: int, max_running: int | None = None) -> None:
    """Continue a stopped or failed run from its last checkpoint, in the background.

    `python -m blockviz train --resume RUN`, started like `launch` (own session, output
    appended to the run's train.log, a short startup watch). The process takes the run
    over (queued, then running) itself; LaunchError when it cannot.
    """
    run = store.get_run(run_id)
    blocker = resume_blocker(run, checkpoint_path(store, run_id).is_file())
    if blocker is not None:
        raise LaunchError(f"run {run_id} cannot be resumed: {blocker}", run_id)
    slots = default_max_running() if max_running is None else max_running
    command = [
        sys.executable,
        "-m",
        "blockviz",
        "train",
        "--resume",
        str(run_id),
        "--store",
        store.location.text,
        "--no_progress",
        "--max_running",
        str(slots),
    ]
    try:
        proc = _spawn(command, store, run_id)
    except OSError as exc:
        raise LaunchError(
            f"could not start the training process ({exc.strerror or exc})", run_id
        ) from None
    _watch_startup(proc, store, run_id, resumed=True)
