"""A fork's link to its parent and its copy of the parent's past, on both backends."""

from __future__ import annotations

import pytest

from blockviz.core.spec import GRAD_NORM, TRAIN_LOSS, VAL_LOSS
from blockviz.store import RunStore
from blockviz.views import run_findings


@pytest.fixture
def store(store_url: str) -> RunStore:
    with RunStore(store_url, flush_seconds=None) as opened:
        yield opened


def test_a_fork_copies_the_rows_before_its_step_and_the_evaluation_at_it(store):
    parent = store.create_run("parent", "{}")
    store.log_scalars(parent, [(s, TRAIN_LOSS, 3.0 - s / 10) for s in range(6)])
    store.log_scalars(parent, [(0, VAL_LOSS, 3.5), (4, VAL_LOSS, 2.5)])
    store.log_layer_stats(
        parent, [(s, 0, "component", "block", GRAD_NORM, 0.1 * s) for s in (0, 2, 4)]
    )
    store.flush()
    twin = store.create_run(
        "twin", "{}", parent_id=parent, fork_step=4, fork_kind="fork", fork_info={"changes": {}}
    )
    copied = store.copy_history(parent, twin, 4, [VAL_LOSS])
    assert copied == 4 + 2 + 2  # train losses 0-3, val at 0 and 4, grad norms at 0 and 2
    assert store.scalars(twin, TRAIN_LOSS)["step"].tolist() == [0, 1, 2, 3]
    assert store.scalars(twin, VAL_LOSS)["step"].tolist() == [0, 4]
    assert store.layer_stats(twin, "component")["step"].tolist() == [0, 2]
    assert [r.id for r in store.twins_of(parent)] == [twin]
    assert store.twins_of(parent, "replay") == []
    frame = store.runs_frame().set_index("id")
    assert frame.loc[twin, ["parent_id", "fork_step", "fork_kind"]].tolist() == [parent, 4, "fork"]
    assert frame.loc[parent, "fork_kind"] == ""
    store.delete_run(parent)
    assert store.get_run(twin).parent_id is None
    assert len(store.scalars(twin, TRAIN_LOSS)) == 4


def test_a_runs_findings_are_read_again_when_a_replay_of_it_finds_something(store):
    """Cached findings of a stopped run that spiked: a replay finishing later must show."""
    parent = store.create_run("spiky", "{}", status="stopped")
    losses = [(s, TRAIN_LOSS, 2.0) for s in range(80)] + [(80, TRAIN_LOSS, 9.0)]
    store.log_scalars(parent, losses)
    store.flush()
    store.update_run(parent, step=80)
    before = run_findings.cached_findings(store, store.get_run(parent))
    spike = next(f for f in before.findings if f.rule == "loss_spike")
    assert "replay" not in spike.text.lower()
    info = {"event": "loss spike", "event_step": 80, "sentence": "Block 0 broke first."}
    store.create_run("replay", "{}", parent_id=parent, fork_step=60, fork_kind="replay")
    replay = int(store.runs_frame()["id"].max())
    store.update_run(replay, fork_info=info)
    after = run_findings.cached_findings(store, store.get_run(parent))
    spike = next(f for f in after.findings if f.rule == "loss_spike")
    assert spike.text.endswith("Block 0 broke first.")
