"""The flight recorder's analysis (core/flight.py) on series whose answer is known by
construction: history rows at the parent's probe steps, replay rows at every step after
the checkpoint. No series here says what a configuration does."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from blockviz.core import flight, spec
from blockviz.core.findings.replay import caveat, replay_note, replay_result
from tests.helpers import ROOT

N_LAYER = 4
PARENT_EVERY = 50  # the parent's probe interval
CHECKPOINT = 400
EVENT = 460
HISTORY_STEPS = np.arange(PARENT_EVERY, CHECKPOINT + 1, PARENT_EVERY)
REPLAY_STEPS = np.arange(CHECKPOINT + 1, EVENT + 1)


def head_rows(steps: np.ndarray, values: np.ndarray, layer: int, head: int, stat: str) -> list:
    return [
        {
            "step": int(s),
            "layer": layer,
            "kind": "head",
            "component": str(head),
            "stat": stat,
            "value": float(v),
        }
        for s, v in zip(steps, values, strict=True)
    ]


def tap_rows(steps: np.ndarray, values: np.ndarray, layer: int, tap: str, stat: str) -> list:
    return [
        {
            "step": int(s),
            "layer": layer,
            "kind": "tap",
            "component": tap,
            "stat": stat,
            "value": float(v),
        }
        for s, v in zip(steps, values, strict=True)
    ]


def layers_frame(rows: list) -> pd.DataFrame:
    columns = ["step", "layer", "kind", "component", "stat", "value"]
    return pd.DataFrame(rows, columns=columns)


def scalars_frame(steps: np.ndarray, values: np.ndarray, name: str) -> pd.DataFrame:
    return pd.DataFrame({"step": steps, "name": name, "value": values})


NO_SCALARS = scalars_frame(np.array([], dtype=int), np.array([]), spec.TRAIN_GRAD_NORM)


def noisy(steps: np.ndarray, level: float, slope: float, noise: float, seed: int) -> np.ndarray:
    """A line with gaussian noise (a statistic of a run between probes)."""
    rng = np.random.default_rng(seed)
    return level + slope * (steps - CHECKPOINT) + rng.normal(0.0, noise, len(steps))


def analyse(history: pd.DataFrame, replay: pd.DataFrame, event: str = "loss spike"):
    ranges = flight.healthy_ranges(NO_SCALARS, history, CHECKPOINT)
    return flight.first_break(ranges, NO_SCALARS, replay, EVENT, event, N_LAYER)


@pytest.mark.parametrize("slope", [0.0, 0.004, -0.003], ids=["flat", "rising", "falling"])
def test_a_series_keeping_its_course_stays_in_range(slope: float) -> None:
    # A noisy series that keeps its level or its trend past the checkpoint never breaks,
    # whatever its noise draws (several seeds).
    for seed in range(5):
        history = head_rows(
            HISTORY_STEPS, noisy(HISTORY_STEPS, 3.0, slope, 0.05, seed), 1, 2, spec.ATTN_ENTROPY
        )
        replay = head_rows(
            REPLAY_STEPS, noisy(REPLAY_STEPS, 3.0, slope, 0.05, seed + 100), 1, 2, spec.ATTN_ENTROPY
        )
        assert analyse(layers_frame(history), layers_frame(replay)) is None


def test_a_trend_that_stops_stays_in_range() -> None:
    # Rising until the checkpoint, then flat at the level reached: both are in range.
    history = tap_rows(
        HISTORY_STEPS, noisy(HISTORY_STEPS, 5.0, 0.01, 0.02, 1), 2, "resid_post", spec.RMS
    )
    replay = tap_rows(
        REPLAY_STEPS, noisy(REPLAY_STEPS, 5.0, 0.0, 0.02, 2), 2, "resid_post", spec.RMS
    )
    assert analyse(layers_frame(history), layers_frame(replay)) is None


def test_a_jump_breaks_at_its_step_naming_the_series() -> None:
    jump = 437
    quiet_history = head_rows(
        HISTORY_STEPS, noisy(HISTORY_STEPS, 2.0, 0.0, 0.05, 3), 0, 0, spec.ATTN_LOGIT_MAX_ABS
    )
    quiet_replay = head_rows(
        REPLAY_STEPS, noisy(REPLAY_STEPS, 2.0, 0.0, 0.05, 4), 0, 0, spec.ATTN_LOGIT_MAX_ABS
    )
    history = head_rows(
        HISTORY_STEPS, noisy(HISTORY_STEPS, 2.0, 0.0, 0.05, 5), 3, 1, spec.ATTN_LOGIT_MAX_ABS
    )
    values = noisy(REPLAY_STEPS, 2.0, 0.0, 0.05, 6)
    values[jump <= REPLAY_STEPS] += 5.0
    replay = head_rows(REPLAY_STEPS, values, 3, 1, spec.ATTN_LOGIT_MAX_ABS)
    brk = analyse(layers_frame(quiet_history + history), layers_frame(quiet_replay + replay))
    assert brk is not None
    assert (brk.step, brk.scope, brk.layer, brk.component, brk.stat) == (
        jump,
        "head",
        3,
        "1",
        spec.ATTN_LOGIT_MAX_ABS,
    )
    assert brk.value == pytest.approx(values[jump == REPLAY_STEPS][0])
    assert brk.low <= 2.0 <= brk.high < brk.value
    assert brk.lead == EVENT - jump
    ranges = flight.healthy_ranges(NO_SCALARS, layers_frame(quiet_history + history), CHECKPOINT)
    replayed = layers_frame(quiet_replay + replay)
    kept = replay_result(ranges, NO_SCALARS, replayed, CHECKPOINT, EVENT, "loss spike", N_LAYER)
    assert kept["break"] == brk.to_dict()
    assert kept["sentence"] == replay_note(brk, CHECKPOINT, "loss spike")


def test_one_odd_step_is_not_a_break() -> None:
    # Out of range at one replay step only (fewer than PERSIST_STEPS in a row): no break.
    history = head_rows(
        HISTORY_STEPS, noisy(HISTORY_STEPS, 2.0, 0.0, 0.05, 7), 1, 0, spec.ATTN_ENTROPY
    )
    values = noisy(REPLAY_STEPS, 2.0, 0.0, 0.05, 8)
    values[10] += 5.0
    replay = head_rows(REPLAY_STEPS, values, 1, 0, spec.ATTN_ENTROPY)
    expected = None if flight.PERSIST_STEPS > 1 else int(REPLAY_STEPS[10])
    brk = analyse(layers_frame(history), layers_frame(replay))
    assert (brk and brk.step) == expected


def test_a_tie_goes_to_the_larger_excursion() -> None:
    # Two series leave at the same step; the one further out, in widths of its own range.
    jump = 420
    rows_history, rows_replay = [], []
    for layer, lift in ((0, 1.0), (2, 4.0)):
        rows_history += tap_rows(
            HISTORY_STEPS,
            noisy(HISTORY_STEPS, 1.0, 0.0, 0.01, layer),
            layer,
            "attn_out",
            spec.MAX_ABS,
        )
        values = noisy(REPLAY_STEPS, 1.0, 0.0, 0.01, layer + 10)
        values[jump <= REPLAY_STEPS] += lift
        rows_replay += tap_rows(REPLAY_STEPS, values, layer, "attn_out", spec.MAX_ABS)
    brk = analyse(layers_frame(rows_history), layers_frame(rows_replay))
    assert brk is not None and (brk.step, brk.layer) == (jump, 2)


def test_a_non_finite_value_is_out_of_range_and_furthest() -> None:
    history, replay = [], []
    for layer in (0, 1):
        history += head_rows(
            HISTORY_STEPS,
            noisy(HISTORY_STEPS, 1.0, 0.0, 0.01, layer),
            layer,
            0,
            spec.ATTN_LOGIT_MAX,
        )
        values = noisy(REPLAY_STEPS, 1.0, 0.0, 0.01, layer + 20)
        values[REPLAY_STEPS >= EVENT - 1] = (1e6, 1e6) if layer == 0 else (math.nan, math.inf)
        replay += head_rows(REPLAY_STEPS, values, layer, 0, spec.ATTN_LOGIT_MAX)
    brk = analyse(layers_frame(history), layers_frame(replay), "divergence")
    assert brk is not None and (brk.step, brk.layer) == (EVENT - 1, 1)
    assert math.isnan(brk.value)


def test_a_scalar_break_is_named_without_a_layer() -> None:
    history = scalars_frame(
        HISTORY_STEPS, noisy(HISTORY_STEPS, 0.5, 0.0, 0.02, 1), spec.TRAIN_GRAD_NORM
    )
    values = noisy(REPLAY_STEPS, 0.5, 0.0, 0.02, 2)
    values[REPLAY_STEPS >= 450] = 40.0
    replay = scalars_frame(REPLAY_STEPS, values, spec.TRAIN_GRAD_NORM)
    empty = layers_frame([])
    ranges = flight.healthy_ranges(history, empty, CHECKPOINT)
    brk = flight.first_break(ranges, replay, empty, EVENT, "loss spike", N_LAYER)
    assert brk is not None
    assert (brk.step, brk.scope, brk.layer, brk.component) == (450, flight.SCALAR, None, None)
    assert spec.METRICS[spec.TRAIN_GRAD_NORM].label in brk.sentence()


def test_too_little_history_is_refused() -> None:
    few = HISTORY_STEPS[-(flight.MIN_HISTORY - 1) :]
    history = head_rows(few, np.ones(len(few)), 0, 0, spec.ATTN_ENTROPY)
    ranges = flight.healthy_ranges(NO_SCALARS, layers_frame(history), CHECKPOINT)
    assert ranges.empty
    with pytest.raises(flight.ShortHistory):
        flight.first_break(ranges, NO_SCALARS, layers_frame(history), EVENT, "loss spike", N_LAYER)
    # What the replay run keeps then: no break, and a sentence that says why.
    kept = replay_result(
        ranges, NO_SCALARS, layers_frame(history), 400, EVENT, "loss spike", N_LAYER
    )
    assert kept["break"] is None and kept["start"] == 400 and kept["event_step"] == EVENT
    assert "could not judge" in kept["sentence"] and "probe_interval" in kept["sentence"]


def test_a_mean_near_zero_is_judged_on_its_taps_scale() -> None:
    # A tap's mean drifting by a hundredth of the tap's RMS is no break, however small
    # the mean itself; the same drift in a tap without an RMS series is.
    mean_history = noisy(HISTORY_STEPS, 0.001, 0.0, 0.0001, 1)
    mean_replay = np.full(len(REPLAY_STEPS), 0.011)
    rms = np.full(len(HISTORY_STEPS), 1.0)
    history = tap_rows(HISTORY_STEPS, mean_history, 0, "norm1_out", spec.MEAN)
    replay = tap_rows(REPLAY_STEPS, mean_replay, 0, "norm1_out", spec.MEAN)
    with_rms = history + tap_rows(HISTORY_STEPS, rms, 0, "norm1_out", spec.RMS)
    assert analyse(layers_frame(with_rms), layers_frame(replay)) is None
    brk = analyse(layers_frame(history), layers_frame(replay))
    assert brk is not None and brk.step == REPLAY_STEPS[0]


def test_a_range_of_a_nonnegative_series_stops_at_zero() -> None:
    # A norm whose probes scatter widely: its range never reaches below 0, so a replay
    # value of 0 is in it and a negative one (impossible for a norm, here by construction)
    # is out.
    history = noisy(HISTORY_STEPS, 1.0, 0.0, 0.0, 1)
    history[::2] = 0.1
    rows = tap_rows(HISTORY_STEPS, history, 1, "resid_post", spec.RMS)
    ranges = flight.healthy_ranges(NO_SCALARS, layers_frame(rows), CHECKPOINT)
    low, high = flight.bounds_at(ranges, np.array([CHECKPOINT + 1]))
    assert low[0] == 0.0 < high[0]
    replay = tap_rows(REPLAY_STEPS, np.zeros(len(REPLAY_STEPS)), 1, "resid_post", spec.RMS)
    assert analyse(layers_frame(rows), layers_frame(replay)) is None
    below = tap_rows(REPLAY_STEPS, np.full(len(REPLAY_STEPS), -0.01), 1, "resid_post", spec.RMS)
    assert analyse(layers_frame(rows), layers_frame(below)) is not None


def test_history_after_the_checkpoint_and_param_rows_are_not_read() -> None:
    steps = np.arange(PARENT_EVERY, EVENT + 1, PARENT_EVERY)
    values = np.where(steps > CHECKPOINT, 100.0, 1.0)
    rows = tap_rows(steps, values, 0, "resid_post", spec.RMS)
    rows += [dict(row, kind="param", component="blocks.0.attn.qkv.weight") for row in rows]
    ranges = flight.healthy_ranges(NO_SCALARS, layers_frame(rows), CHECKPOINT)
    assert list(ranges["scope"]) == ["tap"]
    assert ranges["level"].iloc[0] == pytest.approx(1.0)


def a_break(**changes: object) -> flight.Break:
    """A Break at block 3 head 1, six steps before a loss spike, with `changes`."""
    fields = {
        "step": 412,
        "event_step": 418,
        "event": "loss spike",
        "scope": "head",
        "layer": 3,
        "component": "1",
        "stat": spec.ATTN_LOGIT_MAX_ABS,
        "value": 61.0,
        "low": 10.0,
        "high": 20.0,
        "n_layer": N_LAYER,
    }
    return flight.Break(**{**fields, **changes})


def test_sentence_names_place_range_step_and_lead() -> None:
    text = a_break().sentence()
    label = spec.METRICS[spec.ATTN_LOGIT_MAX_ABS].label
    assert text.startswith(f"Block 3 head 1's {label} left its range (10–20) at step 412")
    assert "6 steps before the loss spike" in text and "61" in text
    assert "the step of the divergence" in a_break(step=418, event="divergence").sentence()
    assert "1 step before" in a_break(step=417).sentence()
    head_end = a_break(scope="component", layer=N_LAYER, component="norm", stat=spec.GRAD_NORM)
    assert head_end.sentence().startswith("The head end norms' ")
    whole = a_break(scope=flight.SCALAR, layer=None, component=None, stat=spec.TRAIN_GRAD_NORM)
    assert whole.sentence().startswith(f"The model's {spec.METRICS[spec.TRAIN_GRAD_NORM].label}")


def test_dict_round_trip() -> None:
    brk = a_break(
        event="divergence",
        scope=flight.SCALAR,
        layer=None,
        component=None,
        stat=spec.PROBE_LOG_Z,
        value=math.inf,
    )
    assert flight.Break.from_dict(brk.to_dict()) == brk
    assert flight.Break.from_dict({**brk.to_dict(), "extra": 1}) == brk
    assert flight.Break.from_dict(a_break().to_dict()) == a_break()


def test_replay_note() -> None:
    brk = a_break(scope="tap", layer=-1, component="resid_post", stat=spec.RMS)
    note = replay_note(brk, 400)
    assert note.startswith("A replay from step 400 names the first statistic")
    assert brk.sentence() in note
    # Every named break carries the rule's held-out false-alarm rate (it misses 1 in 20).
    assert note.endswith("healthy windows of held-out runs: a lead, not a proven cause.)")
    assert replay_note(None, 400, "divergence") == (
        "A replay from step 400 found no statistic out of its range before the divergence."
    )
    with pytest.raises(ValueError, match="event"):
        replay_note(None, 400, "spike")


def test_a_signed_statistic_may_cross_zero() -> None:
    # A tap's mean, positive at every probe before the checkpoint, may go slightly
    # negative: only statistics that cannot be negative have ranges that stop at 0.
    history = tap_rows(
        HISTORY_STEPS, noisy(HISTORY_STEPS, 0.002, 0.0, 0.0005, 3), 2, "attn_out", spec.MEAN
    )
    history += tap_rows(HISTORY_STEPS, np.full(len(HISTORY_STEPS), 0.5), 2, "attn_out", spec.RMS)
    replay = tap_rows(REPLAY_STEPS, np.full(len(REPLAY_STEPS), -0.002), 2, "attn_out", spec.MEAN)
    assert analyse(layers_frame(history), layers_frame(replay)) is None


def test_a_range_holds_the_checkpoint_s_own_value_of_a_series_rising_faster():
    # Issue 39's audit: fitted on probes 50–300 the range ran 4.05–6.14 while the run's own
    # probe at 300 was 6.83 (a rising series), so the first replayed step broke. Here a
    # steady rise whose newest probe is above the line through the others.
    steps = np.arange(50, 301, 50)
    values = np.array([4.05, 4.3, 4.55, 4.8, 5.05, 6.83])
    history = tap_rows(steps, values, 2, "resid_post", spec.RMS)
    ranges = flight.healthy_ranges(NO_SCALARS, layers_frame(history), 300)
    for step in (300, 301):
        low, high = flight.bounds_at(ranges, np.array([step]))
        assert low[0] <= 6.83 <= high[0]
    # it goes on rising from where it got to: no break over the next 100 steps
    after = np.arange(301, 401)
    replay = tap_rows(after, 6.83 + 0.02 * (after - 300), 2, "resid_post", spec.RMS)
    brk = flight.first_break(ranges, NO_SCALARS, layers_frame(replay), 400, "loss spike", 4)
    assert brk is None


def test_a_window_is_no_event_and_its_sentence_says_so():
    # A replay --around a step with no spike: a break in it leads up to nothing.
    brk = a_break(event=flight.AROUND, step=412, event_step=450)
    assert "steps before" not in brk.sentence()
    assert "no loss spike or divergence" in brk.sentence()
    assert "not the start of an event" in replay_note(brk, 400, flight.AROUND)
    quiet = replay_note(None, 400, flight.AROUND)
    assert "found no statistic" in quiet and "before the" not in quiet


def test_the_caveat_s_counts_are_the_committed_held_out_calibration() -> None:
    results = json.loads((ROOT / "benchmarks/results/flight-calibration.json").read_text())
    held_out = results["sets"]["held-out"]
    assert held_out["false_alarms"] == flight.HELD_OUT_FALSE_ALARMS
    assert len(held_out["windows"]) == flight.HELD_OUT_WINDOWS
    assert f"{held_out['false_alarms']} of {len(held_out['windows'])} healthy" in caveat()
