"""Where a replay of an event starts (core/flight_start.py): the last kept checkpoint before
the loss left its range, on losses shaped like README's run (issue 39 defect 3)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from blockviz.core import flight_start
from blockviz.core.findings.replay import replay_note


def readme_losses() -> pd.DataFrame:
    """Logged every step: about 2.5 up to 390, spikes from 391 (106.6 at 400), NaN at 415."""
    steps = np.arange(1, 416)
    rng = np.random.default_rng(0)
    values = 2.5 + rng.normal(0, 0.02, len(steps))
    values[steps >= 391] = np.where(steps[steps >= 391] % 3 == 0, 2.6, 30.0)
    values[steps == 400] = 106.6
    values[-1] = math.nan
    return pd.DataFrame({"step": steps, "value": values})


def test_the_replay_of_a_divergence_starts_before_the_loss_left_its_range():
    loss = readme_losses()
    onset = flight_start.loss_onset(loss, 415)
    assert onset == 391
    chosen = flight_start.replay_start([100, 200, 300, 400], onset, 415)
    assert chosen is not None and chosen.start == 300 and not chosen.late


def test_a_loss_in_range_up_to_the_event_keeps_the_last_checkpoint_before_it():
    steps = np.arange(1, 301)
    loss = pd.DataFrame({"step": steps, "value": np.full(len(steps), 2.0)})
    assert flight_start.loss_onset(loss, 250) == 250
    assert flight_start.replay_start([100, 200], 250, 250).start == 200


def test_an_event_that_began_before_every_kept_checkpoint_is_said_to():
    loss = readme_losses()
    chosen = flight_start.replay_start([400], flight_start.loss_onset(loss, 415), 415)
    assert chosen is not None and chosen.start == 400 and chosen.late
    note = replay_note(None, chosen.start, "divergence", chosen.onset)
    assert note.startswith("The loss had already left its range at step 391, before this")
    assert "began before its window" in note
    assert flight_start.replay_start([420], 391, 415) is None
