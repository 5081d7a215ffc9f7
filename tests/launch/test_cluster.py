"""`study launch` without a cluster: the sbatch script submitit writes (a fake `sbatch` on
PATH keeps it), the worker each job runs, the bad inputs, and the job's stop signals.

The real launches (SLURM and submitit's local executor) are tests/cli/test_study_launch.py.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from blockviz import cli
from blockviz.core.studies import sweeps
from blockviz.launch import cluster, study_runner
from blockviz.store import RunStore

FAKE_SBATCH = """#!/bin/sh
cp "$1" "$SBATCH_SCRIPT_COPY"
echo "Submitted batch job 4242"
"""
REFUSING_SBATCH = """#!/bin/sh
echo "sbatch: error: invalid partition specified: gpu" >&2
echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2
exit 1
"""


@pytest.fixture
def store(tmp_path: Path):
    opened = RunStore(tmp_path / "s.db")
    yield opened
    opened.close()


def _stored_study(store: RunStore) -> int:
    """A two-run study stored with no worker, as `study sweep --workers 0` stores it."""
    return study_runner.launch(store, sweeps.sweep({"lr": [1e-3, 2e-3]}, size="quick"), workers=0)


def _fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sbatch: str) -> Path:
    """`sbatch` and `srun` on PATH; the script sbatch was given is copied to the path returned."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", sbatch), ("srun", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    copy = tmp_path / "submitted.sh"
    monkeypatch.setenv("SBATCH_SCRIPT_COPY", str(copy))
    return copy


def test_slurm_launch_submits_one_array_of_study_workers(store, tmp_path, monkeypatch, capsys):
    study_id = _stored_study(store)
    script = _fake_slurm(tmp_path, monkeypatch, FAKE_SBATCH)
    code = cli.main(
        ["study", "launch", str(study_id), "--slurm", "--workers", "4", "--partition", "gpu",
         "--gpus_per_task", "1", "--cpus_per_task", "3", "--array_parallelism", "2",
         "--time_min", "90", "--store", str(store.path)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    folder = store.study_dir(study_id) / cluster.JOBS_DIR
    assert "submitted 4 worker(s) to SLURM, job(s) 4242_0, 4242_1, 4242_2, 4242_3" in out
    assert f"the jobs' logs: {folder}" in out
    shown = f"`.venv/bin/python -m blockviz study show {study_id} --store {store.location.text}`"
    assert shown in out
    # No --replicas: the default, auto, is each worker's to resolve on its node.
    command = f"python -m blockviz study work {study_id} --store {store.path}"
    assert f"each runs `{command}`" in out

    lines = script.read_text().splitlines()
    for flag in (
        "--array=0-3%2",
        "--partition=gpu",
        "--gpus-per-task=1",
        "--cpus-per-task=3",
        "--time=90",
        f"--job-name=blockviz-study-{study_id}",
        "--signal=USR2@90",
        f"--output={folder}/%A_%a_0_log.out",
    ):
        assert f"#SBATCH {flag}" in lines
    assert not any(line.startswith("#SBATCH --error") for line in lines)  # one log a worker
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert srun.endswith(f"-m submitit.core._submit {folder}")

    # What each array task unpickles and calls: the `study work` command, unchanged.
    for task in range(4):
        submitted = pickle.loads((folder / f"4242_{task}_submitted.pkl").read_bytes())
        assert submitted.args == (task,)
        assert submitted.function.command() == [sys.executable, *command.split()[1:]]
    # Recorded by count: each claims its share; `study show` waits for them, not "interrupted".
    assert store.get_study(study_id).workers == ((study_runner.ELSEWHERE_PID, None),) * 4
    now = study_runner.progress(store, study_id)
    assert (now.workers_elsewhere, now.interrupted, now.label) == (4, False, "waiting for workers")


def test_a_refused_submission_is_one_line_with_the_schedulers_reason(
    store, tmp_path, monkeypatch, capsys
):
    study_id = _stored_study(store)
    _fake_slurm(tmp_path, monkeypatch, REFUSING_SBATCH)
    launch = ["study", "launch", str(study_id), "--slurm", "--partition", "gpu"]
    assert cli.main([*launch, "--store", str(store.path)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "blockviz study: error: the scheduler refused the workers: sbatch: error: invalid "
        "partition specified: gpu sbatch: error: Batch job submission failed: Invalid "
        "partition name specified"
    ]
    assert store.get_study(study_id).workers == ()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slurm"], "--slurm: `sbatch` is not on PATH, so there is no SLURM to submit to here"),
        (["--local", "0"], "--local: 0 is not allowed; must be at least 1"),
        (["--slurm", "--workers", "0"], "--workers: 0 is not allowed; must be at least 1"),
        (["--local", "2", "--partition", "gpu"], "--partition is for --slurm"),
        (["--local", "2", "--workers", "3"], "--workers is for --slurm"),
        (["--local", "2", "--time_min", "0"], "--time_min: 0 is not allowed"),
        (["--local", "2", "--threads", "0"], "--threads: 0 is not allowed"),
    ],
)
def test_bad_launches_get_one_line(store, tmp_path, monkeypatch, capsys, args, message):
    study_id = _stored_study(store)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    assert cli.main(["study", "launch", str(study_id), *args, "--store", str(store.path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert store.get_study(study_id).workers == ()


def test_a_study_that_cannot_take_workers_gets_one_line(store, tmp_path, capsys):
    def launch(study: int | str, where: Path = store.path) -> str:
        assert cli.main(["study", "launch", str(study), "--local", "2", "--store", str(where)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        return err

    study_id = _stored_study(store)
    assert "no study 9 in" in launch(9)
    missing = tmp_path / "elsewhere" / "runs.db"
    assert f"no run store at {missing}" in launch(study_id, missing)
    assert not missing.exists() and not missing.parent.exists()
    for _ in store.study_active_runs(study_id):  # every run claimed by a worker
        store.claim_study_run(study_id, 2**22 + 4321, time.time())
    assert f"study {study_id} has no queued run left for a new worker to claim" in launch(study_id)
    study_runner.stop(store, study_id)
    assert f"`study resume {study_id} --workers 0` queues its unfinished" in launch(study_id)
    store.update_study(study_id, status="completed")
    assert f"study {study_id} is completed; every run has finished" in launch(study_id)


def test_a_study_stored_with_no_workers_says_how_to_start_them(tmp_path, capsys):
    where = tmp_path / "runs.db"
    sweep = ["study", "sweep", "--lr", "1e-3,2e-3", "--workers", "0", "--store", str(where)]
    assert cli.main(sweep) == 0
    out = capsys.readouterr().out
    assert "study 1 (sweep, custom): 2 runs stored, no worker started" in out
    launch = f"`.venv/bin/python -m blockviz study launch 1 --slurm --workers N --store {where}`"
    assert f"{launch} (or `--local N`)" in out
    assert f"`.venv/bin/python -m blockviz study work 1 --store {where}`" in out
    with RunStore(where) as store:
        assert store.get_study(1).workers == ()
        assert study_runner.progress(store, 1).label == "waiting for workers"


# ------------------------------------------------------------------- what each job runs


def test_the_job_returns_the_workers_exit_status_with_the_environment_it_was_given(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # as submitit's local executor sets it
    monkeypatch.setenv("KEPT", "yes")
    report = tmp_path / "env.txt"
    script = (
        "import os, sys; open(sys.argv[1], 'w').write(repr((os.getcwd(), "
        "os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ['KEPT'], "
        "os.environ['PYTHONUNBUFFERED']))); sys.exit(3)"
    )
    job = cluster.StudyWorkerJob(
        ["-c", script, str(report)], cwd=str(tmp_path), env={"CUDA_VISIBLE_DEVICES": None}
    )
    assert job(5) == 3
    assert eval(report.read_text()) == (str(tmp_path), None, "yes", "1")
    job = cluster.StudyWorkerJob(["-c", script, str(report)], env={"CUDA_VISIBLE_DEVICES": "1"})
    assert job() == 3
    assert eval(report.read_text())[1] == "1"


CHILD = """
import pathlib, signal, sys, time
terms = []
signal.signal(signal.SIGTERM, lambda signum, frame: terms.append(signum))
ignores = signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
pathlib.Path(sys.argv[1]).write_text(f"ready, ignores SIGUSR2: {ignores}")
deadline = time.monotonic() + 30
while len(terms) < 2 and time.monotonic() < deadline:  # a run stops, then the worker leaves
    time.sleep(0.01)
sys.exit(7 if len(terms) == 2 else 1)
"""


def test_slurms_time_limit_warning_stops_the_worker_until_it_leaves(tmp_path, monkeypatch):
    """SLURM sends SIGUSR2 to every process of the job before its time limit: the worker
    ignores it, and the job turns it into SIGTERM, again until the worker has left."""
    monkeypatch.setattr(cluster, "STOP_AGAIN_S", 0.1)
    monkeypatch.setattr(cluster, "WAIT_S", 0.02)
    ready = tmp_path / "ready"
    job = cluster.StudyWorkerJob(["-c", CHILD, str(ready)])

    def warn() -> None:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGUSR2)

    before = signal.getsignal(signal.SIGUSR2)
    threading.Thread(target=warn, daemon=True).start()
    assert job() == 7
    assert ready.read_text() == "ready, ignores SIGUSR2: True"
    assert signal.getsignal(signal.SIGUSR2) == before


# ------------------------------------------------------- requeued after a time limit


def test_slurm_launch_warns_short_jobs_at_half_their_limit_and_counts_the_requeues(
    store, tmp_path, monkeypatch
):
    study_id = _stored_study(store)
    _fake_slurm(tmp_path, monkeypatch, FAKE_SBATCH)
    launch = ["study", "launch", str(study_id), "--slurm", "--time_min", "1", "--requeues", "2"]
    assert cli.main([*launch, "--store", str(store.path)]) == 0
    folder = store.study_dir(study_id) / cluster.JOBS_DIR
    # A one-minute job is warned 30 s before its limit, not 90 s (before it started).
    assert "#SBATCH --signal=USR2@30" in (tmp_path / "submitted.sh").read_text().splitlines()
    (pickled,) = folder.glob("*_submitted.pkl")
    submitted = pickle.loads(pickled.read_bytes())
    assert submitted.function.requeues == cluster.Requeues(store.location.text, study_id, 2)
    assert submitted._timeout_countdown == 2  # submitit's own count of time limits agrees


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slurm", "--requeues", "-1"], "--requeues: -1 is not allowed; must be 0 or more"),
        (
            ["--local", "1", "--requeues", "6"],
            "--requeues: 6 is not allowed with --local; submitit's local executor restarts a "
            "job at most 5 times",
        ),
    ],
)
def test_a_bad_requeue_count_gets_one_line(store, capsys, args, message):
    study_id = _stored_study(store)
    assert cli.main(["study", "launch", str(study_id), *args, "--store", str(store.path)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"blockviz study: error: {message}"]
    assert store.get_study(study_id).workers == ()


def test_checkpoint_is_the_same_job_with_one_requeue_fewer():
    job = cluster.StudyWorkerJob(["-c", "pass"], "/x", {"A": None}, cluster.Requeues("s.db", 4, 2))
    again = job.checkpoint(3)
    assert again.args == (3,)
    assert again.function.args == job.args and again.function.env == {"A": None}
    assert again.function.requeues == cluster.Requeues("s.db", 4, left=1, done=1)
    last = again.function.checkpoint(3).function
    assert last.requeues == cluster.Requeues("s.db", 4, left=0, done=2)
    assert last.checkpoint(3) is None  # none left: submitit does not requeue it
    assert cluster.StudyWorkerJob(["-c", "pass"]).checkpoint() is None


def _warned_job(tmp_path, monkeypatch, left: int):
    """A job whose worker (CHILD) is warned by SIGUSR2 while submitit's own handler is
    installed for it, as in a submitted job (its local flavour: a requeue exits 144)."""
    from submitit.core.job_environment import SignalHandler
    from submitit.core.utils import DelayedSubmission, JobPaths
    from submitit.local.local import LocalJobEnvironment

    monkeypatch.setattr(cluster, "STOP_AGAIN_S", 0.1)
    monkeypatch.setattr(cluster, "WAIT_S", 0.02)
    ready = tmp_path / "ready"
    job = cluster.StudyWorkerJob(
        ["-c", CHILD, str(ready)], requeues=cluster.Requeues("s.db", 1, left)
    )
    delayed = DelayedSubmission(job, 0)
    delayed.set_timeout(60, 3)
    paths = JobPaths(tmp_path, job_id="77")
    handler = SignalHandler(LocalJobEnvironment(), paths, delayed)
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "77")

    def warn() -> None:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGUSR2)

    previous = signal.signal(signal.SIGUSR2, handler.checkpoint_and_try_requeue)
    threading.Thread(target=warn, daemon=True).start()
    return job, paths, previous


def test_a_warned_job_is_requeued_by_submitit_once_its_worker_has_left(
    tmp_path, monkeypatch, capsys
):
    job, paths, previous = _warned_job(tmp_path, monkeypatch, left=2)
    try:
        with pytest.raises(SystemExit) as exited:
            job()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert exited.value.code == 144  # submitit's local "requeue me"
    out = capsys.readouterr().out
    # The worker stopped and left first (its SIGTERMs counted to 2, then exit 7).
    assert "worker 0 exited with status 7" in out
    assert "interrupted (time limit or preemption); requeued (1 more requeue(s) left)" in out
    requeued = pickle.loads(paths.submitted_pickle.read_bytes())
    assert requeued.function.requeues == cluster.Requeues("s.db", 1, left=1, done=1)


def test_a_warned_job_with_no_requeue_left_ends_with_its_workers_status(
    tmp_path, monkeypatch, capsys
):
    job, paths, previous = _warned_job(tmp_path, monkeypatch, left=0)
    try:
        assert job() == 7
    finally:
        signal.signal(signal.SIGUSR2, previous)
    out = capsys.readouterr().out
    assert "not requeued: its 0 requeue(s) (--requeues) are used up" in out
    assert not paths.submitted_pickle.exists()


def _stopped_by_a_time_limit(store: RunStore) -> int:
    """A two-run study whose one worker was stopped by a time limit: one run completed,
    the other stopped, the study settled 'stopped' by the last worker out."""
    study_id = _stored_study(store)
    first, second = store.study_active_runs(study_id)
    store.update_study(study_id, workers=[[study_runner.ELSEWHERE_PID, None]] * 2)
    store.update_run(first, status="completed", ended=time.time())
    store.update_run(second, status="stopped", ended=time.time())
    assert store.settle_study(study_id) == "stopped"
    return study_id


def test_a_requeued_job_resumes_its_study_before_its_worker_starts(store, capsys):
    study_id = _stopped_by_a_time_limit(store)
    requeues = cluster.Requeues(store.location.text, study_id, left=1, done=1)
    job = cluster.StudyWorkerJob(["-c", "pass"], requeues=requeues)
    assert job(0) == 0
    assert (
        "requeued job: study 1: 1 stopped or failed run(s) queued again" in capsys.readouterr().out
    )
    study = store.get_study(study_id)
    assert (study.status, study.error) == ("running", None)
    assert store.study_runs(study_id)["status"].tolist() == ["completed", "queued"]
    # Still two workers of the launch, so each claims its share.
    assert study.workers == ((study_runner.ELSEWHERE_PID, None),) * 2


def test_a_job_requeued_by_slurm_itself_resumes_its_study_too(store, monkeypatch, capsys):
    study_id = _stopped_by_a_time_limit(store)
    job = cluster.StudyWorkerJob(
        ["-c", "pass"], requeues=cluster.Requeues(store.location.text, study_id, left=3)
    )
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # a preemption SLURM requeued
    assert job(0) == 0
    assert store.study_runs(study_id)["status"].tolist() == ["completed", "queued"]
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")  # a first start resumes nothing
    assert not job.restarted()


def test_a_requeued_job_leaves_a_study_a_person_stopped(store, capsys):
    study_id = _stored_study(store)
    study_runner.stop(store, study_id)  # `study stop` while the job waited to start again
    requeues = cluster.Requeues(store.location.text, study_id, left=1, done=1)
    assert cluster.StudyWorkerJob(["-c", "pass"], requeues=requeues)(0) == 0
    assert "study 1 was stopped by `study stop`; it stays stopped" in capsys.readouterr().out
    assert store.get_study(study_id).status == "stopped"
    assert set(store.study_runs(study_id)["status"]) == {"stopped"}


def test_a_requeued_job_that_cannot_reach_its_store_says_so_in_one_line(tmp_path, capsys):
    gone = tmp_path / "gone.db"
    requeues = cluster.Requeues(str(gone), 1, left=1, done=1)
    assert cluster.StudyWorkerJob(["-c", "pass"], requeues=requeues)(0) == 0
    out = capsys.readouterr().out
    assert f"requeued job: could not resume study 1: no run store at {gone}" in out
    assert "Traceback" not in out and not gone.exists()


def test_a_requeued_job_beside_a_live_worker_queues_the_stopped_runs_and_joins(store, capsys):
    """A job that starts again while another worker of its study still trains: `study
    resume` refuses a running study, so the job queues the stopped run itself (its own, left
    by its time limit) without touching the study, and joins."""
    study_id = _stored_study(store)
    first, second = store.study_active_runs(study_id)
    # The other worker, started by the scheduler, trains on another host: its run beats.
    store.update_study(study_id, workers=[[study_runner.ELSEWHERE_PID, None]] * 2)
    store.update_run(first, status="running", pid=1, host="host-b", heartbeat=time.time())
    store.update_run(second, status="stopped", ended=time.time())
    requeues = cluster.Requeues(store.location.text, study_id, left=1, done=1)
    assert cluster.StudyWorkerJob(["-c", "pass"], requeues=requeues)(0) == 0
    out = capsys.readouterr().out
    assert "is still running; 1 stopped or failed run(s) queued again; joining" in out
    assert store.study_runs(study_id)["status"].tolist() == ["running", "queued"]
    assert store.get_study(study_id).status == "running"
