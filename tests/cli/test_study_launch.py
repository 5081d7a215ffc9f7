"""`python -m blockviz study launch` for real: a tiny study stored with `--workers 0`, then
its workers started through submitit, on this machine (`--local 2`) and as a SLURM job
array on a one-node cluster (`--slurm`, where one answers: scripts/slurm_local.sh starts
it), each worker running `python -m blockviz study work ID --store STORE`."""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from blockviz.launch import cluster
from blockviz.store import RunStore
from tests.fakes import CORPUS
from tests.helpers import study, wait_until

pytestmark = pytest.mark.slow

# Four 40-step runs of the tiny preset, each alone (--replicas off): about half a second
# of training each, so both workers are up before the first has trained them all.
TINY = ["--preset", "tiny", "--max_steps", "40", "--warmup_steps", "2", "--eval_interval", "20"]
FINISH_S = 180


def _stored_study(tmp_path: Path, store: str, *sweep: str) -> str:
    """Study 1 stored with no worker: four tiny 40-step runs, or the `sweep` given."""
    corpus = tmp_path / "fox.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    sweep = sweep or ("--lr", "1e-3,2e-3", "--seeds", "2")
    stored = study(store, "sweep", *TINY, "--dataset", str(corpus), *sweep, "--workers", "0",
                   timeout=60)  # fmt: skip
    assert stored.returncode == 0, stored.stderr[-2000:]
    assert "study 1 (sweep, custom): " in stored.stdout
    assert "runs stored, no worker started" in stored.stdout
    return store


def _trained_once_by_two_workers(store: str, folder: Path, pattern: str) -> None:
    """Wait for study 1 to end; every run completed, each started once, by one of the two
    workers (their logs: `pattern` in `folder`), and each worker trained some."""
    with RunStore(store) as opened:
        deadline = time.monotonic() + FINISH_S
        while opened.get_study(1).status == "running" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert opened.get_study(1).status == "completed"
        runs = opened.study_runs(1)
        assert runs["status"].tolist() == ["completed"] * 4
        assert runs["pid"].nunique() == 2  # the worker that claimed each run
    # The last worker marks the study completed a moment before it and its job leave.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = sorted(folder.glob(pattern))
        if len(found) == 2 and all("exited with status" in f.read_text() for f in found):
            break
        time.sleep(0.2)
    logs = sorted(folder.glob(pattern))
    assert len(logs) == 2
    started = [
        [int(i) for i in re.findall(r"^blockviz: run (\d+) \(.*\) started", log.read_text(), re.M)]
        for log in logs
    ]
    assert sorted(started[0] + started[1]) == [1, 2, 3, 4], started
    assert all(started), started
    for log in logs:
        assert "this worker trained" in log.read_text()
        assert "exited with status 0" in log.read_text()


def test_launch_local_trains_every_run_once_on_two_workers(tmp_path: Path, pg_url: str) -> None:
    # On a PostgreSQL store, as on a cluster (the SLURM test below uses an SQLite file).
    store = _stored_study(tmp_path, f"{pg_url}?runs={tmp_path / 'shared'}")
    began = time.monotonic()
    launched = study(store, "launch", "1", "--local", "2", "--replicas", "off", "--threads",
                     "1", timeout=60)  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-2000:]
    assert "started 2 worker(s) on this machine" in launched.stdout
    with RunStore(store) as opened:
        # The command ended with the workers just started, not when they were done (their
        # controllers once inherited its stdout, so a caller's pipe stayed open until then).
        assert opened.get_study(1).status == "running"
        folder = opened.study_dir(1) / cluster.JOBS_DIR
        text = opened.location.text
    assert folder == tmp_path / "shared" / "studies" / "1" / cluster.JOBS_DIR
    assert f"the jobs' logs: {folder}" in launched.stdout
    # As a shell takes it: the URL quoted (its `?` and `&`), no password in it.
    work = ["study", "work", "1", "--store", text, "--threads", "1", "--replicas", "1"]
    assert f"python -m blockviz {shlex.join(work)}`" in launched.stdout
    shown = study(store, "show", "1", timeout=60)
    assert "interrupted" not in shown.stdout  # its workers are alive here
    _trained_once_by_two_workers(store, folder, "*_log.out")
    print(f"launch --local 2: study done in {time.monotonic() - began:.1f} s")


