"""Live shows an ops run's answer accuracy beside the trivial baseline's on the same answers."""

from __future__ import annotations

import os
from pathlib import Path

from streamlit.testing.v1 import AppTest

from blockviz.core import replicas
from blockviz.store import RunStore
from tests import fakes
from tests.helpers import shown

LIVE = Path(__file__).resolve().parents[2] / "pages" / "live.py"


def _live_captions(run_id: int) -> list[str]:
    at = AppTest.from_file(str(LIVE), default_timeout=60)
    at.session_state["run_id"] = run_id
    at.run()
    assert not at.exception
    return [caption.value for caption in at.caption]


def test_live_shows_answer_accuracy_beside_the_baseline() -> None:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        (run_id,) = fakes.populate(
            store, n_runs=1, n_steps=40, n_layer=2, n_head=2, statuses=("completed",)
        )
        # Values without a trend: only where they are shown is under test.
        store.log_scalars(
            run_id,
            [
                (20, "val/answer_acc", 0.125),
                (20, "val/answer_baseline", 0.5),
                (40, "val/answer_acc", 0.375),
                (40, "val/answer_baseline", 0.5),
            ],
        )
        store.flush()
    captions = _live_captions(run_id)
    line = next(c for c in captions if c.startswith("Answer accuracy"))
    assert "step 40: 37.5%" in line and "same answers: 50.0%" in line


def test_live_shows_no_answer_line_outside_the_ops_task() -> None:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        (run_id,) = fakes.populate(
            store, n_runs=1, n_steps=40, n_layer=2, n_head=2, statuses=("completed",)
        )
    assert not any(c.startswith("Answer accuracy") for c in _live_captions(run_id))


def test_live_names_a_replicas_batch_and_says_stop_and_resume_act_on_all_of_it() -> None:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        ids = fakes.populate(
            store, n_runs=3, n_steps=20, n_layer=2, n_head=2, statuses=("completed",) * 3
        )
        for index, run_id in enumerate(ids):
            replicas.write_batch_file(store.run_dir(run_id), ids, index)
        alone = fakes.populate(store, n_runs=1, n_steps=20, statuses=("completed",))[0]
    batch = [shown(c) for c in _live_captions(ids[1]) if "Batch:" in c]
    assert len(batch) == 1
    runs = ", ".join(f"#{i}" for i in ids)
    assert f"replica 2 of 3 (runs {runs})" in batch[0]
    assert "Stop and Resume act on the whole batch" in batch[0]
    assert not any("Batch:" in c for c in _live_captions(alone))
