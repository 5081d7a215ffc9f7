"""Fault injection: kills, stops, locks, reused pids, shared folders, damaged files.

Each test does to blockviz what a crash, an impatient user or another program does, and
checks what the issue promises: nothing lost, nothing clobbered, nothing killed by mistake.
Training runs are the tiny preset on a small corpus in subprocesses (about a second of
start-up plus 20-40 ms a step on two cores).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from blockviz.core import procs
from blockviz.launch import runner
from blockviz.store import RunStore, StoreError
from tests.fakes import CORPUS
from tests.helpers import finish, start, study, train_command

pytestmark = pytest.mark.slow

# Short evaluations and checkpoints every 10 steps, probes every 5, samples every 10.
CADENCE = [
    *("--eval_interval", "10", "--probe_interval", "5", "--sample_interval", "10"),
    *("--eval_iters", "2"),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "fox.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


def _train(store: Path, corpus: Path, *flags: str) -> subprocess.Popen:
    return start(train_command(store, corpus, *CADENCE, *flags))


def _resume(store: Path, *flags: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "blockviz", "train", "--store", str(store), "--no_progress"]
    return start([*command, "--resume", "1", *flags])


def _logged_steps(store_path: Path, run_id: int, name: str) -> list[int]:
    with RunStore(store_path) as store:
        return store.scalars(run_id, names=name)["step"].tolist()


def _wait(predicate, timeout: float = 90.0, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"condition not reached in {timeout} s")


def _checkpoint_step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


def _assert_continuous(store_path: Path, run_id: int, max_steps: int) -> None:
    """Every logged series holds each of its steps exactly once, with no gap."""
    assert _logged_steps(store_path, run_id, "train/loss") == list(range(max_steps))
    assert _logged_steps(store_path, run_id, "val/loss") == list(range(10, max_steps + 1, 10))
    with RunStore(store_path) as store:
        probed = store.layer_steps(run_id, kind="component", stat="grad_norm")
        # every 5 steps, and the last trained step (issue 12: the last step is probed)
        assert probed == sorted({*range(0, max_steps, 5), max_steps - 1})
        samples = store.samples(run_id)["step"].tolist()
        assert sorted(samples) == sorted(set(samples))  # one sample per step
        assert set(range(0, max_steps, 10)) <= set(samples)
        run = store.get_run(run_id)
    assert run.status == "completed" and run.step == max_steps


def _kill_after_checkpoint_then_resume(tmp_path: Path, corpus: Path, kill_at: float) -> None:
    store_path = tmp_path / "blockviz.db"
    proc = _train(store_path, corpus, "--max_steps", "60")
    ckpt = tmp_path / "blockviz.db.runs" / "1" / "checkpoints" / "last.ckpt"
    _wait(lambda: ckpt.exists() and ckpt.stat().st_mtime > 0)
    time.sleep(kill_at)
    proc.kill()  # kill -9: no handler runs, buffered rows die with the process
    proc.wait()
    code, _, err = finish(_resume(store_path, "--max_steps", "60"))
    assert code == 0, err
    _assert_continuous(store_path, 1, 60)


def test_kill_9_right_after_a_checkpoint_then_resume_leaves_no_gap(tmp_path, corpus):
    # The defect: last.ckpt at step S, rows only up to S - 45; the resume went on from S.
    _kill_after_checkpoint_then_resume(tmp_path, corpus, kill_at=0.0)


@pytest.mark.parametrize("trial", range(2))
def test_kill_9_at_a_random_moment_then_resume_leaves_no_gap(tmp_path, corpus, trial):
    _kill_after_checkpoint_then_resume(tmp_path, corpus, kill_at=random.uniform(0.0, 0.8))


def test_kill_9_of_a_batch_of_replicas_then_resume_leaves_no_gap_in_any(tmp_path, corpus):
    # The batch's checkpoint is in its own folder; resuming any member resumes all.
    store_path = tmp_path / "blockviz.db"
    proc = _train(store_path, corpus, "--max_steps", "60", "--seeds", "0,1,2")
    ckpt = tmp_path / "blockviz.db.runs" / "batches" / "1" / "checkpoints" / "last.ckpt"
    _wait(lambda: ckpt.exists() and ckpt.stat().st_mtime > 0)
    time.sleep(random.uniform(0.0, 0.8))
    proc.kill()
    proc.wait()
    command = [sys.executable, "-m", "blockviz", "train", "--store", str(store_path)]
    code, out, err = finish(start([*command, "--no_progress", "--resume", "2"]))
    assert code == 0, err
    assert "3 replicas of one batch) resuming from step" in out
    for run_id in (1, 2, 3):
        _assert_continuous(store_path, run_id, 60)


def test_a_run_killed_after_its_final_checkpoint_is_finished_by_resume(tmp_path, corpus):
    """It stayed failed for good: `--resume` refused ("already at step 25 of max_steps=25")
    and the page's Resume was off. 1 of 4 random kills landed in this window."""
    store_path = tmp_path / "blockviz.db"
    code, _, err = finish(_train(store_path, corpus, "--max_steps", "25"))
    assert code == 0, err
    checkpoint = tmp_path / "blockviz.db.runs" / "1" / "checkpoints" / "last.ckpt"
    assert _checkpoint_step(checkpoint) == 25
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

    code, out, err = finish(_resume(store_path))
    assert code == 0, err
    assert "run 1 (" in out and ") completed: " in out
    assert _logged_steps(store_path, 1, "train/loss") == list(range(25))  # not a step more
    assert _logged_steps(store_path, 1, "val/loss") == [10, 20, 25]
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
    code, _, err = finish(_resume(store_path))  # a completed run is not finished twice
    assert code == 2 and "already at step 25 of max_steps=25" in err


