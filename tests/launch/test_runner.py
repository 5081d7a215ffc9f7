"""The runner: background runs that complete, queue behind a slot limit, stop, and fail loudly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blockviz.core import hardware, procs
from blockviz.core.config import preset, replace
from blockviz.launch import runner
from blockviz.store import RunRecord, RunStore

TERMINAL = ("completed", "diverged", "failed", "stopped")
RUN_TIMEOUT_S = 120.0


def tiny(**overrides: object):
    """The tiny preset cut to a few steps, evaluating and probing rarely."""
    settings: dict[str, object] = {
        "max_steps": 12,
        "warmup_steps": 2,
        "eval_interval": 6,
        "eval_iters": 1,
        "probe_interval": 6,
        "sample_interval": 12,
    }
    settings.update(overrides)
    return replace(preset("tiny"), **settings)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    """A fresh store; every process a test left alive is killed afterwards."""
    run_store = RunStore(tmp_path / "ws" / "blockviz.db")
    yield run_store
    for pid in run_store.runs_frame()["pid"].dropna():
        if int(pid) != os.getpid() and procs.is_alive(int(pid), None):
            os.kill(int(pid), signal.SIGKILL)
    run_store.close()


def wait_for(
    store: RunStore,
    run_id: int,
    done: Callable[[RunRecord], bool],
    timeout: float = RUN_TIMEOUT_S,
    seen: list[RunRecord] | None = None,
) -> RunRecord:
    """Poll the store until done(run) holds; returns the run (fails with its log on timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = store.get_run(run_id)
        if seen is not None:
            seen.append(run)
        if done(run):
            return run
        time.sleep(0.2)
    pytest.fail(f"run {run_id} stuck at {run.status}; log:\n{runner.log_tail(store, run_id)}")


def finished(run: RunRecord) -> bool:
    return run.status in TERMINAL


# Launch, then do what Ctrl-C in Streamlit's terminal does: SIGINT to the whole process
# group. The launcher dies; the run, in a session of its own, must not.
LAUNCH_AND_DIE = """
import os, signal, sys, time
from blockviz.launch import runner
from blockviz.core.config import RunConfig
from blockviz.store import RunStore
store = RunStore(sys.argv[1])
print(runner.launch(RunConfig.from_json(sys.argv[2]), "smoke", store, max_running=2), flush=True)
# Python's own SIGINT handler even where this process was started with SIGINT ignored (a
# test worker's may be): the launcher must die of the signal, not shrug it off.
signal.signal(signal.SIGINT, signal.default_int_handler)
os.killpg(0, signal.SIGINT)
time.sleep(30)  # the KeyboardInterrupt lands here, not after the script has ended
"""


@pytest.mark.slow
def test_launched_run_outlives_its_launcher_and_completes(store: RunStore) -> None:
    launcher = subprocess.run(
        [sys.executable, "-c", LAUNCH_AND_DIE, str(store.path), tiny().to_json()],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # its own process group, so the SIGINT stays in there
    )
    assert launcher.returncode != 0, "the launcher should have died of its SIGINT"
    run_id = int(launcher.stdout.split()[0])
    run = wait_for(store, run_id, finished)
    assert run.status == "completed", runner.log_tail(store, run_id)
    assert run.name == "smoke"
    assert run.step == run.max_steps == 12
    run_dir = store.run_dir(run_id)
    assert (run_dir / "config.json").is_file() and (run_dir / "train.log").is_file()
    assert runner.active(store) == []


@pytest.mark.slow
def test_queue_waits_for_a_free_slot_and_stop_ends_running_and_queued_runs(
    store: RunStore,
) -> None:
    long = tiny(max_steps=100_000, eval_interval=1000, probe_interval=1000, sample_interval=1000)
    first = runner.launch(long, "first", store, max_running=1)
    wait_for(store, first, lambda run: run.status == "running")
    second = runner.launch(tiny(), "second", store, max_running=1)
    third = runner.launch(long, "third", store, max_running=1)
    # Both found the slot taken: they say so in their logs and wait as 'queued'.
    for waiting in (second, third):
        wait_for(store, waiting, lambda run, w=waiting: "queued" in runner.log_tail(store, w))
    statuses = {run.id: run.status for run in runner.active(store)}
    assert statuses == {first: "running", second: "queued", third: "queued"}

    assert runner.stop(store, third) in ("stop requested", "stopped")
    assert wait_for(store, third, finished, timeout=60).status == "stopped"
    assert runner.stop(store, first) == "stop requested"  # it checkpoints, then records
    ended_first = wait_for(store, first, finished, timeout=60)
    assert ended_first.status == "stopped", runner.log_tail(store, first)
    # The freed slot goes to the queued run, which then trains to the end.
    done = wait_for(store, second, finished)
    assert done.status == "completed", runner.log_tail(store, second)
    assert done.started >= ended_first.ended - 1.0
    assert runner.stop(store, first) == "already stopped"
    assert runner.active(store) == []


def test_missing_dataset_is_refused_before_a_run_exists(store: RunStore, tmp_path: Path) -> None:
    config = tiny(dataset=str(tmp_path / "nowhere.txt"))
    with pytest.raises(runner.LaunchError, match=r"nowhere\.txt"):
        runner.launch(config, "lost", store)
    assert store.runs_frame().empty


@pytest.mark.slow
def test_data_error_fails_the_run_with_the_message(store: RunStore, tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("too short for any window\n", encoding="utf-8")
    try:
        run_id = runner.launch(tiny(dataset=str(short)), "short", store)
    except runner.LaunchError as exc:  # failed inside the startup watch: also fine
        assert exc.run_id is not None and "short" in (str(exc) + exc.log_tail)
        run_id = exc.run_id
    run = wait_for(store, run_id, finished)
    assert run.status == "failed"
    assert "too short" in (run.error or "") + runner.log_tail(store, run_id)


def test_immediate_crash_raises_with_the_log_tail(
    store: RunStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # An interpreter that prints an error and exits 3 stands in for a broken environment.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'boom: cannot import blockviz' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    with pytest.raises(runner.LaunchError, match="boom") as caught:
        runner.launch(tiny(), "crash", store)
    assert "boom: cannot import blockviz" in caught.value.log_tail
    run = store.get_run(caught.value.run_id)
    assert run.status == "failed" and "boom" in run.error


@pytest.mark.slow
def test_a_run_on_another_host_stops_through_the_store(store: RunStore, monkeypatch) -> None:
    # The run's process says it lives on host B; this process is host A, which cannot
    # signal it, so Stop asks through the store and the run's heartbeat reads the request.
    monkeypatch.setenv("BLOCKVIZ_HOST", "host-b")
    long = tiny(max_steps=100_000, eval_interval=1000, probe_interval=1000, sample_interval=1000)
    run_id = runner.launch(long, "elsewhere", store, max_running=1)
    wait_for(store, run_id, lambda run: run.status == "running" and (run.step or 0) > 0)
    monkeypatch.setenv("BLOCKVIZ_HOST", "host-a")
    assert store.get_run(run_id).host == "host-b"
    outcome = runner.stop_run(store, run_id)
    assert outcome.ok and "host host-b" in outcome.message
    run = wait_for(store, run_id, finished, timeout=30)
    assert run.status == "stopped" and run.stop_requested is not None
    assert (store.run_dir(run_id) / "checkpoints" / "last.ckpt").is_file()
    assert "a stop was requested through the store" in runner.log_tail(store, run_id)


def test_a_queued_run_on_another_host_is_stopped_before_it_starts(store, monkeypatch) -> None:
    monkeypatch.setenv("BLOCKVIZ_HOST", "host-b")
    run_id = store.create_run("waiting", tiny().to_json(), pid=2**22 + 77)  # registered there
    monkeypatch.setenv("BLOCKVIZ_HOST", "host-a")
    outcome = runner.stop_run(store, run_id)
    assert outcome.message == "was queued on host host-b; marked stopped"
    run = store.get_run(run_id)
    assert run.status == "stopped" and run.stop_requested is not None
    # Its process, starting there now, finds it stopped and never trains it.
    assert not store.take_over(run_id, ("stopped",), status="queued", pid=2**22 + 77)


def test_stop_of_a_run_whose_process_is_gone_marks_it_failed(store: RunStore) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run_id = store.create_run("orphan", tiny().to_json(), status="running", pid=gone.pid)
    assert runner.stop(store, run_id) == f"its process {gone.pid} is gone; marked failed"
    assert store.get_run(run_id).status == "failed"
    queued = store.create_run("waiting", tiny().to_json(), status="queued", pid=gone.pid)
    assert runner.stop(store, queued) == "was queued; marked stopped"
    assert store.get_run(queued).status == "stopped"


def test_active_reports_progress_and_eta_from_step_times(store: RunStore) -> None:
    run_id = store.create_run("live", tiny(max_steps=100).to_json(), status="running")
    me = procs.identity_of()
    store.update_run(run_id, step=40, pid=me.pid, pid_started=me.started, heartbeat=time.time())
    step_times = [(s, "train/step_time", 0.5) for s in range(40)]
    step_times[0] = (0, "train/step_time", 30.0)  # start-up: must not count
    step_times[35] = (35, "train/step_time", 5.0)  # one slow step: must not swing it
    store.log_scalars(run_id, step_times)
    store.flush()
    queued = store.create_run(
        "later", tiny().to_json(), status="queued", pid=me.pid, pid_started=me.started
    )
    runs = {run.id: run for run in runner.active(store)}
    assert runs[run_id].fraction == pytest.approx(0.4)
    assert runs[run_id].eta_s == pytest.approx(0.5 * 60)
    assert runs[queued].status == "queued" and runs[queued].eta_s is None


@pytest.mark.parametrize(
    ("env", "expected"),
    [({"BLOCKVIZ_MAX_RUNNING": "3"}, 3), ({"BLOCKVIZ_MAX_RUNNING": "zero"}, None)],
)
def test_default_max_running_honours_the_override(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: int | None
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    hardware.visible_gpus.cache_clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    value = runner.default_max_running()
    assert value == (expected or hardware.cpu_cores())  # one slot per core without a GPU
    hardware.visible_gpus.cache_clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    if expected is None:
        assert runner.default_max_running() == 2  # one slot per visible GPU
    hardware.visible_gpus.cache_clear()


def test_log_tail_returns_the_last_lines(store: RunStore) -> None:
    run_id = store.create_run("logged", tiny().to_json())
    assert runner.log_tail(store, run_id) == ""
    store.run_dir(run_id).mkdir(parents=True)
    (store.run_dir(run_id) / "train.log").write_text("".join(f"line {i}\n" for i in range(100)))
    assert runner.log_tail(store, run_id, lines=3).splitlines() == ["line 97", "line 98", "line 99"]


def test_a_replica_resumes_from_its_batch_checkpoint_in_the_first_members_folder(tmp_path):
    from blockviz.core import replicas

    with RunStore(tmp_path / "s.db") as store:
        ids = [store.create_run(f"r{i}", "{}", status="stopped", max_steps=10) for i in range(3)]
        alone = store.create_run("alone", "{}", status="stopped", max_steps=10)
        for index, run_id in enumerate(ids):
            replicas.write_batch_file(store.run_dir(run_id), ids, index)
        leader = store.run_dir(ids[0]) / "checkpoints" / "last.ckpt"
        assert runner.checkpoint_path(store, ids[2]) == leader
        assert (
            runner.checkpoint_path(store, alone)
            == store.run_dir(alone) / "checkpoints" / "last.ckpt"
        )
        run = store.get_run(ids[2])
        assert runner.resume_blocker(run, runner.checkpoint_path(store, ids[2]).is_file())
        leader.parent.mkdir(parents=True)
        leader.write_bytes(b"x")
        assert runner.resume_blocker(run, runner.checkpoint_path(store, ids[2]).is_file()) is None
