"""Launch, watch, stop and resume studies (torch-free: the UI and the CLI call this).

A study is stored with all its runs at once (queued, unclaimed); then a few worker
processes (`python -m blockviz study work ID`, in their own sessions so a study keeps going
with the tab closed) claim and train them one by one. Workers take the same slots as any
other run (`--max_running`), so a study and hand-launched runs share the machine. A study
stored with `workers=0` gets its workers elsewhere (`blockviz.launch.cluster`, or any
scheduler running the same command); `progress` then sees them by their runs' heartbeats.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pandas as pd

from blockviz.core import forks, procs
from blockviz.core.config import RunConfig
from blockviz.core.files import atomic_write
from blockviz.core.studies.define import StudyDef
from blockviz.launch import runner
from blockviz.store import RunStore, run_alive

WORKER_LOG = "worker.log"
# A study's `workers` entry for a worker started through a scheduler (`study launch
# --slurm`): its process runs on another machine, so it has no pid here. It counts towards
# each worker's share of the runs it claims, and tells `progress` that workers exist.
ELSEWHERE_PID = 0


class StudyError(ValueError):
    """A study could not be launched, stopped or resumed; the message says why."""


@dataclass(frozen=True)
class Progress:
    """Where a study stands: its runs counted by what happened to them."""

    total: int
    finished: int  # completed or diverged
    running: int
    queued: int
    unfinished: int  # stopped or failed
    workers_alive: int  # workers this machine started that are alive
    status: str  # the stored status: running, stopped, completed
    beating: int = 0  # running runs whose process lives (here: its pid; elsewhere: its beat)
    workers_here: int = 0  # workers this machine started (alive or not)
    workers_elsewhere: int = 0  # workers started through a scheduler, unseen from here

    @property
    def unattended(self) -> bool:
        """Runs are left and nothing is seen working on them: no worker this machine
        started is alive and no run of the study beats (a worker anywhere would)."""
        return (
            self.status == "running"
            and self.workers_alive == 0
            and self.beating == 0
            and (self.queued + self.running) > 0
        )

    @property
    def waiting(self) -> bool:
        """Unattended, but no worker was lost here: the workers were started through a
        scheduler (still queued there, perhaps), or none was started yet (`--workers 0`)."""
        return self.unattended and (self.workers_elsewhere > 0 or self.workers_here == 0)

    @property
    def interrupted(self) -> bool:
        """Runs are left but the workers this machine started are gone (killed, machine
        restarted) and no run beats."""
        return self.unattended and not self.waiting

    @property
    def label(self) -> str:
        if self.interrupted:
            return "interrupted"
        if self.waiting:
            return "waiting for workers"
        return self.status


def launch(
    store: RunStore,
    study: StudyDef,
    name: str | None = None,
    workers: int | None = None,
    max_running: int | None = None,
    threads: int | None = None,
    replicas: int | None = None,
) -> int:
    """Store the study and its runs, start its workers; the study id.

    `workers=0` stores it and starts none: `study launch` or `study work` start them.
    StudyError when the study has nothing to train or its workers cannot start.
    """
    grid = study.grid() if study.trains else []
    if study.trains and not grid:
        raise StudyError("the study has no runs")
    runs = []
    configs: list[RunConfig] = []
    for variant, seed, config in grid:
        config = runner.with_absolute_dataset(config)
        configs.append(config)
        runs.append(
            {
                "variant": variant.label,
                "seed": seed,
                "config": config.to_json(),
                "max_steps": config.train.max_steps,
            }
        )
    study_id, run_ids = store.create_study(
        name or f"{study.key} {study.size}", study.key, study.size, study.to_spec(), runs
    )
    for run_id, config in zip(run_ids, configs, strict=True):
        run_dir = store.run_dir(run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(run_dir / runner.CONFIG_NAME, config.to_json())
    # A study that only measures at initialisation is one job: a second worker would
    # measure it all again, beside the first.
    if workers == 0:
        return study_id
    count = workers if study.trains else 1
    start_workers(store, study_id, count, max_running, threads, replicas)
    return study_id


def default_workers(max_running: int | None = None) -> int:
    """How many workers a study gets: as many as runs may train at once."""
    return max(1, runner.default_max_running() if max_running is None else max_running)


def start_workers(
    store: RunStore,
    study_id: int,
    workers: int | None = None,
    max_running: int | None = None,
    threads: int | None = None,
    replicas: int | None = None,
) -> list[int]:
    """Start the study's worker processes; their pids (recorded in the study row).

    Each run a worker trains takes `threads` CPU threads, by default cores ÷ slots; runs
    that share every shape train as replicas, at most `replicas` at once (default: the
    worker's, `core.replicas.DEFAULT_REPLICAS`; 1: each run alone).
    """
    slots = runner.default_max_running() if max_running is None else max_running
    count = default_workers(slots) if workers is None else max(1, int(workers))
    folder = store.study_dir(study_id)
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, *worker_args(store, study_id, threads, replicas, slots)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started: list[list[float | int | None]] = []
    try:
        for _ in range(count):
            with open(folder / WORKER_LOG, "ab") as log:
                proc = subprocess.Popen(
                    command,
                    cwd=runner.PROJECT_DIR,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            runner.adopt_child(proc)
            me = procs.identity_of(proc.pid)
            started.append([proc.pid, me.started if me else None])
    except OSError as exc:
        store.update_study(study_id, status="stopped", error=f"could not start a worker: {exc}")
        raise StudyError(f"could not start the study's workers ({exc.strerror or exc})") from None
    store.update_study(study_id, status="running", workers=started, ended=None, error=None)
    return [int(p[0]) for p in started if p[0] is not None]


def worker_args(
    store: RunStore,
    study_id: int,
    threads: int | None = None,
    replicas: int | None = None,
    max_running: int | None = None,
) -> list[str]:
    """What a study worker runs after the Python interpreter: `-m blockviz study work ID
    --store STORE [--max_running N] [--threads T] [--replicas K]`."""
    args = ["-m", "blockviz", "study", "work", str(int(study_id))]
    args += ["--store", store.location.text]
    if max_running is not None:
        args += ["--max_running", str(int(max_running))]
    if threads is not None:
        args += ["--threads", str(int(threads))]
    if replicas is not None:
        args += ["--replicas", str(int(replicas))]
    return args


def add_workers(store: RunStore, study_id: int, workers: list[list[float | int | None]]) -> None:
    """Record workers started for the study (`[pid, start time]`, or `[ELSEWHERE_PID,
    None]` for one started through a scheduler) beside its workers still alive here; the
    dead and earlier scheduler entries (whether those still run is unknown here) go."""
    runner.reap_children()
    alive = [
        [int(pid), began]
        for pid, began in store.get_study(study_id).workers
        if pid and procs.is_alive(int(pid), began)
    ]
    store.update_study(study_id, workers=[*alive, *workers])


def workers_alive(store: RunStore, study_id: int) -> int:
    """How many of the study's recorded workers are still alive."""
    runner.reap_children()
    workers = store.get_study(study_id).workers
    return sum(1 for pid, began in workers if pid and procs.is_alive(int(pid), began))


def status_label(store: RunStore, study_id: int, status: str) -> str:
    """A study's status as the lists show it: `interrupted` when it is 'running' but its
    workers are gone and no run beats, `waiting for workers` when none was started here
    (or they were started through a scheduler) and no run beats, else the stored status.
    Its runs are read only when no worker of this machine is alive."""
    if status == "running" and workers_alive(store, study_id) == 0:
        return progress(store, study_id).label
    return status


def progress(store: RunStore, study_id: int) -> Progress:
    """The study's runs counted, and whether anything still works on them. A running
    study whose runs have all ended with no worker of this machine left (its workers were
    killed, its runs reaped since) is settled first: it no longer reads "running"."""
    alive = workers_alive(store, study_id)
    if not store.db.readonly and alive == 0:
        store.settle_study(study_id)
    runs = store.study_runs(study_id)
    status = runs["status"] if not runs.empty else pd.Series(dtype=str)
    running = status == "running"
    # A running run is worked on while its process lives, as far as this machine can
    # tell: one of this machine by its pid, another host's by its heartbeat (run_alive).
    running_ids = runs.loc[running, "id"].tolist() if not runs.empty else []
    beating = sum(1 for run_id in running_ids if run_alive(store.get_run(int(run_id))))
    study = store.get_study(study_id)
    pids = [int(pid) for pid, _ in study.workers]
    return Progress(
        total=len(runs),
        finished=int(status.isin(("completed", "diverged")).sum()),
        running=int(running.sum()),
        queued=int((status == "queued").sum()),
        unfinished=int(status.isin(("stopped", "failed")).sum()),
        workers_alive=alive,
        status=str(study.status),
        beating=beating,
        workers_here=sum(1 for pid in pids if pid != ELSEWHERE_PID),
        workers_elsewhere=sum(1 for pid in pids if pid == ELSEWHERE_PID),
    )


def stop(store: RunStore, study_id: int) -> str:
    """Stop a study: no further run starts, the running ones stop (checkpointed)."""
    study = store.get_study(study_id)
    if study.status != "running":
        return f"already {study.status}"
    store.update_study(study_id, status="stopped", ended=time.time())
    skipped = store.stop_unclaimed(study_id)
    stopped = 0
    for run_id in store.study_active_runs(study_id):
        if runner.stop_run(store, run_id).ok:
            stopped += 1
    return f"stopped: {stopped} running run(s) asked to stop, {skipped} queued run(s) skipped"


@dataclass(frozen=True)
class Requeued:
    """The runs `resume` queued again: those that continue from a checkpoint (run id and
    its step, None where this machine cannot read it) and those that start over (no
    checkpoint here)."""

    resumed: tuple[tuple[int, int | None], ...] = ()
    restarted: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return len(self.resumed) + len(self.restarted)

    def summary(self) -> str:
        """`3 run(s) queued again: 2 resume from their checkpoints, 1 from the start`."""
        return (
            f"{self.count} run(s) queued again: {len(self.resumed)} resume from their "
            f"checkpoints, {len(self.restarted)} from the start"
        )

    def lines(self) -> list[str]:
        """One line per run: `run 3 resumes from step 200`, `run 4 trains from the start (no
        checkpoint)`."""
        lines = [
            f"run {run_id} resumes from "
            + (f"step {step}" if step is not None else "its newest checkpoint that reads")
            for run_id, step in self.resumed
        ]
        restarted = [f"run {i} trains from the start (no checkpoint)" for i in self.restarted]
        return lines + restarted


def _what_resumes(store: RunStore, run_ids: list[int]) -> Requeued:
    """Which of these runs continue from a checkpoint, as this machine sees the run
    folders (a worker that cannot see one starts its run over), and from which step."""
    resumed: list[tuple[int, int | None]] = []
    restarted: list[int] = []
    for run_id in run_ids:
        checkpoint = runner.checkpoint_path(store, run_id)
        if store.get_run(run_id).started is not None and checkpoint.is_file():
            resumed.append((run_id, forks.checkpoint_step(checkpoint)))
        else:
            restarted.append(run_id)
    return Requeued(tuple(resumed), tuple(restarted))


def requeue(store: RunStore, study_id: int) -> Requeued:
    """Queue the study's stopped and failed runs again, each to continue from its
    checkpoint; which they are. Nothing checks that no worker trains the study: `resume`
    checks first; a scheduler's job that works on the study itself may call this while the
    study's other workers still run."""
    runs = store.study_runs(study_id)
    again = [int(i) for i in runs.loc[runs["status"].isin(("stopped", "failed")), "id"]]
    store.requeue_runs(again)
    return _what_resumes(store, again)


def resume(
    store: RunStore,
    study_id: int,
    workers: int | None = None,
    max_running: int | None = None,
    threads: int | None = None,
    replicas: int | None = None,
) -> Requeued:
    """Queue a stopped or unattended study's unfinished runs again; which they are.

    Finished runs (completed or diverged) are kept; stopped and failed runs continue from
    their last good checkpoint (a batch's members together), and a run with none starts
    over. `workers=0` queues them and starts no worker (`study launch` or `study work` do).
    """
    now = progress(store, study_id)  # settles a study whose workers died after its runs
    if now.status == "running" and not now.unattended:
        raise StudyError(f"study {study_id} is still running")
    runs = store.study_runs(study_id)
    if now.unattended:
        # Runs its dead workers held: failed (or about to be reaped); queue them again.
        for run_id in runs.loc[runs["status"].isin(("queued", "running")), "id"]:
            store.update_run(
                int(run_id),
                status="failed",
                ended=time.time(),
                error="its study worker exited without finishing it",
            )
    queued = requeue(store, study_id)
    if queued.count == 0:
        store.update_study(study_id, status="completed", ended=time.time())
        return queued
    if workers == 0:
        store.update_study(study_id, status="running", workers=[], ended=None, error=None)
        return queued
    start_workers(store, study_id, workers, max_running, threads, replicas)
    return queued
