"""Fault injection: kills, stops and locks during training, then resume.

Each test does to blockviz what a crash, an impatient user or another program does, and
checks what the issue promises: nothing lost, nothing clobbered, nothing killed by mistake.
Training runs are the tiny preset on a small corpus (20-40 ms a step on two cores): in
subprocesses where the fault is done to a process (a kill, a signal, a lock held while it
trains), in the test's own process otherwise (`train_here`: no interpreter and torch
import to wait for), as are the resumes after a fault. The fault suite is three files (this one,
test_faults_files.py, test_faults_studies.py) so that pytest-xdist can run them side by side.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from blockviz.launch import runner
from blockviz.store import RunStore
from tests.helpers import (
    FAULT_CADENCE,
    assert_continuous,
    checkpoint_step,
    fault_train,
    finish,
    logged_steps,
    resume_args,
    train_args,
    train_here,
    wait_until,
)

pytestmark = pytest.mark.slow


def _kill_after_checkpoint_then_resume(
    tmp_path: Path, corpus: Path, kill_at: float, capsys: pytest.CaptureFixture[str]
) -> None:
    store_path = tmp_path / "blockviz.db"
    proc = fault_train(store_path, corpus, "--max_steps", "60")
    ckpt = tmp_path / "blockviz.db.runs" / "1" / "checkpoints" / "last.ckpt"
    wait_until(lambda: ckpt.exists() and ckpt.stat().st_mtime > 0)
    time.sleep(kill_at)
    proc.kill()  # kill -9: no handler runs, buffered rows die with the process
    proc.wait()
    code, _, err = train_here(resume_args(store_path, "--max_steps", "60"), capsys)
    assert code == 0, err
    assert_continuous(store_path, 1, 60)


def test_kill_9_right_after_a_checkpoint_then_resume_leaves_no_gap(tmp_path, corpus, capsys):
    # The defect: last.ckpt at step S, rows only up to S - 45; the resume went on from S.
    _kill_after_checkpoint_then_resume(tmp_path, corpus, 0.0, capsys)


@pytest.mark.parametrize("trial", range(2))
def test_kill_9_at_a_random_moment_then_resume_leaves_no_gap(tmp_path, corpus, trial, capsys):
    _kill_after_checkpoint_then_resume(tmp_path, corpus, random.uniform(0.0, 0.8), capsys)


def test_kill_9_of_a_batch_of_replicas_then_resume_leaves_no_gap_in_any(tmp_path, corpus, capsys):
    # The batch's checkpoint is in its own folder; resuming any member resumes all.
    store_path = tmp_path / "blockviz.db"
    proc = fault_train(store_path, corpus, "--max_steps", "60", "--seeds", "0,1,2")
    ckpt = tmp_path / "blockviz.db.runs" / "batches" / "1" / "checkpoints" / "last.ckpt"
    wait_until(lambda: ckpt.exists() and ckpt.stat().st_mtime > 0)
    time.sleep(random.uniform(0.0, 0.8))
    proc.kill()
    proc.wait()
    command = ["train", "--store", str(store_path), "--no_progress", "--resume", "2"]
    code, out, err = train_here(command, capsys)
    assert code == 0, err
    assert "3 replicas of one batch) resuming from step" in out
    for run_id in (1, 2, 3):
        assert_continuous(store_path, run_id, 60)


def test_a_run_killed_after_its_final_checkpoint_is_finished_by_resume(tmp_path, corpus, capsys):
    """It stayed failed for good: `--resume` refused ("already at step 25 of max_steps=25")
    and the page's Resume was off. 1 of 4 random kills landed in this window."""
    store_path = tmp_path / "blockviz.db"
    command = train_args(store_path, corpus, *FAULT_CADENCE, "--max_steps", "25")
    code, _, err = train_here(command, capsys)
    assert code == 0, err
    checkpoint = tmp_path / "blockviz.db.runs" / "1" / "checkpoints" / "last.ckpt"
    assert checkpoint_step(checkpoint) == 25
    saved = checkpoint.read_bytes()
    with RunStore(store_path) as store:
        done = store.get_run(1)
        # What a kill -9 right after last.ckpt at step 25 (written as training ends) leaves:
        # the end's sample and attention map and the last evaluation (25 is no multiple of
        # the eval interval) not yet logged, no final metrics, the run reaped as failed.
        store.truncate_after(1, 24)
        error = "process 1 exited without reporting (killed or out of memory?)"
        store.update_run(1, status="failed", step=25, final=None, ended=time.time(), error=error)
        killed = store.get_run(1)
    assert runner.resume_blocker(killed, checkpoint_exists=True) is None  # Resume is on

    code, out, err = train_here(resume_args(store_path), capsys)
    assert code == 0, err
    assert "run 1 (" in out and ") completed: " in out
    assert logged_steps(store_path, 1, "train/loss") == list(range(25))  # not a step more
    assert logged_steps(store_path, 1, "val/loss") == [10, 20, 25]
    assert checkpoint.read_bytes() == saved
    with RunStore(store_path) as store:
        run = store.get_run(1)
        assert (run.status, run.step, run.error) == ("completed", 25, None)
        assert store.samples(1)["step"].tolist().count(25) == 1
        assert 25 in store.attention_steps(1)
    final, before = run.final, done.final
    for key in ("val_loss", "val_ppl", "val_bpc", "train_loss"):
        assert final[key] == pytest.approx(before[key], rel=1e-5), key
    assert final["steps"] == 25 and final["time_s"] > 0 and final["tokens_per_sec"] > 0
    code, _, err = train_here(resume_args(store_path), capsys)  # not finished twice
    assert code == 2 and "already at step 25 of max_steps=25" in err