def test_sigterm_during_an_evaluation_keeps_that_validation_point(tmp_path, corpus):
    store_path = tmp_path / "blockviz.db"
    # 4,000 validation batches make the evaluation last seconds: time to land a signal in.
    proc = _train(store_path, corpus, "--max_steps", "20", "--eval_iters", "4000")
    _wait(lambda: store_path.exists() and 9 in _logged_steps(store_path, 1, "train/loss"))
    assert 10 not in _logged_steps(store_path, 1, "val/loss")  # evaluating step 10 now
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    assert code == 0 and "stopped at step 10" in out, err
    assert 10 in _logged_steps(store_path, 1, "val/loss")  # before: lost for good
    code, _, err = finish(_resume(store_path, "--max_steps", "20"))
    assert code == 0, err
    _assert_continuous(store_path, 1, 20)


def test_a_resume_with_more_steps_keeps_the_lr_schedule_horizon(tmp_path, corpus):
    store_path = tmp_path / "blockviz.db"
    flags = ("--warmup_steps", "5", "--lr", "0.002", "--min_lr", "0.0002")
    code, _, err = finish(_train(store_path, corpus, "--max_steps", "30", *flags))
    assert code == 0, err
    code, out, err = finish(_resume(store_path, "--max_steps", "50"))
    assert code == 0, err
    assert "keeps its horizon of 30 steps" in out
    with RunStore(store_path) as store:
        lr = store.scalars(1, names="train/lr").set_index("step")["value"]
    # Before: the cosine was rescaled to 50 steps mid-run and lr jumped back up at 30.
    assert lr[29] == pytest.approx(0.0002, rel=0.05)
    assert all(lr[step] == pytest.approx(0.0002) for step in range(30, 50))


