"""Fork and Replay started from the dashboard: a refusal reaches the page."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import pytest

from blockviz.launch import forking
from blockviz.launch.runner import LaunchError
from blockviz.store import RunStore


@pytest.fixture
def store(tmp_path) -> RunStore:
    with RunStore(tmp_path / "runs.db") as opened:
        yield opened


def test_a_refusal_during_the_startup_watch_is_a_launch_error_with_its_line(store):
    run_id = store.create_run("parent", "{}")
    refuse = "print('blockviz fork: error: --step 7: pick one'); raise SystemExit(2)"
    with pytest.raises(LaunchError, match="--step 7: pick one"):
        forking.start(store, run_id, [sys.executable, "-c", refuse, "fork"])
    assert forking.last_refusal(store, run_id) == "blockviz fork: error: --step 7: pick one"


def test_only_a_refusal_as_the_newest_line_is_reported(store):
    run_id = store.create_run("parent", "{}")
    assert forking.last_refusal(store, run_id) is None  # no log yet
    log = store.run_dir(run_id) / forking.FORK_LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("blockviz replay: error: no checkpoint\nblockviz: run 2 (x) fork of run 1\n")
    assert forking.last_refusal(store, run_id) is None
    with open(log, "a") as more:
        more.write("blockviz replay: error: run 1 neither diverged nor spiked\n")
    assert forking.last_refusal(store, run_id).endswith("neither diverged nor spiked")


def test_the_commands_name_the_store_and_the_changes(store):
    command = forking.fork_command(store, 3, 100, {"norm_position": "pre", "lr": 0.003})
    assert command[3:] == [
        *("fork", "3", "--step", "100", "--store", store.location.text, "--no_progress"),
        *("--norm_position", "pre", "--lr", "0.003"),
    ]
    assert forking.replay_command(store, 3, 411)[3:7] == ["replay", "3", "--around", "411"]


# A stand-in for `python -m blockviz fork`: registers a twin of run argv[2] under this
# process's pid, as registration does, then keeps training (sleeps).
REGISTERS = (
    "import os, sys, time\n"
    "from blockviz.store import RunStore\n"
    "with RunStore(sys.argv[1]) as store:\n"
    "    store.create_run('twin', '{}', parent_id=int(sys.argv[2]), fork_step=10,\n"
    "                     fork_kind='fork', pid=os.getpid())\n"
    "time.sleep(60)\n"
)


def _stop(pid: int | None) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def test_a_started_fork_names_the_twin_its_process_registered(store):
    """Issue 35, 10: the start watches until the twin's row appears and returns it;
    an earlier twin of the same parent is not mistaken for it."""
    parent = store.create_run("parent", "{}")
    older = store.create_run("older", "{}", parent_id=parent, fork_step=5, fork_kind="fork")
    command = [sys.executable, "-c", REGISTERS, store.location.text, str(parent)]
    began = time.monotonic()
    twin = forking.start(store, parent, command)
    try:
        assert twin is not None and twin != older
        assert store.get_run(twin).name == "twin"
        assert time.monotonic() - began < 60  # it did not wait for the process to end
    finally:
        _stop(store.get_run(twin).pid if twin else None)


def test_a_fork_not_registered_in_time_starts_without_a_name(store, monkeypatch):
    monkeypatch.setattr(forking, "REGISTER_WAIT_S", 0.5)
    parent = store.create_run("parent", "{}")
    proc_pids = []
    real_spawn = forking.spawn_logged
    monkeypatch.setattr(
        forking, "spawn_logged", lambda *a: proc_pids.append(p := real_spawn(*a)) or p
    )
    try:
        assert (
            forking.start(store, parent, [sys.executable, "-c", "import time; time.sleep(60)"])
            is None
        )
    finally:
        _stop(proc_pids[0].pid if proc_pids else None)