def test_sigterm_during_an_evaluation_keeps_that_validation_point(tmp_path, corpus, capsys):
    store_path = tmp_path / "blockviz.db"
    # 4,000 validation batches make the evaluation last seconds: time to land a signal in.
    proc = fault_train(store_path, corpus, "--max_steps", "20", "--eval_iters", "4000")
    wait_until(lambda: store_path.exists() and 9 in logged_steps(store_path, 1, "train/loss"))
    assert 10 not in logged_steps(store_path, 1, "val/loss")  # evaluating step 10 now
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    assert code == 0 and "stopped at step 10" in out, err
    assert 10 in logged_steps(store_path, 1, "val/loss")  # before: lost for good
    code, _, err = train_here(resume_args(store_path, "--max_steps", "20"), capsys)
    assert code == 0, err
    assert_continuous(store_path, 1, 20)


def test_a_resume_with_more_steps_keeps_the_lr_schedule_horizon(tmp_path, corpus, capsys):
    store_path = tmp_path / "blockviz.db"
    flags = ("--warmup_steps", "5", "--lr", "0.002", "--min_lr", "0.0002")
    command = train_args(store_path, corpus, *FAULT_CADENCE, "--max_steps", "30", *flags)
    code, _, err = train_here(command, capsys)
    assert code == 0, err
    code, out, err = train_here(resume_args(store_path, "--max_steps", "50"), capsys)
    assert code == 0, err
    assert "keeps its horizon of 30 steps" in out
    with RunStore(store_path) as store:
        lr = store.scalars(1, names="train/lr").set_index("step")["value"]
    # Before: the cosine was rescaled to 50 steps mid-run and lr jumped back up at 30.
    assert lr[29] == pytest.approx(0.0002, rel=0.05)
    assert all(lr[step] == pytest.approx(0.0002) for step in range(30, 50))


def test_a_lock_held_past_the_busy_timeout_never_fails_the_run(tmp_path, corpus, monkeypatch):
    # The run's busy timeout lowered from its 30 s default, so the lock outlasts it in
    # seconds rather than half a minute (the run process inherits the variable).
    monkeypatch.setenv("BLOCKVIZ_BUSY_TIMEOUT_S", "2")
    store_path = tmp_path / "blockviz.db"
    proc = fault_train(store_path, corpus, "--max_steps", "400", "--eval_interval", "100")
    wait_until(lambda: store_path.exists() and len(logged_steps(store_path, 1, "train/loss")) > 5)
    locker = sqlite3.connect(store_path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")  # another program holds the file for 4 s
    time.sleep(4.0)  # twice the busy timeout, which used to end the run
    locker.execute("COMMIT")
    locker.close()
    code, out, err = finish(proc)
    assert code == 0 and "completed" in out, err
    assert logged_steps(store_path, 1, "train/loss") == list(range(400))
    log = (tmp_path / "blockviz.db.runs" / "1" / "train.log").read_text()
    assert "locked by another process" in log and "writable again" in log


def test_two_stores_in_one_folder_keep_their_own_run_folders(tmp_path, corpus, capsys):
    first, second = tmp_path / "blockviz.db", tmp_path / "other.db"
    for store_path, name in ((first, "first-run"), (second, "second-run")):
        flags = (*FAULT_CADENCE, "--max_steps", "10", "--name", name)
        code, _, err = train_here(train_args(store_path, corpus, *flags), capsys)
        assert code == 0, err
    for store_path, name in ((first, "first-run"), (second, "second-run")):
        with RunStore(store_path) as store:
            folder = store.run_dir(1)
            assert folder == store_path.parent / f"{store_path.name}.runs" / "1"
            assert (folder / "checkpoints" / "last.ckpt").is_file()
            assert name in (folder / "train.log").read_text()


def test_an_upgraded_version_1_store_finds_its_old_run_folders(tmp_path):
    store_path = tmp_path / "blockviz.db"
    with RunStore(store_path) as store:
        old = store.create_run("old", "{}", status="completed")
    with sqlite3.connect(store_path) as conn:  # what version 1 wrote
        conn.execute("DROP INDEX samples_series")
        conn.execute("CREATE INDEX samples_run_step ON samples (run_id, step)")
        conn.execute("ALTER TABLE runs DROP COLUMN pid_started")
        conn.execute("ALTER TABLE runs DROP COLUMN tags")
        conn.execute("ALTER TABLE runs DROP COLUMN notes")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    (tmp_path / str(old) / "checkpoints").mkdir(parents=True)
    with RunStore(store_path, readonly=True) as reader:  # read as it is, not upgraded
        assert reader.get_run(old).pid_started is None
    with RunStore(store_path) as store:
        assert store.run_dir(old) == tmp_path / str(old)
        new = store.create_run("new", "{}")
        assert store.run_dir(new) == store.runs_root / str(new)
