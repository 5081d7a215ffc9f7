"""A study's time estimate (issue 35, 11): the seconds a step this store's completed runs
took, evaluations included, played through the workers' claims; a rough guess, said so,
when nothing is measured. Torch-free: constructed runs."""

from __future__ import annotations

import pytest

from blockviz.core.studies import builtins
from blockviz.launch import study_estimate
from blockviz.store import RunStore

STEP_S = 0.1  # what each constructed run took a step, evaluations included


@pytest.fixture
def store(tmp_path) -> RunStore:
    with RunStore(tmp_path / "runs.db") as opened:
        yield opened


def _measured(store: RunStore, key: str, vocab_size: int = 103) -> None:
    """The study's runs as completed runs of this store, trained solo at STEP_S a step; their
    tokens/s (training only) says nothing of the evaluations, so it is made misleading."""
    for variant, seed, config in builtins.builtin(key, "quick").grid():
        stored = config.to_dict()
        stored["model"]["vocab_size"] = vocab_size  # set from the data when a run starts
        steps = config.train.max_steps
        run_id = store.create_run(f"{variant} {seed}", stored, status="completed")
        store.update_run(
            run_id, step=steps, final={"time_s": steps * STEP_S, "tokens_per_sec": 1e9}
        )


def test_the_estimate_plays_the_measured_seconds_a_step_through_the_workers_claims(store):
    _measured(store, "sublayers")
    pace = study_estimate.measured_pace(store)
    assert pace.runs == 6 and sorted(pace.step_s.values()) == pytest.approx([STEP_S] * 3)
    plan = builtins.builtin("sublayers", "quick")
    # 3 shapes × 2 seeds, 2 workers: a pair each (share 3), then the last pair split (share 1).
    run_s = 300 * STEP_S + study_estimate.PER_RUN_OVERHEAD_S
    expected = study_estimate.WORKER_START_S + 3 * run_s
    assert study_estimate.estimate_s(plan, pace, workers=2, replica_limit=8) == pytest.approx(
        expected
    )
    said = study_estimate.estimate_assumes(plan, 2, max_running=2, threads=1, pace=pace)
    assert said.startswith("from the pace this store's last 6 completed run(s) measured here")
    assert "6 of its 6 runs have a measured run of their shape" in said


def test_a_shape_nobody_measured_is_scaled_from_the_nearest_by_flops(store):
    _measured(store, "sublayers")
    pace = study_estimate.measured_pace(store)
    (wider,) = [c for v, s, c in builtins.builtin("ffn-ratio", "quick").grid() if s == 1][-1:]
    flops = study_estimate.step_flops(wider)
    assert not pace.measured(flops)
    nearest = min(pace.step_s, key=lambda f: abs(f - flops))
    assert pace.seconds_per_step(flops) == pytest.approx(STEP_S * flops / nearest)


def test_with_nothing_measured_the_estimate_is_a_rough_guess_and_says_so(store):
    pace = study_estimate.measured_pace(store)
    assert pace.runs == 0
    plan = builtins.builtin("sublayers", "quick")
    said = study_estimate.estimate_assumes(plan, 2, max_running=2, threads=1, pace=pace)
    assert said.startswith("from a rough guess: no completed run in this store measured")
    assert study_estimate.estimate_s(plan, pace, 2) > study_estimate.WORKER_START_S
