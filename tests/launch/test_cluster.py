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
