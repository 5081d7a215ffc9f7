"""`python -m blockviz study ...`: a tiny study end to end in real worker processes."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blockviz.core import config as cfg
from blockviz.core import hardware
from blockviz.core.studies import sweeps
from blockviz.launch import study_runner
from blockviz.store import RunStore
from tests.fakes import CORPUS
from tests.helpers import study

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--preset", "tiny", "--max_steps", "20", "--warmup_steps", "2", "--eval_interval", "10"]

pytestmark = pytest.mark.slow


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "fox.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


def test_a_two_by_two_sweep_runs_to_the_end(tmp_path: Path, corpus: Path) -> None:
    store_path = tmp_path / "runs.db"
    done = study(store_path, "sweep", *TINY, "--dataset", str(corpus), "--lr", "1e-3,3e-3",
                 "--seeds", "2", "--workers", "1", "--threads", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "4 runs (2 variants × 2 seeds)" in done.stdout
    assert "; 1 worker(s) at once, 1 thread each, and no other run" in done.stdout
    with RunStore(store_path) as store:
        (study_id,) = store.studies_frame()["id"].tolist()
        assert store.get_study(study_id).status == "completed"
        runs = store.study_runs(study_id)
        assert runs["status"].tolist() == ["completed"] * 4
        assert runs["variant"].tolist() == ["lr 0.001"] * 2 + ["lr 0.003"] * 2
        assert runs["seed"].tolist() == [1, 2, 1, 2]
        configs = [store.get_run(int(i)).config for i in runs["id"]]
        assert [c["train"]["lr"] for c in configs] == [1e-3, 1e-3, 3e-3, 3e-3]
        assert [c["train"]["seed"] for c in configs] == [1, 2, 1, 2]
        # One worker trained them all: one process id for every run, one thread each, the
        # four (one shape) as one batch of replicas.
        assert runs["pid"].nunique() == 1
        devices = {store.get_run(int(i)).device for i in runs["id"]}
        assert devices == {"cpu, 1 thread, 4 replicas"}
    listing = study(store_path, "list")
    assert listing.returncode == 0 and "completed" in listing.stdout and "4/4" in listing.stdout
    shown = study(store_path, "show", str(study_id))
    assert shown.returncode == 0, shown.stderr
    assert "4/4 done" in shown.stdout


def test_a_study_on_a_second_seed_set_is_shown_beside_the_first(
    tmp_path: Path, corpus: Path
) -> None:
    """Issue 38: `--seeds 3-4` runs new seeds (not 1..N), and `study show` names both sets
    of the one definition, each judged alone."""
    store_path = tmp_path / "runs.db"
    for seeds in ("1-2", "3-4"):
        done = study(store_path, "sweep", "--size", "quick", *TINY[2:], "--dataset",
                     str(corpus), "--lr", "1e-3,3e-3", "--seeds", seeds, "--workers", "1",
                     "--threads", "1")  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert "4 runs (2 variants × 2 seeds)" in done.stdout
    with RunStore(store_path) as store:
        assert store.study_runs(2)["seed"].tolist() == [3, 4, 3, 4]
    for shown_id, other_id, own, other in ((1, 2, "1–2", "3–4"), (2, 1, "3–4", "1–2")):
        shown = study(store_path, "show", str(shown_id))
        assert shown.returncode == 0, shown.stderr
        assert (
            f"seed sets of this definition: seeds {own} (study {shown_id}, this one); "
            f"seeds {other} (study {other_id})"
        ) in shown.stdout


def test_a_stopped_study_resumes_and_finishes(tmp_path: Path, corpus: Path) -> None:
    store_path = tmp_path / "runs.db"
    started = study(store_path, "sweep", *TINY, "--dataset", str(corpus), "--lr",
                    "1e-3,2e-3,3e-3", "--detach")  # fmt: skip
    assert started.returncode == 0, started.stderr[-2000:]
    stopped = study(store_path, "stop", "1")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    with RunStore(store_path) as store:
        deadline = time.monotonic() + 60
        while store.study_active_runs(1) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert store.get_study(1).status == "stopped"
        statuses = store.study_runs(1)["status"].tolist()
        assert "queued" not in statuses and "running" not in statuses
        assert "stopped" in statuses  # at least the runs no worker had claimed
    again = study(store_path, "resume", "1")
    assert again.returncode == 0 and "queued again" in again.stdout
    with RunStore(store_path) as store:
        deadline = time.monotonic() + 120
        while store.get_study(1).status == "running" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert store.get_study(1).status == "completed"
        assert store.study_runs(1)["status"].tolist() == ["completed"] * 3
        assert study_runner.progress(store, 1).finished == 3
        # By default each run takes its share of the cores: cores ÷ run slots.
        share = hardware.threads_text(hardware.share_of_cores(hardware.default_slots()))
        devices = {store.get_run(int(i)).device for i in store.study_runs(1)["id"]}
        # (a batch of replicas adds ", K replicas")
        assert {re.sub(r", \d+ replicas$", "", d) for d in devices} == {f"cpu, {share}"}
    assert "nothing to resume" in study(store_path, "resume", "1").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "--lr", "1e-3,x"], "lr: 'x' is not allowed"),
        (["sweep", "--n_layer", "2"], "name at least one field with two or more values"),
        (["run", "activation", "--seeds", "0"], "seeds: 0"),
        (["run", "activation", "--seeds", "8-5"], "seeds: the range '8-5' runs backwards"),
        (["sweep", "--lr", "1e-3,3e-3", "--seeds", "1,x"], "seeds: 'x' is not a seed"),
        (
            ["run", "activation", "--workers", "-1"],
            "--workers: -1 is not allowed; must be at least 0",
        ),
        (["show", "9"], "no study 9"),
        (["stop", "x/../y"], "by its number"),
    ],
)
def test_bad_study_commands_get_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    RunStore(tmp_path / "runs.db").close()  # a store without that study (a missing one is said so)
    done = study(tmp_path / "runs.db", *args, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# ------------------------------------------------------- a store taken from under a worker


def _three_run_study(store_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """A stored study of three tiny 30-step runs, with no worker started for it."""
    monkeypatch.setattr(study_runner, "start_workers", lambda *a, **k: [])
    base = cfg.replace(cfg.preset("tiny"), dataset=str(corpus))
    plan = sweeps.sweep({"lr": [1e-3, 2e-3, 3e-3]}, base=base, max_steps=30)
    with RunStore(store_path) as store:
        return study_runner.launch(store, plan)


def _running_runs(store_path: Path) -> int:
    """How many runs the store calls running (read-only: never creates the file)."""
    with sqlite3.connect(f"{store_path.as_uri()}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'running'").fetchone()[0]


def test_a_worker_whose_store_is_deleted_stops_in_one_line_and_creates_nothing(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to train on, re-create an empty store at the path and count runs it failed."""
    store_path = tmp_path / "runs.db"
    study_id = _three_run_study(store_path, corpus, monkeypatch)
    command = [sys.executable, "-m", "blockviz", "study", "work", str(study_id)]
    command += ["--store", str(store_path), "--threads", "1"]
    worker = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 120
    while _running_runs(store_path) == 0 and worker.poll() is None:
        assert time.monotonic() < deadline, "the worker started no run"
        time.sleep(0.1)
    for path in (
        store_path,
        *(store_path.with_name(store_path.name + s) for s in ("-wal", "-shm")),
    ):
        path.unlink(missing_ok=True)
    out, _ = worker.communicate(timeout=120)
    assert worker.returncode == 1, out[-2000:]
    assert f"study {study_id}: the run store {store_path} was removed" in out
    assert "Traceback" not in out and "failed to start" not in out
    assert not store_path.exists()


