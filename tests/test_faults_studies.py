"""Fault injection: studies and many writers: stopped batches, killed workers, two studies
and four runs on one store."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from blockviz.core import procs
from blockviz.store import RunStore
from tests.helpers import (
    assert_continuous,
    checkpoint_step,
    fault_resume,
    fault_train,
    finish,
    logged_steps,
    study,
    wait_until,
)

pytestmark = pytest.mark.slow


# ------------------------------------------------------------ studies and many writers

# Two variants of a 40-step tiny run: an evaluation, probe and sample every 10 steps.
# Long enough that a stop or a kill lands mid-run: the tiny model trains 60 steps in about a
# second, faster than the store shows its rows, and a 60-step run had ended before the stop.
MID_RUN_STEPS = 300
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
    assert logged_steps(store_path, run_id, "train/loss") == list(range(max_steps))
    assert logged_steps(store_path, run_id, "val/loss") == list(range(10, max_steps + 1, 10))
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
    proc = fault_train(store_path, corpus, "--max_steps", "60", "--seeds", "4,5")
    wait_until(lambda: len(logged_steps(store_path, 2, "train/loss")) > 12)
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 0, err
    with RunStore(store_path) as store:
        stopped = [store.get_run(i) for i in (1, 2)]
    assert [r.status for r in stopped] == ["stopped", "stopped"]
    assert (
        stopped[0].step
        == stopped[1].step
        == checkpoint_step(
            tmp_path / "blockviz.db.runs" / "batches" / "1" / "checkpoints" / "last.ckpt"
        )
    )
    code, _, err = finish(fault_resume(store_path, "--max_steps", "80"))
    assert code == 0, err
    with RunStore(store_path) as store:
        for run_id in (1, 2):
            assert_continuous(store_path, run_id, 80)
            lr = store.scalars(run_id, names="train/lr").set_index("step")["value"]
            assert lr[lr.index >= 60].eq(1e-4).all()  # min_lr from the old horizon on
            assert (lr[lr.index < 59] > 1e-4).all()


def test_a_stop_during_train_seeds_ends_the_command_not_just_its_batch(tmp_path, corpus):
    store_path = tmp_path / "blockviz.db"
    proc = fault_train(
        store_path, corpus, "--max_steps", "400", "--seeds", "0-3", "--replicas", "2"
    )
    wait_until(lambda: len(logged_steps(store_path, 1, "train/loss")) > 5)
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
        wait_until(lambda: len(logged_steps(store_path, 1, "train/loss")) > 0)
        with RunStore(store_path) as store:
            ((pid, began),) = store.get_study(1).workers
        assert procs.signal_own(pid, began, signal.SIGKILL)
        wait_until(lambda: not procs.is_alive(pid, began), timeout=10)
        status, statuses = _study_state(store_path, 1)
        together = ["running", "running"] if replicas == "8" else ["running", "queued"]
        assert status == "running" and statuses == together  # killed mid-run
        half = len(logged_steps(store_path, 1, "train/loss"))
        assert 0 < half < 40

        again = study(store_path, "resume", "1")
        assert again.returncode == 0 and "2 run(s) queued again" in again.stdout, again.stderr
        wait_until(lambda: _study_state(store_path, 1)[0] != "running", timeout=120)
        assert _study_state(store_path, 1) == ("completed", ["completed"] * 2)
        for run_id in (1, 2):
            _assert_each_row_once(store_path, run_id, 40)
        with RunStore(store_path) as store:
            assert len(store.runs_frame()) == 2  # trained again in its own row, not a new one
    finally:
        _end_workers(store_path)


def _resumed_from(log: Path) -> int:
    """The step a run's train.log says its last session resumed from."""
    found = re.findall(r"resuming from step (\d+)", log.read_text(encoding="utf-8"))
    assert found, log.read_text(encoding="utf-8")[-2000:]
    return int(found[-1])