def _slurm_answers() -> str | None:
    """Why there is no SLURM cluster to test on, or None when one answers."""
    if shutil.which("sbatch") is None or shutil.which("srun") is None:
        return "sbatch is not on PATH (scripts/slurm_local.sh starts a one-node SLURM cluster)"
    try:
        info = subprocess.run(
            ["sinfo", "--noheader", "--responding", "--format=%T"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo did not answer: {exc}"
    if info.returncode != 0:
        return f"no SLURM cluster answers: {' '.join(info.stderr.split())[:200]}"
    if not re.search(r"\b(idle|mixed)\b", info.stdout):
        return f"no idle SLURM node: sinfo says {info.stdout.split()}"
    return None


def test_launch_slurm_runs_the_workers_as_one_job_array(tmp_path: Path) -> None:
    why = _slurm_answers()
    if why is not None:
        pytest.skip(why)
    store = _stored_study(tmp_path, str(tmp_path / "runs.db"))
    began = time.monotonic()
    launched = study(store, "launch", "1", "--slurm", "--workers", "2", "--array_parallelism",
                     "2", "--time_min", "10", "--replicas", "off", "--threads", "1",
                     timeout=60)  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-2000:]
    found = re.search(r"submitted 2 worker\(s\) to SLURM, job\(s\) (\d+)_0, \1_1", launched.stdout)
    assert found, launched.stdout
    folder = Path(f"{store}.studies") / "1" / cluster.JOBS_DIR
    array = found.group(1)
    script = (folder / f"{array}_submission.sh").read_text()
    assert "#SBATCH --array=0-1%2" in script and "#SBATCH --time=10" in script
    try:
        _trained_once_by_two_workers(store, folder, f"{array}_*_log.out")
    finally:
        subprocess.run(["scancel", array], capture_output=True, timeout=20)
    print(f"launch --slurm --workers 2: study done in {time.monotonic() - began:.1f} s")


# ------------------------------------------- requeued after a time limit or a preemption

# Two runs, one at a time: a short one, then one long enough to be interrupted mid-run.
SHORT_THEN = ("--replicas", "off", "--threads", "1")


def _short_then_long(tmp_path: Path, long_steps: int) -> str:
    """Study 1 on an SQLite file: run 1 of 40 steps, run 2 of `long_steps`."""
    store = str(tmp_path / "runs.db")
    return _stored_study(tmp_path, store, "--max_steps", f"40,{long_steps}")


def _when_run_2_trains(store: str, timeout: float = 120) -> None:
    """Wait until run 2 has logged a step (so an interruption stops it mid-run)."""

    def trains() -> bool:
        run = opened.get_run(2)
        return run.status == "running" and (run.step or 0) > 5

    with RunStore(store) as opened:
        wait_until(trains, timeout=timeout, every=0.2)


def _job_done(store: str, pattern: str, timeout: float) -> str:
    """The one job's log once the job has returned for good (between a requeue and the
    job's next start the study reads 'stopped' for a while)."""
    folder = Path(f"{store}.studies") / "1" / cluster.JOBS_DIR
    done = "Exiting after successful completion"  # submitit, when the call returned
    wait_until(lambda: any(done in log.read_text() for log in folder.glob(pattern)),
               timeout=timeout, every=0.5)  # fmt: skip
    (log,) = folder.glob(pattern)
    return log.read_text()


def _study_end(store: str) -> tuple[str, str | None, list[str]]:
    """Study 1's status, error and its runs' statuses."""
    with RunStore(store) as opened:
        ended = opened.get_study(1)
        return str(ended.status), ended.error, opened.study_runs(1)["status"].tolist()


def test_a_local_job_warned_mid_run_is_requeued_and_its_study_finishes(tmp_path: Path) -> None:
    """submitit's local executor warns a job as SLURM does (SIGUSR2) and starts it again
    when it asks: the same requeue path, on any machine."""
    store = _short_then_long(tmp_path, 400)
    began = time.monotonic()
    launched = study(store, "launch", "1", "--local", "1", "--requeues", "1", *SHORT_THEN,
                     timeout=60)  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-2000:]
    controller = int(re.search(r"job\(s\) (\d+)", launched.stdout).group(1))
    _when_run_2_trains(store)
    (task,) = psutil.Process(controller).children()  # the job's process: submitit's
    task.send_signal(signal.SIGUSR2)
    log = _job_done(store, "*_log.out", 180)
    assert _study_end(store) == ("completed", None, ["completed", "completed"])
    assert log.count("Starting with JobEnvironment") == 2
    assert "interrupted (time limit or preemption); requeued (0 more requeue(s) left)" in log
    assert "requeued job: study 1: 1 stopped or failed run(s) queued again" in log
    print(f"launch --local 1, warned once: study done in {time.monotonic() - began:.1f} s")