def test_a_lock_held_past_the_busy_timeout_never_fails_the_run(tmp_path, corpus):
    store_path = tmp_path / "blockviz.db"
    proc = _train(store_path, corpus, "--max_steps", "400", "--eval_interval", "100")
    _wait(lambda: store_path.exists() and len(_logged_steps(store_path, 1, "train/loss")) > 5)
    locker = sqlite3.connect(store_path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")  # another program holds the file for 32 s
    time.sleep(32.0)  # longer than the 30 s busy timeout that used to end the run
    locker.execute("COMMIT")
    locker.close()
    code, out, err = finish(proc)
    assert code == 0 and "completed" in out, err
    assert _logged_steps(store_path, 1, "train/loss") == list(range(400))
    log = (tmp_path / "blockviz.db.runs" / "1" / "train.log").read_text()
    assert "locked by another process" in log and "writable again" in log


def test_two_stores_in_one_folder_keep_their_own_run_folders(tmp_path, corpus):
    first, second = tmp_path / "blockviz.db", tmp_path / "other.db"
    for store_path, name in ((first, "first-run"), (second, "second-run")):
        code, _, err = finish(_train(store_path, corpus, "--max_steps", "10", "--name", name))
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


# ------------------------------------------------------------ processes and liveness


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_reused_pid_is_never_signalled_and_its_run_is_failed(tmp_path):
    store = RunStore(tmp_path / "blockviz.db")
    bystander = _sleeper()  # an unrelated process that now has the run's old pid
    try:
        real = procs.identity_of(bystander.pid)
        stale = time.time() - 120
        reused = store.create_run(
            "reused", "{}", status="running", pid=real.pid, pid_started=real.started - 50
        )
        legacy = store.create_run("legacy", "{}", status="running", pid=real.pid)  # v1 row
        store.update_run(reused, heartbeat=stale)
        store.update_run(legacy, heartbeat=stale)
        assert runner.stop(store, reused) == f"its process {real.pid} is gone; marked failed"
        assert sorted(store.reap_dead()) == [legacy]  # no blockviz in its command line
        time.sleep(0.3)
        assert bystander.poll() is None  # before: SIGTERM killed it (exit 143)
        assert {store.get_run(r).status for r in (reused, legacy)} == {"failed"}
        assert not procs.signal_own(real.pid, real.started - 50)
    finally:
        bystander.kill()
        bystander.wait()
        store.close()


def test_a_killed_child_that_was_never_waited_for_is_reaped(tmp_path):
    store = RunStore(tmp_path / "blockviz.db")
    child = _sleeper()
    me = procs.identity_of(child.pid)
    run_id = store.create_run("zombie", "{}", status="running", pid=me.pid, pid_started=me.started)
    os.kill(child.pid, signal.SIGKILL)
    _wait(lambda: not procs.is_alive(me.pid, me.started), timeout=10)
    assert Path(f"/proc/{child.pid}").exists()  # a zombie: kill(pid, 0) still succeeds
    store.update_run(run_id, heartbeat=time.time() - 40)
    assert store.reap_dead() == [run_id]  # before: the zombie looked alive for ever
    child.wait()
    store.close()


def test_cli_stop_and_runner_stop_share_one_implementation(tmp_path):
    from blockviz import cli

    store = RunStore(tmp_path / "blockviz.db")
    bystander = _sleeper()
    try:
        real = procs.identity_of(bystander.pid)
        run_id = store.create_run(
            "reused", "{}", status="running", pid=real.pid, pid_started=real.started + 7
        )
        store.close()
        assert cli.main(["stop", str(run_id), "--store", str(tmp_path / "blockviz.db")]) == 0
        time.sleep(0.3)
        assert bystander.poll() is None  # the CLI's own check was the command line
    finally:
        bystander.kill()
        bystander.wait()


# ------------------------------------------------------------ files: read-only, corrupt


@pytest.fixture
def small_run(tmp_path, corpus) -> Path:
    store_path = tmp_path / "ws" / "blockviz.db"
    code, _, err = finish(_train(store_path, corpus, "--max_steps", "10"))
    assert code == 0, err
    return store_path


@contextlib.contextmanager
def _tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A small tmpfs at `mount` (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("a tmpfs mount (a read-only or full disk) needs root; CI runs as root")
    mount.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)]
    ).returncode:
        pytest.skip("this machine refuses tmpfs mounts (no CAP_SYS_ADMIN)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_store_on_a_read_only_filesystem_can_be_listed_shown_and_exported(small_run, tmp_path):
    from blockviz import cli

    with _tmpfs(tmp_path / "ro", "16m") as mount:
        subprocess.run(["cp", "-a", str(small_run.parent), str(mount)], check=True)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        store = str(mount / "ws" / "blockviz.db")
        assert cli.main(["runs", "--store", store]) == 0
        assert cli.main(["show", "1", "--store", store]) == 0
        out = tmp_path / "figures"
        assert (
            cli.main(["export", "1", "--out", str(out), "--format", "csv", "--store", store]) == 0
        )
        assert any(out.rglob("*.csv"))


def test_a_corrupt_store_is_reported_not_read(small_run, tmp_path, capsys):
    from blockviz import cli

    size = small_run.stat().st_size
    with open(small_run, "r+b") as fh:  # garbage over the middle of the file
        fh.seek(size // 2)
        fh.write(random.Random(0).randbytes(min(8192, size // 4)))
    store = str(small_run)
    for argv in (["runs"], ["show", "1"], ["export", "1", "--out", str(tmp_path / "x")]):
        assert cli.main([*argv, "--store", store]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "corrupt" in err, err
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").rglob("*.*"))


@pytest.mark.parametrize("damage", ["truncated", "unsafe"])
def test_a_damaged_checkpoint_on_resume_is_one_line(small_run, corpus, damage):
    ckpt = small_run.parent / "blockviz.db.runs" / "1" / "checkpoints" / "last.ckpt"
    if damage == "truncated":
        ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    else:  # a pickle that weights_only loading refuses
        torch.save({"global_step": 5, "payload": threading.Lock}, ckpt)
    code, _, err = finish(_resume(small_run, "--max_steps", "20"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "last.ckpt" in err, err


def test_a_damaged_last_checkpoint_resumes_from_the_newest_good_kept_one(tmp_path, corpus):
    """A last.ckpt a full disk or a kill left corrupt: the resume says so and goes on from
    the newest kept checkpoint that reads, every step once (it said "delete it to start
    over" and would not resume)."""
    store_path = tmp_path / "blockviz.db"
    code, _, err = finish(_train(store_path, corpus, "--max_steps", "30", "--ckpt_interval", "10"))
    assert code == 0, err
    folder = tmp_path / "blockviz.db.runs" / "1" / "checkpoints"
    ckpt = folder / "last.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 3])
    (folder / "step-30.ckpt").write_bytes(b"")  # the newest kept one is damaged too
    code, out, err = finish(_resume(store_path, "--max_steps", "40"))
    assert code == 0, err
    assert "resuming from step 20 (last.ckpt is damaged; from step-20.ckpt" in out, out
    _assert_continuous(store_path, 1, 40)


_WRITER = """
import sys, torch
from blockviz.core import config as cfg
from blockviz.training.trainer import make_trainer
trainer = make_trainer(cfg.preset("tiny"), run_dir=sys.argv[2])
io = trainer.strategy.checkpoint_io
io.save_checkpoint({"version": torch.zeros(4)}, sys.argv[1])
print("first", flush=True)
io.save_checkpoint({"version": torch.ones(80_000_000)}, sys.argv[1])  # 320 MB
"""


def test_a_kill_during_a_checkpoint_write_leaves_the_last_one_whole_and_nothing_in_tmp(tmp_path):
    """kill -9 while the trainer writes a checkpoint: the file before it stays whole and no
    temporary file is left in the temp folder (Lightning's writer put one in /tmp and
    copied it over the target: each interrupted write left one behind)."""
    temp, folder = tmp_path / "tmp", tmp_path / "run" / "checkpoints"
    temp.mkdir()
    target = folder / "last.ckpt"
    env = {**os.environ, "TMPDIR": str(temp), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(target), str(tmp_path / "run")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "first"
    _wait(lambda: any(p.stat().st_size > 1e6 for p in [*temp.iterdir(), *folder.iterdir()]))
    proc.kill()
    proc.wait()
    assert [p.name for p in temp.iterdir() if p.is_file()] == []  # (torch makes a cache folder)
    assert torch.equal(torch.load(target, weights_only=True)["version"], torch.zeros(4))
    # The next write of that checkpoint clears what the killed one left beside it.
    from blockviz.training.trainer import AtomicCheckpointIO

    AtomicCheckpointIO().save_checkpoint({"version": torch.ones(2)}, target)
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]


def test_a_full_disk_fails_the_run_in_one_line_with_a_consistent_step(tmp_path, corpus):
    with _tmpfs(tmp_path / "full", "600k") as mount:
        store_path = mount / "blockviz.db"
        proc = _train(store_path, corpus, "--max_steps", "3000", "--probe_interval", "1")
        code, _, err = finish(proc)
        assert code == 1, err  # a failed run; 2 is for bad input
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and "Logging error" not in err, err
        # With no byte left even the failure may not be recordable; once space is freed
        # the first look at the store marks the dead run failed, its step matching its rows.
        subprocess.run(["rm", "-rf", str(mount / "blockviz.db.runs" / "1" / "checkpoints")])
        with RunStore(store_path) as store:
            store.reap_dead(stale_after=0)
            run = store.get_run(1)
            assert run.status == "failed"
            assert run.step == store.max_step(1) > 0
        # A new store on the full disk leaves no empty file behind.
        subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'pad'}", "bs=4k"], capture_output=True)
        with pytest.raises(StoreError):
            RunStore(mount / "new.db")
        assert not (mount / "new.db").exists()


def test_a_model_too_big_for_memory_is_refused_before_training(tmp_path, capsys):
    from blockviz import cli

    store = tmp_path / "blockviz.db"
    flags = ["--n_layer", "256", "--d_model", "4096", "--n_head", "4", "--batch_size", "64"]
    assert cli.main(["train", *flags, "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert "needs about" in err and "available" in err and len(err.strip().splitlines()) == 1
    assert not store.exists()


# ------------------------------------------------------------ studies and many writers

# Two variants of a 40-step tiny run: an evaluation, probe and sample every 10 steps.
STUDY_SWEEP = [
    *("--preset", "tiny", "--max_steps", "40", "--warmup_steps", "2"),
    *("--eval_interval", "10", "--probe_interval", "10", "--sample_interval", "10"),
    *("--workers", "1", "--threads", "1"),
]


def _study_state(store_path: Path, study_id: int) -> tuple[str, list[str]]:
    with RunStore(store_path) as store:
        runs = store.study_runs(study_id)
        return store.get_study(study_id).status, runs["status"].tolist()


def _end_workers(store_path: Path) -> None:
    """Kill what workers a failed test left behind (they run detached, in their own sessions)."""
    if not store_path.exists():
        return
    with RunStore(store_path) as store:
        workers = [w for i in store.studies_frame()["id"] for w in store.get_study(i).workers]
    for pid, began in workers:
        procs.signal_own(pid, began, signal.SIGKILL)


def _assert_each_row_once(store_path: Path, run_id: int, max_steps: int) -> None:
    """The run completed and each of its series holds each of its steps exactly once."""
    last = max_steps - 1
    assert _logged_steps(store_path, run_id, "train/loss") == list(range(max_steps))
    assert _logged_steps(store_path, run_id, "val/loss") == list(range(10, max_steps + 1, 10))
    with RunStore(store_path) as store:
        run = store.get_run(run_id)
        assert (run.status, run.step) == ("completed", max_steps), run.error
        stats = store.layer_stats(run_id)
        keys = ["kind", "stat", "step", "layer", "component"]
        assert not stats.empty and not stats.duplicated(keys).any()
        grads = store.layer_stats(run_id, kind="component", stat="grad_norm")
        assert sorted(grads.step.unique()) == sorted({*range(0, max_steps, 10), last})
        samples = store.samples(run_id)["step"].tolist()
        assert sorted(samples) == sorted(set(samples)) and 0 in samples


def test_a_stopped_batch_stops_every_replica_and_resumes_them_all_on_its_lr_horizon(
    tmp_path, corpus
):
    # SIGTERM stops every member at the checkpoint's step; resumed with a larger
    # --max_steps, each series continues with each step once and the cosine decay still
    # ends at step 60 (it had restarted towards the new max_steps: the lr jumped back up).
    store_path = tmp_path / "blockviz.db"
    proc = _train(store_path, corpus, "--max_steps", "60", "--seeds", "4,5")
    _wait(lambda: len(_logged_steps(store_path, 2, "train/loss")) > 12)
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 0, err
    with RunStore(store_path) as store:
        stopped = [store.get_run(i) for i in (1, 2)]
    assert [r.status for r in stopped] == ["stopped", "stopped"]
    assert (
        stopped[0].step
        == stopped[1].step
        == _checkpoint_step(
            tmp_path / "blockviz.db.runs" / "batches" / "1" / "checkpoints" / "last.ckpt"
        )
    )
    code, _, err = finish(_resume(store_path, "--max_steps", "80"))
    assert code == 0, err
    with RunStore(store_path) as store:
        for run_id in (1, 2):
            _assert_continuous(store_path, run_id, 80)
            lr = store.scalars(run_id, names="train/lr").set_index("step")["value"]
            assert lr[lr.index >= 60].eq(1e-4).all()  # min_lr from the old horizon on
            assert (lr[lr.index < 59] > 1e-4).all()


def test_a_stop_during_train_seeds_ends_the_command_not_just_its_batch(tmp_path, corpus):
    store_path = tmp_path / "blockviz.db"
    proc = _train(store_path, corpus, "--max_steps", "400", "--seeds", "0-3", "--replicas", "2")
    _wait(lambda: len(_logged_steps(store_path, 1, "train/loss")) > 5)
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    assert code == 0, err
    assert "seeds [2, 3] not started" in out
    with RunStore(store_path) as store:
        assert store.runs_frame()["status"].tolist() == ["stopped", "stopped"]


@pytest.mark.parametrize("replicas", ["off", "8"])
def test_a_study_worker_killed_mid_run_is_resumed_with_each_run_trained_once(
    tmp_path, corpus, replicas
):
    # The two runs share every shape: with replicas they train as one batch and die together.
    store_path = tmp_path / "runs.db"
    try:
        sweep = [*STUDY_SWEEP, "--lr", "1e-3,2e-3", "--dataset", str(corpus), "--detach"]
        sweep += ["--replicas", replicas]
        started = study(store_path, "sweep", *sweep)
        assert started.returncode == 0, started.stderr[-2000:]
        # Kill -9 while the first run trains with some of its rows already in the store.
        _wait(lambda: len(_logged_steps(store_path, 1, "train/loss")) > 0)
        with RunStore(store_path) as store:
            ((pid, began),) = store.get_study(1).workers
        assert procs.signal_own(pid, began, signal.SIGKILL)
        _wait(lambda: not procs.is_alive(pid, began), timeout=10)
        status, statuses = _study_state(store_path, 1)
        together = ["running", "running"] if replicas == "8" else ["running", "queued"]
        assert status == "running" and statuses == together  # killed mid-run
        half = len(_logged_steps(store_path, 1, "train/loss"))
        assert 0 < half < 40

        again = study(store_path, "resume", "1")
        assert again.returncode == 0 and "2 run(s) queued again" in again.stdout, again.stderr
        _wait(lambda: _study_state(store_path, 1)[0] != "running", timeout=120)
        assert _study_state(store_path, 1) == ("completed", ["completed"] * 2)
        for run_id in (1, 2):
            _assert_each_row_once(store_path, run_id, 40)
        with RunStore(store_path) as store:
            assert len(store.runs_frame()) == 2  # trained again in its own row, not a new one
    finally:
        _end_workers(store_path)


def test_two_studies_sharing_one_store_at_once_keep_their_own_runs_and_rows(tmp_path, corpus):
    store_path = tmp_path / "runs.db"
    rates = {"first": [1e-3, 2e-3], "second": [3e-3, 4e-3]}
    workers: list[subprocess.Popen] = []
    try:
        for name, lrs in rates.items():
            stored = study(store_path, "sweep", *STUDY_SWEEP, "--name", name, "--dataset",
                           str(corpus), "--lr", ",".join(map(str, lrs)), "--workers", "0",
                           "--replicas", "off")  # fmt: skip
            assert stored.returncode == 0, stored.stderr[-2000:]
        # Both studies' workers start together, one run at a time each, so the studies
        # train at once (a second study launched after the first could start after the
        # first had ended: its runs take a second or two).
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for study_id in (1, 2):
            command = [sys.executable, "-m", "blockviz", "study", "work", str(study_id),
                       "--store", str(store_path), "--replicas", "off",
                       "--threads", "1"]  # fmt: skip
            workers.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL))
        for worker in workers:
            assert worker.wait(120) == 0
        _wait(lambda: {_study_state(store_path, s)[0] for s in (1, 2)} == {"completed"}, 120)
        with RunStore(store_path) as store:
            assert len(store.runs_frame()) == 4
            spans = []
            for study_id, (name, lrs) in enumerate(rates.items(), start=1):
                assert store.get_study(study_id).name == name
                runs = store.study_runs(study_id)
                assert runs["status"].tolist() == ["completed"] * 2
                assert (runs["study_id"] == study_id).all()
                configs = [store.get_run(int(i)) for i in runs["id"]]
                assert [run.config["train"]["lr"] for run in configs] == lrs
                spans.append((min(r.started for r in configs), max(r.ended for r in configs)))
            ids = [set(store.study_runs(s)["id"]) for s in (1, 2)]
        assert not ids[0] & ids[1]
        (first_began, first_ended), (second_began, second_ended) = spans
        assert first_began < second_ended and second_began < first_ended  # they overlapped
        for run_id in range(1, 5):
            _assert_each_row_once(store_path, run_id, 40)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
        _end_workers(store_path)


def test_four_concurrent_runs_and_a_polling_reader_lose_nothing(tmp_path, corpus):
    store_path = tmp_path / "blockviz.db"
    flags = ("--max_steps", "20", "--threads", "1", "--max_running", "0")
    trainers = [_train(store_path, corpus, *flags, "--seed", str(seed)) for seed in range(4)]
    errors: list[BaseException] = []
    seen: dict[int, list[int]] = {}  # train/loss rows of each run, read after read
    running_reads = 0

    def read_until_done() -> None:  # what the dashboard does while runs train
        nonlocal running_reads
        while any(proc.poll() is None for proc in trainers):
            if store_path.exists():
                try:
                    with RunStore.open_readable(store_path) as store:
                        runs = store.runs_frame()
                        for run_id in runs["id"]:
                            losses = store.scalars(int(run_id), names="train/loss")
                            store.layer_stats(int(run_id), kind="component", stat="grad_norm")
                            seen.setdefault(int(run_id), []).append(len(losses))
                        running_reads += int((runs["status"] == "running").sum() > 1)
                except BaseException as exc:  # any of them fails the test
                    errors.append(exc)
            time.sleep(0.1)

    reader = threading.Thread(target=read_until_done)
    reader.start()
    results = [finish(proc) for proc in trainers]
    reader.join(timeout=30)
    assert not reader.is_alive()
    for code, out, err in results:
        assert code == 0 and "completed" in out, err
    assert not errors, errors
    assert running_reads > 0  # it read while two or more runs trained
    assert sorted(seen) == [1, 2, 3, 4]
    for counts in seen.values():
        assert counts == sorted(counts)  # no row it saw ever vanished
    for run_id in range(1, 5):
        _assert_continuous(store_path, run_id, 20)
