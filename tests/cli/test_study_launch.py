"""`python -m blockviz study launch` for real: a tiny study stored with `--workers 0`, then
its workers started through submitit, on this machine (`--local 2`) and as a SLURM job
array on a one-node cluster (`--slurm`, where one answers: scripts/slurm_local.sh starts
it), each worker running `python -m blockviz study work ID --store STORE`."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from blockviz.launch import cluster
from blockviz.store import RunStore
from tests.fakes import CORPUS
from tests.helpers import study

pytestmark = pytest.mark.slow

# Four 40-step runs of the tiny preset, each alone (--replicas off): about half a second
# of training each, so both workers are up before the first has trained them all.
TINY = ["--preset", "tiny", "--max_steps", "40", "--warmup_steps", "2", "--eval_interval", "20"]
FINISH_S = 180


def _stored_study(tmp_path: Path, store: str) -> str:
    corpus = tmp_path / "fox.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    stored = study(store, "sweep", *TINY, "--dataset", str(corpus), "--lr", "1e-3,2e-3",
                   "--seeds", "2", "--workers", "0", timeout=60)  # fmt: skip
    assert stored.returncode == 0, stored.stderr[-2000:]
    assert "study 1 (sweep, custom): 4 runs stored, no worker started" in stored.stdout
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