def test_a_worker_whose_store_is_replaced_stops_and_leaves_the_new_file_alone(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from blockviz.training import study_worker

    store_path = tmp_path / "runs.db"
    study_id = _three_run_study(store_path, corpus, monkeypatch)
    other = tmp_path / "other.db"
    RunStore(other).close()
    replacement = other.read_bytes()
    trained: list[int] = []

    def train_runs(store: RunStore, run_ids: list[int], *args: object) -> int:
        if not trained:  # another store moved over the path while the first run trains
            os.replace(other, store_path)
        trained.extend(run_ids)
        return 0

    monkeypatch.setattr(study_worker, "train_runs", train_runs)
    # One run at a time (--replicas off), so that there is a next claim to refuse.
    assert study_worker.work(str(store_path), study_id, 0, 1, 1) == 1
    err = capsys.readouterr().err
    assert f"study {study_id}: the run store {store_path} was replaced" in err
    assert len(trained) == 1 and store_path.read_bytes() == replacement


def test_a_worker_hands_freed_memory_back_after_every_run(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its RSS grew 3.6 MiB a run over a 42-run study (glibc keeping freed heap)."""
    from blockviz.training import study_worker

    real_release = study_worker.release_freed_memory
    store_path = tmp_path / "runs.db"
    study_id = _three_run_study(store_path, corpus, monkeypatch)
    events: list[str] = []

    def train_runs(store: RunStore, run_ids: list[int], *args: object) -> int:
        for run_id in run_ids:
            store.update_run(run_id, status="completed")
        events.append(f"batch of {len(run_ids)}")
        return 0

    monkeypatch.setattr(study_worker, "train_runs", train_runs)
    monkeypatch.setattr(study_worker, "release_freed_memory", lambda: events.append("trim"))
    assert study_worker.work(str(store_path), study_id, 0, 1, 1) == 0  # one run at a time
    assert events == ["batch of 1", "trim"] * 3

    # A batch of replicas: one trim after the batch.
    events.clear()
    study_id = _three_run_study(tmp_path / "again.db", corpus, monkeypatch)
    assert study_worker.work(str(tmp_path / "again.db"), study_id, 0, 1) == 0
    assert events == ["batch of 3", "trim"]
    # The real release: True with glibc, False elsewhere; it never raises.
    assert isinstance(real_release(), bool)


def test_the_hints_after_a_stored_study_paste_as_printed(tmp_path: Path, capsys) -> None:
    """`study sweep --workers 0` printed `study launch 1 --slurm ...` and `study work ...`
    without `--store` (pasted, they read the default store and created runs/blockviz.db)
    and unquoted (an `&` in the path or URL broke the shell)."""
    import shlex

    from blockviz import cli

    store = tmp_path / "a b&c" / "runs.db"
    argv = ["study", "sweep", "--lr", "1e-3,2e-3", "--workers", "0", "--store", str(store)]
    assert cli.main(argv) == 0
    hints = re.findall(r"`([^`]*study (?:launch|work|show) [^`]*)`", capsys.readouterr().out)
    assert len(hints) >= 2, hints
    for hint in hints:
        words = shlex.split(hint)
        assert words[words.index("--store") + 1] == str(store), hint
