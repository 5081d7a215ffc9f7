"""`study launch`: start a study's workers through submitit (torch-free).

A stored study's runs wait, queued and unclaimed, for workers: `python -m blockviz study
work ID --store STORE` claims and trains them one by one, on any machine that reaches the
store. This module submits N such workers through submitit, the one command each runs
unchanged: to SLURM as one job array (`launch_slurm`: sbatch, with a partition, GPUs per
task, how many run at once), or as N processes on this machine (`launch_local`, submitit's
LocalExecutor). Any other scheduler can run the same command itself.

Each job runs `StudyWorkerJob`: the worker command as a child process, its output in the
job's log, its exit status the job's result. SLURM's warning before the time limit or a
preemption (SIGUSR2) and a cancel (SIGTERM) become SIGTERM for the worker, repeated until it
leaves: the run it trains stops (checkpointed, 'stopped'). After a warning the job is
requeued through submitit's checkpoint-and-requeue (`StudyWorkerJob.checkpoint`), at most
`--requeues` times; the requeued job queues the study's stopped runs again
(`study_runner.resume`) and works on. A cancel ends the job.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

import submitit
from submitit.core.job_environment import SignalHandler
from submitit.core.utils import FailedJobError, FailedSubmissionError
from submitit.helpers import DelayedSubmission

from blockviz.core import procs
from blockviz.core.studies.define import plan_from_spec
from blockviz.launch import runner, study_runner
from blockviz.store import RunStore, StoreError, redact

JOBS_DIR = "jobs"  # under the study's folder: submitit's pickles and each job's log
DEFAULT_TIME_MIN = 24 * 60
DEFAULT_REQUEUES = 3  # times a job interrupted by a time limit or preemption is requeued
LOCAL_MAX_REQUEUES = 5  # submitit's local executor starts a job at most 6 times
SIGNAL_LEAD_S = 90  # submitit's warning before the time limit (SIGUSR2), for limits of 3 min+
STOP_AGAIN_S = 2.0  # while a stopped worker has not left, SIGTERM it again this often
WAIT_S = 0.5  # how often a job looks up from waiting for its worker
# The variables submitit's local executor sets for its jobs that a worker must not inherit:
# it hides every GPU (CUDA_VISIBLE_DEVICES="") unless GPUs are asked for by count.
LOCAL_RESTORED_ENV = ("CUDA_VISIBLE_DEVICES",)


class ClusterError(ValueError):
    """Workers could not be launched; the message says why, in one line."""


@dataclass(frozen=True)
class SlurmOptions:
    """What `study launch --slurm` asks of SLURM for each worker (None: SLURM's default)."""

    workers: int = 1  # the job array's size
    partition: str | None = None
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    array_parallelism: int | None = None  # at most this many run at once (None: all)
    time_min: int = DEFAULT_TIME_MIN
    requeues: int = DEFAULT_REQUEUES  # after a time limit or a preemption


@dataclass(frozen=True)
class Launched:
    """Workers submitted: their job ids, the folder with their logs, the command each runs."""

    scheduler: str  # "slurm" or "local"
    job_ids: list[str]
    folder: Path
    command: list[str]  # after the Python interpreter


@dataclass(frozen=True)
class Requeues:
    """What a job needs to be requeued after an interruption and to resume its study then."""

    store: str  # the store's text: no password (the job's environment carries it)
    study_id: int
    left: int  # how many more times the job may be requeued
    done: int = 0  # how many times it was requeued so far

    def next(self) -> Requeues:
        """The count after one more requeue."""
        return replace(self, left=self.left - 1, done=self.done + 1)


class StudyWorkerJob:
    """What each submitted job calls: the study worker command as a child process.

    Picklable by reference (this module must be importable where the job runs, as the
    worker needs blockviz there anyway). The child runs with the job's own interpreter.
    With `requeues`, a job that the scheduler warns (SIGUSR2) is requeued once its worker
    has left, and resumes the study when it starts again.
    """

    def __init__(
        self,
        args: list[str],
        cwd: str | None = None,
        env: dict[str, str | None] | None = None,
        requeues: Requeues | None = None,
    ) -> None:
        self.args = list(args)
        self.cwd = cwd
        self.env = dict(env or {})  # set (a string) or removed (None) for the worker
        self.requeues = requeues

    def command(self) -> list[str]:
        """The worker's command line, with this process's interpreter."""
        return [sys.executable, *self.args]

    def __call__(self, index: int = 0) -> int:
        """Run the worker to its end; its exit status. Requeued (and this process left)
        when the scheduler warned the job and a requeue is left."""
        if self.requeues is not None and self.restarted():
            resume_after_requeue(self.requeues, index)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for name, value in self.env.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        cwd = self.cwd if self.cwd and Path(self.cwd).is_dir() else None
        print(f"blockviz: worker {index}: {redact(' '.join(self.command()))}", flush=True)
        stop = StopForwarder()
        previous = {s: signal.signal(s, stop) for s in stop.SIGNALS}
        try:
            stop.child = subprocess.Popen(
                self.command(),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                # SLURM signals every process of the job before its time limit (SIGUSR2),
                # which kills a Python process that does not handle it: the worker ignores
                # it and hears it from here, as SIGTERM.
                preexec_fn=ignore_usr2,
            )
            if stop.requested:  # asked before the worker existed
                stop.again()
            while True:
                # Never blocked for long: a signal another thread took is handled here
                # only once this thread runs again.
                try:
                    code = stop.child.wait(timeout=WAIT_S)
                    break
                except subprocess.TimeoutExpired:
                    if stop.requested and time.monotonic() - stop.sent >= STOP_AGAIN_S:
                        stop.again()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        print(f"blockviz: worker {index} exited with status {code}", flush=True)
        if stop.warned:
            self.requeue(index, previous[signal.SIGUSR2])
        return code

    def restarted(self) -> bool:
        """Whether this job starts again after a requeue: its own (`checkpoint`), or one
        the scheduler made by itself (SLURM counts them in SLURM_RESTART_COUNT)."""
        restarts = os.environ.get("SLURM_RESTART_COUNT", "")
        return bool(self.requeues and self.requeues.done) or (
            restarts.isdigit() and int(restarts) > 0
        )

    def requeue(self, index: int, handler: object) -> None:
        """After the scheduler's warning stopped the worker: submitit's own handler,
        deferred until the worker has left, checkpoints this job (`checkpoint`), requeues
        it and ends this process. Nothing when no requeue is left, or outside submitit."""
        submitits = isinstance(getattr(handler, "__self__", None), SignalHandler)
        if self.requeues is None or not submitits:
            return
        if self.requeues.left <= 0:
            print(
                f"blockviz: worker {index}: interrupted (time limit or preemption); not "
                f"requeued: its {self.requeues.done} requeue(s) (--requeues) are used up",
                flush=True,
            )
            return
        print(
            f"blockviz: worker {index}: interrupted (time limit or preemption); requeued "
            f"({self.requeues.left - 1} more requeue(s) left)",
            flush=True,
        )
        handler(signal.SIGUSR2, None)  # type: ignore[operator]

    def checkpoint(self, index: int = 0) -> DelayedSubmission | None:
        """submitit's checkpoint-and-requeue: what the requeued job calls, this job with
        one requeue fewer (None: no requeue left, the job is not requeued). The study's
        state is in the store, each run's in its checkpoints: nothing else to save."""
        if self.requeues is None or self.requeues.left <= 0:
            return None
        again = StudyWorkerJob(self.args, self.cwd, self.env, self.requeues.next())
        return DelayedSubmission(again, index)


def resume_after_requeue(requeues: Requeues, index: int) -> None:
    """A requeued job's first act: queue the study's stopped and failed runs again
    (`study_runner.resume`, which resumes each from its checkpoint), and keep its record of
    the launch's workers. Not when a person stopped the study meanwhile (`study stop`: no
    error recorded); while another worker still trains it, only its stopped and failed runs
    are queued again (`study_runner.requeue`) and this one joins it."""
    study_id = requeues.study_id

    def say(text: str) -> None:
        print(f"blockviz: worker {index}: requeued job: {text}", flush=True)

    try:
        with RunStore(requeues.store, create=False) as store:
            study = store.get_study(study_id)
            if study.status == "stopped" and study.error is None:
                say(f"study {study_id} was stopped by `study stop`; it stays stopped")
                return
            try:
                queued = study_runner.resume(store, study_id, workers=0)
            except study_runner.StudyError as exc:
                # Other workers still train it: queue what stopped (this job's own run
                # among them) without touching the study, and join them.
                joined = study_runner.requeue(store, study_id)
                say(f"{exc}; {joined.count} stopped or failed run(s) queued again; joining")
                return
            if queued.count:
                store.update_study(study_id, workers=[list(w) for w in study.workers])
            say(f"study {study_id}: {queued.count} stopped or failed run(s) queued again")
    except StoreError as exc:
        say(f"could not resume study {study_id}: {exc}")


def ignore_usr2() -> None:
    """In the worker's process, before it starts: SIGUSR2 ignored (SIG_IGN survives exec)."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class StopForwarder:
    """Signal handler: a stop asked of the job (SIGTERM, SIGINT, SIGUSR2) becomes SIGTERM
    for the worker, repeated until it leaves (its first stops the run it trains; once that
    run is recorded 'stopped' the worker would otherwise claim the next)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.requested = False
        self.warned = False  # the scheduler's SIGUSR2: a time limit or a preemption
        self.sent = 0.0  # when the last SIGTERM went (time.monotonic)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.warned = self.warned or signum == signal.SIGUSR2
        self.again()

    def again(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
            self.sent = time.monotonic()


def check_launchable(store: RunStore, study_id: int, count: int) -> int:
    """How many workers the study takes of the `count` asked: `count`, or 1 for a study
    that only measures at initialisation (one job, as `study run` starts it). ClusterError
    when it cannot take workers: finished, stopped, or no run left to claim."""
    study = store.get_study(study_id)  # StoreError naming an unknown study
    if study.status == "completed":
        raise ClusterError(f"study {study.id} is completed; every run has finished")
    if study.status != "running":
        raise ClusterError(
            f"study {study.id} is {study.status}; `study resume {study.id} --workers 0` "
            "queues its unfinished runs again, then launch its workers"
        )
    if not plan_from_spec(study.spec).trains:
        return 1
    runs = store.study_runs(study_id)
    unclaimed = int(((runs["status"] == "queued") & runs["pid"].isna()).sum())
    if unclaimed == 0:
        raise ClusterError(
            f"study {study.id} has no queued run left for a new worker to claim "
            f"({int((runs['status'] == 'running').sum())} running)"
        )
    return count


def jobs_folder(store: RunStore, study_id: int, folder: str | Path | None = None) -> Path:
    """Where submitit keeps the jobs' pickles and logs: `folder`, else
    `<store>.studies/<id>/jobs`. On a cluster it must be a folder every node sees."""
    path = Path(folder).expanduser() if folder else store.study_dir(study_id) / JOBS_DIR
    return path.absolute()


@contextlib.contextmanager
def _stdio_to_devnull() -> Iterator[None]:
    """This process's stdout and stderr pointed at /dev/null while submitit starts the
    local workers' controllers, which inherit them: else `study launch --local N | tee`
    (or any caller reading a pipe) waits for the last worker to end, not for this command.
    The workers write to their jobs' logs."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(devnull, fd)
        yield
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


def launch_local(
    store: RunStore,
    study_id: int,
    count: int,
    threads: int | None = None,
    replicas: int | None = None,
    time_min: int = DEFAULT_TIME_MIN,
    folder: str | Path | None = None,
    requeues: int = DEFAULT_REQUEUES,
) -> Launched:
    """Start `count` workers on this machine through submitit's LocalExecutor.

    They are recorded in the study (each job's controller process), so `study show` sees
    them alive here and says so when they are gone. A job warned before its time limit is
    started again by its controller, at most `requeues` times.
    """
    check_count("--local", count)
    check_count("--time_min", time_min)
    check_requeues(requeues, LOCAL_MAX_REQUEUES)
    count = check_launchable(store, study_id, count)
    args = study_runner.worker_args(store, study_id, threads, replicas)
    where = jobs_folder(store, study_id, folder)
    executor = _executor(where, "local", requeues)
    executor.update_parameters(
        timeout_min=int(time_min), name=f"blockviz-study-{study_id}", stderr_to_stdout=True
    )
    restored = {name: os.environ.get(name) for name in LOCAL_RESTORED_ENV}
    job = StudyWorkerJob(
        args,
        cwd=str(runner.PROJECT_DIR),
        env=restored,
        requeues=Requeues(store.location.text, study_id, requeues),
    )
    with _stdio_to_devnull():
        jobs = _submit(executor, job, count)
    started: list[list[float | int | None]] = []
    for submitted in jobs:
        me = procs.identity_of(int(submitted.job_id))
        started.append([int(submitted.job_id), me.started if me else time.time()])
    study_runner.add_workers(store, study_id, started)
    return Launched("local", [str(j.job_id) for j in jobs], where, args)


def launch_slurm(
    store: RunStore,
    study_id: int,
    options: SlurmOptions,
    threads: int | None = None,
    replicas: int | None = None,
    folder: str | Path | None = None,
) -> Launched:
    """Submit `options.workers` workers to SLURM as one job array (sbatch via submitit)."""
    check_count("--workers", options.workers)
    for name in ("array_parallelism", "cpus_per_task"):
        value = getattr(options, name)
        if value is not None:
            check_count(f"--{name}", value)
    if options.gpus_per_task is not None and options.gpus_per_task < 0:
        raise ClusterError(
            f"--gpus_per_task: {options.gpus_per_task} is not allowed; must be 0 or more"
        )
    check_count("--time_min", options.time_min)
    check_requeues(options.requeues)
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(
            f"--slurm: `{missing[0]}` is not on PATH, so there is no SLURM to submit to here; "
            "run this on a SLURM login node, or use --local N"
        )
    count = check_launchable(store, study_id, options.workers)
    args = study_runner.worker_args(store, study_id, threads, replicas)
    where = jobs_folder(store, study_id, folder)
    executor = _executor(where, "slurm", options.requeues)
    parameters: dict[str, object] = {
        "name": f"blockviz-study-{study_id}",
        "timeout_min": int(options.time_min),
        "stderr_to_stdout": True,
        "slurm_array_parallelism": options.array_parallelism or count,
        "slurm_signal_delay_s": signal_lead_s(options.time_min),
    }
    if options.partition:
        parameters["slurm_partition"] = options.partition
    if options.gpus_per_task:
        parameters["slurm_gpus_per_task"] = int(options.gpus_per_task)
    if options.cpus_per_task:
        parameters["cpus_per_task"] = int(options.cpus_per_task)
    executor.update_parameters(**parameters)
    requeues = Requeues(store.location.text, study_id, options.requeues)
    job = StudyWorkerJob(args, cwd=str(runner.PROJECT_DIR), requeues=requeues)
    jobs = _submit(executor, job, count)
    # Their processes run elsewhere; recorded by count, so each claims its share of runs.
    study_runner.add_workers(store, study_id, [[study_runner.ELSEWHERE_PID, None]] * count)
    return Launched("slurm", [str(j.job_id) for j in jobs], where, args)


def check_count(flag: str, value: int) -> None:
    """ClusterError unless `value` is at least 1."""
    if value < 1:
        raise ClusterError(f"{flag}: {value} is not allowed; must be at least 1")


def check_requeues(value: int, most: int | None = None) -> None:
    """ClusterError unless `value` is 0 or more (and at most `most`)."""
    if value < 0:
        raise ClusterError(f"--requeues: {value} is not allowed; must be 0 or more")
    if most is not None and value > most:
        raise ClusterError(
            f"--requeues: {value} is not allowed with --local; submitit's local executor "
            f"restarts a job at most {most} times"
        )


def signal_lead_s(time_min: int) -> int:
    """How long before the time limit the job is warned (SIGUSR2): submitit's 90 s, but
    at most half the limit, so that a short job trains for half of it before it stops.
    SLURM checks its limits every half minute or so: the warning may come that much late."""
    return min(SIGNAL_LEAD_S, int(time_min) * 60 // 2)


def _executor(folder: Path, cluster: str, requeues: int) -> submitit.AutoExecutor:
    """submitit's executor; it may requeue a job `requeues` times after a time limit (it
    counts those; `StudyWorkerJob` counts every requeue and stops first)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        timeouts = {f"{cluster}_max_num_timeout": int(requeues)}
        return submitit.AutoExecutor(folder=folder, cluster=cluster, **timeouts)
    except OSError as exc:
        raise ClusterError(
            f"cannot use {folder} for the jobs' logs ({exc.strerror or exc})"
        ) from None
    except RuntimeError as exc:  # SlurmExecutor: no srun here
        raise ClusterError(f"--{cluster}: {exc}") from None


def _submit(executor: submitit.AutoExecutor, job: StudyWorkerJob, count: int) -> list:
    """`count` jobs of `job` (one array on SLURM); ClusterError with the scheduler's reason."""
    try:
        # submitit prints a refusing sbatch's stderr too; the error below carries it.
        with contextlib.redirect_stderr(io.StringIO()):
            return executor.map_array(job, range(count))
    except (FailedJobError, FailedSubmissionError) as exc:
        reason = " ".join(str(exc).split()) or "no reason given"
        raise ClusterError(f"the scheduler refused the workers: {reason}") from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise ClusterError(f"could not submit the workers ({exc})") from None