@pytest.mark.parametrize("replicas", ["off", "8"])
def test_a_stopped_study_resumes_its_runs_from_their_checkpoints(tmp_path, corpus, replicas):
    # `study resume` deleted a stopped run's rows and trained it from step 0 again, so a run
    # longer than a job's time limit could never finish.
    store_path = tmp_path / "runs.db"
    try:
        sweep = [*STUDY_SWEEP, "--max_steps", str(MID_RUN_STEPS), "--lr", "1e-3,2e-3", "--dataset",
                 str(corpus), "--detach", "--replicas", replicas]  # fmt: skip
        started = study(store_path, "sweep", *sweep)
        assert started.returncode == 0, started.stderr[-2000:]
        checkpoints = tmp_path / "runs.db.runs" / ("1" if replicas == "off" else "batches/1")
        last = checkpoints / "checkpoints" / "last.ckpt"
        wait_until(lambda: last.exists() and len(logged_steps(store_path, 1, "train/loss")) > 15)
        stopped = study(store_path, "stop", "1")
        assert stopped.returncode == 0, stopped.stderr
        wait_until(lambda: not _study_state(store_path, 1)[1].count("running"), timeout=60)
        with RunStore(store_path) as store:
            ((pid, began),) = store.get_study(1).workers
            wait_until(lambda: not procs.is_alive(pid, began), timeout=60)
            step = store.get_run(1).step
        assert 10 <= step < MID_RUN_STEPS and step == checkpoint_step(last)

        again = study(store_path, "resume", "1")
        assert again.returncode == 0, again.stderr
        said = again.stdout
        assert f"run 1 resumes from step {step}\n" in said
        if replicas == "off":  # the second run was still queued: it never trained
            assert "run 2 trains from the start (no checkpoint)" in said
        else:  # one batch: both stopped at the batch's checkpoint
            assert f"run 2 resumes from step {step}\n" in said
        wait_until(lambda: _study_state(store_path, 1)[0] != "running", timeout=120)
        assert _study_state(store_path, 1) == ("completed", ["completed"] * 2)
        assert _resumed_from(tmp_path / "runs.db.runs" / "1" / "train.log") == step
        for run_id in (1, 2):
            _assert_each_row_once(store_path, run_id, MID_RUN_STEPS)
    finally:
        _end_workers(store_path)


def _host_worker(store: str, host: str, stale_s: float | None) -> subprocess.Popen:
    """`study work 1` as a process of host `host`, judging other hosts' runs lost after
    `stale_s` seconds of silence (None: the default)."""
    env = {**os.environ, "BLOCKVIZ_HOST": host, "OMP_NUM_THREADS": "1"}
    env.pop("BLOCKVIZ_REMOTE_STALE_S", None)
    if stale_s is not None:
        env["BLOCKVIZ_REMOTE_STALE_S"] = str(stale_s)
    command = [sys.executable, "-m", "blockviz", "study", "work", "1", "--store", store,
               "--replicas", "off", "--threads", "1"]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_the_worker_left_finishes_the_run_of_a_killed_host_from_its_checkpoint(
    store_url, tmp_path, corpus
):
    # A killed host's run stayed failed (after 120 s, and only when something read the
    # store) until someone typed `study resume`, which trained it from step 0.
    stored = study(store_url, "sweep", *STUDY_SWEEP, "--max_steps", str(MID_RUN_STEPS), "--lr",
                   "1e-3,2e-3", "--dataset", str(corpus), "--workers", "0",
                   "--replicas", "off")  # fmt: skip
    assert stored.returncode == 0, stored.stderr[-2000:]
    # Host A calls another host's run lost after 10 s of silence; host B (killed) keeps
    # the default, so it never takes A's run for lost while both train.
    survivor = _host_worker(store_url, "host-a", 10)
    victim = _host_worker(store_url, "host-b", None)
    try:
        with RunStore(store_url) as store:

            def b_checkpointed() -> int | None:
                for run_id in store.study_active_runs(1):
                    run = store.get_run(run_id)
                    last = store.run_dir(run_id) / "checkpoints" / "last.ckpt"
                    if run.host == "host-b" and last.exists() and run.step > 15:
                        return run_id
                return None

            wait_until(lambda: b_checkpointed() is not None, timeout=120)
            lost = b_checkpointed()
            victim.kill()  # kill -9: the host is gone, nothing is written
            victim.wait()
            assert survivor.wait(180) == 0, survivor.stdout.read().decode()[-3000:]
            run = store.get_run(lost)
            assert (run.status, run.host) == ("completed", "host-a"), run.error
            assert store.get_study(1).status == "completed"
            assert run.lost == 1
        step = _resumed_from(Path(store.run_dir(lost)) / "train.log")
        assert step >= 10
        for run_id in (1, 2):
            _assert_each_row_once(store_url, run_id, MID_RUN_STEPS)
    finally:
        for worker in (survivor, victim):
            if worker.poll() is None:
                worker.kill()


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
        wait_until(lambda: {_study_state(store_path, s)[0] for s in (1, 2)} == {"completed"}, 120)
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
    trainers = [fault_train(store_path, corpus, *flags, "--seed", str(seed)) for seed in range(4)]
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
        assert_continuous(store_path, run_id, 20)
