"""study_runner without worker processes: progress, interruption, stop, resume, estimates."""

from __future__ import annotations

import json
import time

import pytest

from blockviz import cli
from blockviz.core.studies import builtins, sweeps
from blockviz.launch import study_estimate, study_runner
from blockviz.store import RunStore

GONE = 2**22 + 4321  # no process has this pid here


def _runs(n: int) -> list[dict]:
    return [{"variant": f"v{i}", "seed": 1, "config": "{}", "max_steps": 10} for i in range(n)]


@pytest.fixture
def store(tmp_path) -> RunStore:
    opened = RunStore(tmp_path / "s.db")
    yield opened
    opened.close()


def test_a_running_study_without_live_workers_is_interrupted_and_resumes(store, monkeypatch):
    started: list[int] = []
    monkeypatch.setattr(study_runner, "start_workers", lambda s, i, *a, **k: started.append(i))
    study_id, run_ids = store.create_study("s", "sweep", "quick", {}, _runs(3))
    store.update_study(study_id, workers=[[GONE, time.time()]])
    store.claim_study_run(study_id, GONE, time.time())
    store.update_run(run_ids[1], status="completed")
    now = study_runner.progress(store, study_id)
    assert (now.total, now.finished, now.queued, now.workers_alive) == (3, 1, 2, 0)
    assert now.interrupted and now.label == "interrupted"
    assert study_runner.status_label(store, study_id, "running") == "interrupted"
    assert study_runner.resume(store, study_id).count == 2
    assert started == [study_id]
    again = store.study_runs(study_id).set_index("id")["status"]
    assert again[run_ids[0]] == "queued" and again[run_ids[1]] == "completed"
    assert store.get_run(run_ids[0]).pid is None


def test_a_study_whose_killed_worker_left_only_reaped_runs_is_no_longer_running(store, monkeypatch):
    """Its worker killed, its runs reaped (failed): the study stayed "running" for good,
    `study resume` said "still running" and the page's Resume was disabled."""
    started: list[int] = []
    monkeypatch.setattr(study_runner, "start_workers", lambda s, i, *a, **k: started.append(i))
    study_id, run_ids = store.create_study("s", "sweep", "quick", {}, _runs(2))
    store.update_study(study_id, workers=[[GONE, time.time()]])
    store.update_run(run_ids[0], status="completed")
    store.update_run(run_ids[1], status="failed")  # what reaping its dead process left
    assert study_runner.status_label(store, study_id, "running") == "stopped"
    assert "1 of 2 runs failed or stopped" in store.get_study(study_id).error
    assert study_runner.resume(store, study_id).count == 1
    assert started == [study_id]


def test_stop_skips_the_queued_runs_and_resume_refuses_a_running_study(store, monkeypatch):
    study_id, _ = store.create_study("s", "sweep", "quick", {}, _runs(2))
    monkeypatch.setattr(study_runner, "workers_alive", lambda s, i: 1)
    with pytest.raises(study_runner.StudyError, match="still running"):
        study_runner.resume(store, study_id)
    assert "2 queued run(s) skipped" in study_runner.stop(store, study_id)
    assert store.get_study(study_id).status == "stopped"
    assert study_runner.stop(store, study_id) == "already stopped"
    monkeypatch.setattr(study_runner, "start_workers", lambda *a, **k: [])
    assert study_runner.resume(store, study_id).count == 2


def test_a_finished_study_has_nothing_to_resume(store):
    study_id, run_ids = store.create_study("s", "sweep", "quick", {}, _runs(1))
    store.update_run(run_ids[0], status="completed")
    store.update_study(study_id, status="stopped")
    assert study_runner.resume(store, study_id).count == 0
    assert store.get_study(study_id).status == "completed"


def test_estimates_grow_with_the_work() -> None:
    short = sweeps.sweep({"lr": [1e-3, 2e-3]}, size="quick", max_steps=100)
    long = sweeps.sweep({"lr": [1e-3, 2e-3]}, size="quick", max_steps=400)
    pace = study_estimate.measured_pace(None)  # nothing measured: the rough guess
    a, b = (study_estimate.estimate_s(s, pace, 1) for s in (short, long))
    train_a = a - study_estimate.WORKER_START_S - 2 * study_estimate.PER_RUN_OVERHEAD_S
    train_b = b - study_estimate.WORKER_START_S - 2 * study_estimate.PER_RUN_OVERHEAD_S
    assert train_b == pytest.approx(4 * train_a)
    assert study_estimate.estimate_s(long, pace, 2, replica_limit=1) < b


def test_a_study_that_only_measures_at_init_gets_one_worker(store, monkeypatch):
    """Each worker of init-gradients measured the whole study: two at once on a 2-core box
    took 192 s where one took 9 s."""
    asked: list[int | None] = []
    monkeypatch.setattr(
        study_runner, "start_workers", lambda s, i, workers, *a: asked.append(workers)
    )
    study_runner.launch(store, builtins.builtin("init-gradients", "quick"), workers=3)
    study_runner.launch(store, sweeps.sweep({"lr": [1e-3, 2e-3]}, size="quick"), workers=3)
    assert asked == [1, 3]


