"""A study on a PostgreSQL store, in real worker processes: a worker killed on another host,
and the server stopped for 20 s while the study trains. Nothing is lost either way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blockviz.core import spec
from blockviz.store import RunStore
from tests.fakes import CORPUS
from tests.helpers import study

pytestmark = pytest.mark.slow

STEPS = 120
TINY = ["--preset", "tiny", "--max_steps", str(STEPS), "--warmup_steps", "2"]


def _stored_study(url: str, folder: Path) -> int:
    """A two-run sweep (on a small corpus written into `folder`) stored with no worker;
    its id."""
    corpus = folder / "fox.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    made = study(url, "sweep", *TINY, "--dataset", str(corpus), "--lr", "1e-3,2e-3",
                 "--workers", "0", "--replicas", "off")  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    with RunStore(url) as store:
        (study_id,) = store.studies_frame()["id"].tolist()
    return int(study_id)


def _worker(url: str, study_id: int, host: str) -> subprocess.Popen:
    """`study work ID --store URL` as a process of host `host`."""
    env = {**os.environ, "BLOCKVIZ_HOST": host, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "blockviz", "study", "work", str(study_id),
               "--store", url, "--replicas", "off", "--threads", "1"]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _running_study(url: str, study_id: int, logged: bool) -> None:
    """Wait until a run of the study is running and has beaten (or `logged` its loss)."""
    with RunStore(url) as store:

        def started() -> bool:
            runs = store.study_runs(study_id)
            running = runs.loc[runs["status"] == "running", "id"].tolist()
            if not running:
                return False
            if logged:
                return len(store.scalars(running, spec.TRAIN_LOSS)) > 0
            return bool(runs["heartbeat"].notna().any())

        _wait(started, 120, "a worker to train")


def _every_step_logged(store: RunStore, run_ids: list[int]) -> None:
    """Each run's loss at every step, once: no row lost, none twice."""
    for run_id in run_ids:
        frame = store.scalars(run_id, spec.TRAIN_LOSS)
        assert frame["step"].tolist() == list(range(STEPS)), run_id


def test_a_worker_killed_on_another_host_is_reaped_once_stale_and_resumed(
    pg_url, tmp_path, monkeypatch
):
    url = f"{pg_url}?runs={tmp_path / 'shared'}"
    study_id = _stored_study(url, tmp_path)
    worker = _worker(url, study_id, "host-b")
    try:
        _running_study(url, study_id, logged=False)
        with RunStore(url) as store:
            worker.send_signal(signal.SIGKILL)
            worker.wait(30)
            (victim,) = store.study_active_runs(study_id)[:1]
            assert store.get_run(victim).host == "host-b"
            # Host A: B's pid means nothing here. A fresh beat keeps the run even with no
            # slack for this host's own runs; a stale one fails it.
            monkeypatch.setenv("BLOCKVIZ_HOST", "host-a")
            stale = 6.0
            beat = store.get_run(victim).heartbeat
            assert time.time() - beat < stale - 1
            assert store.reap_dead(stale_after=0.0, remote_stale_after=stale) == []
            assert store.get_run(victim).status == "running"
            _wait(lambda: time.time() - beat > stale, 30, "the beat to go stale")
            assert store.reap_dead(stale_after=0.0, remote_stale_after=stale) == [victim]
            lost = store.get_run(victim)  # failed, and queued again for a worker to take
            assert (lost.status, lost.pid, lost.lost) == ("queued", None, 1)
            assert "no heartbeat from host host-b" in lost.error
    finally:
        if worker.poll() is None:
            worker.kill()
    resumed = study(url, "resume", str(study_id), "--workers", "1", "--replicas", "off")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    with RunStore(url) as store:
        _wait(lambda: store.get_study(study_id).status != "running", 180, "the study")
        runs = store.study_runs(study_id)
        assert runs["status"].tolist() == ["completed", "completed"]
        assert {store.get_run(int(i)).host for i in runs["id"]} == {"host-a"}
        _every_step_logged(store, [int(i) for i in runs["id"]])


def test_a_study_survives_its_server_stopping_for_20_s(own_pg_server, tmp_path):
    url = f"{own_pg_server.create_database()}?runs={tmp_path / 'shared'}"
    study_id = _stored_study(url, tmp_path)
    worker = _worker(url, study_id, "host-a")
    try:
        _running_study(url, study_id, logged=True)
        own_pg_server.stop()
        time.sleep(20)
        assert worker.poll() is None, worker.stderr.read().decode()[-2000:]  # still training
        own_pg_server.start()
        assert worker.wait(240) == 0, worker.stderr.read().decode()[-2000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    with RunStore(url) as store:
        assert store.get_study(study_id).status == "completed"
        runs = store.study_runs(study_id)
        assert runs["status"].tolist() == ["completed", "completed"]
        _every_step_logged(store, [int(i) for i in runs["id"]])
        warned = (store.run_dir(int(runs["id"].iloc[0])) / "train.log").read_text()
        assert "keeping rows in memory" in warned  # the first run trained through the outage