def _slurm_launch(store: str, *flags: str) -> str:
    """`study launch 1 --slurm` with `flags`; the job id."""
    why = _slurm_answers()
    if why is not None:
        pytest.skip(why)
    launched = study(store, "launch", "1", "--slurm", *flags, *SHORT_THEN, timeout=60)
    assert launched.returncode == 0, launched.stderr[-2000:]
    found = re.search(r"submitted 1 worker\(s\) to SLURM, job\(s\) (\d+)", launched.stdout)
    assert found, launched.stdout
    return found.group(1)


def test_a_preempted_slurm_job_is_requeued_up_to_its_bound(tmp_path: Path) -> None:
    """A preemption as a cluster that gives notice sends it: SIGUSR2 to the job's steps
    (`scancel --signal=USR2`, as submitit's own tests interrupt a job; this one-node
    cluster cancels a preempted step at once, see docs/studies.md). Requeued once
    (`--requeues 1`): the second interruption ends the job, and the study says so."""
    store = _short_then_long(tmp_path, 3000)
    began = time.monotonic()
    job = _slurm_launch(store, "--time_min", "10", "--requeues", "1")
    try:
        for _ in range(2):
            _when_run_2_trains(store)
            subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=20)
            with RunStore(store) as opened:
                wait_until(lambda: opened.get_run(2).status != "running", timeout=60)
        log = _job_done(store, f"{job}_0_log.out", 120)
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=20)
    status, error, runs = _study_end(store)
    assert (status, runs) == ("stopped", ["completed", "stopped"])
    assert error == (
        "1 of 2 runs failed or stopped; `.venv/bin/python -m blockviz study resume 1` trains "
        "them again"
    )
    assert log.count("Starting with JobEnvironment") == 2
    assert "requeued (0 more requeue(s) left)" in log
    assert "requeued job: study 1: 1 stopped or failed run(s) queued again" in log
    assert "not requeued: its 1 requeue(s) (--requeues) are used up" in log
    print(f"launch --slurm, preempted twice: done in {time.monotonic() - began:.1f} s")


LONG_STEPS = 2500  # about 40 s of training on one quiet core: more than one 1-minute job


def test_a_run_longer_than_the_time_limit_finishes_across_requeued_jobs(tmp_path: Path) -> None:
    """The fault: a study whose run outlasts SLURM's time limit (1 minute, warned 30 s
    before) completes through `study launch --slurm` with no command typed after it, every
    step of the long run logged once."""
    store = _short_then_long(tmp_path, LONG_STEPS)
    began = time.monotonic()
    job = _slurm_launch(store, "--time_min", "1", "--requeues", "5")
    try:
        log = _job_done(store, f"{job}_0_log.out", 400)
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=20)
    ended = _study_end(store)
    jobs = log.count("Starting with JobEnvironment")
    print(f"launch --slurm --time_min 1: {ended[0]} after {jobs} job(s), "
          f"{time.monotonic() - began:.1f} s")  # fmt: skip
    assert ended == ("completed", None, ["completed", "completed"])
    assert jobs >= 2 and "requeued job: study 1: 1 stopped or failed run(s) queued" in log
    with RunStore(store) as opened:
        steps = opened.scalars(2, names="train/loss")["step"].tolist()
    assert steps == list(range(LONG_STEPS))