def test_study_show_and_list_reap_a_dead_run_as_runs_does(store, monkeypatch, capsys):
    """They called the run of a study whose worker was killed 'running' for good. Reaped,
    a running study's run is queued again (for a live worker to continue)."""
    monkeypatch.setattr(study_runner, "start_workers", lambda *a, **k: [])
    study_id = study_runner.launch(store, sweeps.sweep({"lr": [1e-3, 2e-3]}, size="quick"))
    store.update_study(study_id, workers=[[GONE, time.time()]])
    run_id = store.claim_study_run(study_id, GONE, time.time())  # its worker died
    store.update_run(run_id, status="running", heartbeat=time.time() - 3600)
    store.flush()
    where = ["--store", str(store.path)]

    assert cli.main(["study", "show", str(study_id), *where]) == 0
    shown = capsys.readouterr().out
    assert "0 running, 2 queued, 0 stopped or failed" in shown
    reaped = store.get_run(run_id)
    assert (reaped.status, reaped.lost) == ("queued", 1)  # what `runs` would say
    assert "interrupted" in shown  # and no worker is left here to take it

    store.claim_study_run(study_id, GONE, time.time())
    store.update_run(run_id, status="running", heartbeat=time.time() - 3600)
    assert cli.main(["study", "list", "--json", *where]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["running"], listed["queued"], listed["unfinished"]) == (0, 2, 0)


def test_a_study_whose_runs_beat_is_running_with_no_worker_started_here(store, monkeypatch):
    """Workers another machine started (`study launch --slurm`, `study work` over ssh) are
    not in the study's workers; while a run of it beats, the study is being trained."""
    monkeypatch.setattr(study_runner, "start_workers", lambda *a, **k: pytest.fail("started"))
    study_id, run_ids = store.create_study("s", "sweep", "quick", {}, _runs(3))
    monkeypatch.setenv("BLOCKVIZ_HOST", "node-b")
    store.claim_study_run(study_id, GONE, time.time())  # a process of another machine
    monkeypatch.setenv("BLOCKVIZ_HOST", "node-a")
    store.update_run(run_ids[0], status="running", started=time.time(), heartbeat=time.time())
    now = study_runner.progress(store, study_id)
    assert (now.workers_alive, now.beating, now.running, now.queued) == (0, 1, 1, 2)
    assert not now.unattended and not now.interrupted and now.label == "running"
    assert study_runner.status_label(store, study_id, "running") == "running"
    with pytest.raises(study_runner.StudyError, match="still running"):
        study_runner.resume(store, study_id)

    # Its beat goes stale: no worker is seen; none was started here, so it waits for one.
    store.update_run(run_ids[0], heartbeat=time.time() - 3600)
    now = study_runner.progress(store, study_id)
    assert now.unattended and now.waiting and not now.interrupted
    assert study_runner.status_label(store, study_id, "running") == "waiting for workers"

    # Workers submitted to a scheduler (their pids unknown here): waiting, never interrupted.
    store.update_study(study_id, workers=[[GONE, time.time()], [study_runner.ELSEWHERE_PID, None]])
    assert study_runner.progress(store, study_id).label == "waiting for workers"
    store.update_study(study_id, workers=[[GONE, time.time()]])  # only its own, dead
    assert study_runner.progress(store, study_id).label == "interrupted"


def test_a_study_stored_with_no_workers_waits_and_resumes_with_none(store, monkeypatch):
    monkeypatch.setattr(study_runner, "start_workers", lambda *a, **k: pytest.fail("started"))
    plan = sweeps.sweep({"lr": [1e-3, 2e-3]}, size="quick")
    study_id = study_runner.launch(store, plan, workers=0)
    now = study_runner.progress(store, study_id)
    assert (now.queued, now.workers_here, now.label) == (2, 0, "waiting for workers")
    assert study_runner.worker_args(store, study_id, threads=2, replicas=1) == [
        "-m", "blockviz", "study", "work", str(study_id), "--store", str(store.path),
        "--threads", "2", "--replicas", "1",
    ]  # fmt: skip

    study_runner.stop(store, study_id)
    assert study_runner.resume(store, study_id, workers=0).count == 2
    study = store.get_study(study_id)
    assert (study.status, study.workers) == ("running", ())
    assert study_runner.progress(store, study_id).label == "waiting for workers"


def _checkpoint(path, step: int) -> None:
    """A file laid out as torch.save writes a checkpoint at `step` (torch-free)."""
    import pickle
    import zipfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"global_step": step}))


def test_resume_says_which_runs_continue_from_which_step_and_which_start_over(
    store, monkeypatch, capsys
):
    """`study resume` deleted every stopped run's rows: it trained from step 0 again even
    with a checkpoint at step 20."""
    monkeypatch.setattr(study_runner, "start_workers", lambda *a, **k: [])
    study_id, run_ids = store.create_study("s", "sweep", "quick", {}, _runs(4))
    stopped, damaged, never, done = run_ids
    for run_id in (stopped, damaged, never):
        store.update_run(run_id, status="stopped", started=time.time(), step=20)
        store.log_metrics(run_id, 19, {"train/loss": 2.0})
    store.update_run(done, status="completed")
    store.flush()
    _checkpoint(store.run_dir(stopped) / "checkpoints" / "last.ckpt", 20)
    (store.run_dir(damaged) / "checkpoints").mkdir(parents=True)
    (store.run_dir(damaged) / "checkpoints" / "last.ckpt").write_bytes(b"")
    store.update_study(study_id, status="stopped")

    assert cli.main(["study", "resume", str(study_id), "--store", str(store.path)]) == 0
    said = capsys.readouterr().out
    assert "3 run(s) queued again: 2 resume from their checkpoints, 1 from the start" in said
    assert f"run {stopped} resumes from step 20\n" in said
    assert f"run {damaged} resumes from its newest checkpoint that reads" in said
    assert f"run {never} trains from the start (no checkpoint)" in said
    for run_id in (stopped, damaged, never):  # each keeps its rows until a worker claims it
        assert store.get_run(run_id).status == "queued"
        assert store.scalars(run_id)["step"].tolist() == [19]
