"""Fork and Replay started from the dashboard: a refusal reaches the page."""

from __future__ import annotations

import sys

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
