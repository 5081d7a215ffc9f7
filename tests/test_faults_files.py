"""Fault injection: processes and liveness (reused pids, unreaped children), and damaged,
read-only, full or half-written files (stores and checkpoints)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
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
from tests.helpers import (
    FAULT_CADENCE,
    assert_continuous,
    checkpoint_step,
    fault_resume,
    fault_train,
    finish,
    resume_args,
    train_args,
    train_here,
    wait_until,
)

pytestmark = pytest.mark.slow


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
    wait_until(lambda: not procs.is_alive(me.pid, me.started), timeout=10)
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


@pytest.fixture(scope="module")
def trained_small_run(tmp_path_factory, corpus) -> Path:
    """A 10-step run's workspace (store and run folder), trained once for this module."""
    store_path = tmp_path_factory.mktemp("small") / "ws" / "blockviz.db"
    code, _, err = finish(fault_train(store_path, corpus, "--max_steps", "10"))
    assert code == 0, err
    return store_path


@pytest.fixture
def small_run(trained_small_run, tmp_path) -> Path:
    """This test's own copy of that workspace, to damage as it likes; its store's path."""
    shutil.copytree(trained_small_run.parent, tmp_path / "ws")
    return tmp_path / "ws" / trained_small_run.name


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
    code, _, err = finish(fault_resume(small_run, "--max_steps", "20"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "last.ckpt" in err, err


def test_a_damaged_last_checkpoint_resumes_from_the_newest_good_kept_one(tmp_path, corpus, capsys):
    """A last.ckpt a full disk or a kill left corrupt: the resume says so and goes on from
    the newest kept checkpoint that reads, every step once (it said "delete it to start
    over" and would not resume)."""
    store_path = tmp_path / "blockviz.db"
    flags = (*FAULT_CADENCE, "--max_steps", "30", "--ckpt_interval", "10")
    code, _, err = train_here(train_args(store_path, corpus, *flags), capsys)
    assert code == 0, err
    folder = tmp_path / "blockviz.db.runs" / "1" / "checkpoints"
    ckpt = folder / "last.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 3])
    (folder / "step-30.ckpt").write_bytes(b"")  # the newest kept one is damaged too
    code, out, err = train_here(resume_args(store_path, "--max_steps", "40"), capsys)
    assert code == 0, err
    assert "resuming from step 20 (last.ckpt is damaged; from step-20.ckpt" in out, out
    assert_continuous(store_path, 1, 40)


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
    wait_until(lambda: any(p.stat().st_size > 1e6 for p in [*temp.iterdir(), *folder.iterdir()]))
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
        proc = fault_train(store_path, corpus, "--max_steps", "3000", "--probe_interval", "1")
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


def test_a_full_disk_during_a_checkpoint_write_loses_no_step(small_run, tmp_path, corpus):
    """The run folder on a disk that fills up while a checkpoint is written (issue 37's
    fault suite): the run fails naming the full disk, its last checkpoint stays whole, and
    once there is room again the resume continues from it with every step logged once."""
    size = (small_run.parent / "blockviz.db.runs" / "1" / "checkpoints" / "last.ckpt").stat()
    store = tmp_path / "full" / "blockviz.db"
    store.parent.mkdir()
    # Room for the log and about three checkpoints: the run's later writes cannot fit.
    room = 3 * size.st_size + 256 * 1024
    with _tmpfs(tmp_path / "full" / "blockviz.db.runs", f"{room}") as runs:
        code, _, err = finish(
            fault_train(store, corpus, "--max_steps", "60", "--ckpt_interval", "10")
        )
        assert code != 0
        assert len(err.strip().splitlines()) == 1 and "[Errno 28] the disk of " in err, err
        assert "is full" in err and "the checkpoint before it is whole" in err
        last = runs / "1" / "checkpoints" / "last.ckpt"
        step = checkpoint_step(last)  # loads: whole, not the write that failed
        assert 10 <= step < 60
        subprocess.run(["mount", "-o", "remount,size=256m", str(runs)], check=True)
        code, _, err = finish(fault_resume(store, "--max_steps", "60"))
        assert code == 0, err
        assert_continuous(store, 1, 60)
        leftovers = [p.name for p in (runs / "1" / "checkpoints").iterdir() if ".part" in p.name]
        assert leftovers == []
