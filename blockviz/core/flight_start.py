"""Where a replay of an event starts: the last kept checkpoint before the loss left its range.

A replay judges the steps after its checkpoint against the range the run's own probes set
before it; a checkpoint taken once the blow-up had begun (README's run: loss 106.6 at the
checkpoint step 400, 2.5 at 385) would call the trouble normal. So the start is the last
kept step before the loss's *onset*: the first step of the stretch of logged train losses
out of their range that ends at the event. A logged loss is out of its range when it is not
finite or above SPIKE_FACTOR × the median of the SPIKE_WINDOW logged losses before it (the
loss-spike finding's test); two out-of-range losses at most ONSET_GAP steps apart belong to
one stretch. When no kept step lies before the onset the replay starts from the last kept
step before the event and says that the event began before its window. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from blockviz.core.findings.thresholds import SPIKE_FACTOR, SPIKE_WINDOW
from blockviz.core.findings.training import median_before

ONSET_GAP = SPIKE_WINDOW  # steps between two out-of-range losses of one stretch


@dataclass(frozen=True)
class ReplayStart:
    """The checkpoint a replay starts from and the loss's onset it was chosen by; `late`
    when the onset is at or before the checkpoint (no kept step before it)."""

    start: int
    onset: int

    @property
    def late(self) -> bool:
        """The loss had left its range by the start: the event began before the window."""
        return self.onset <= self.start


def out_of_range(loss: pd.DataFrame) -> np.ndarray:
    """The steps of the logged train losses (`loss`: step, value) out of their range."""
    loss = loss.sort_values("step", kind="stable")
    values = loss["value"].to_numpy(dtype=float)
    before = median_before(values)
    with np.errstate(invalid="ignore"):
        out = ~np.isfinite(values) | (values > SPIKE_FACTOR * before)
    return loss["step"].to_numpy(dtype=np.int64)[out]


def loss_onset(loss: pd.DataFrame, event_step: int) -> int:
    """The first step of the stretch of out-of-range logged losses (`loss`: step, value)
    that reaches the event (`event_step` itself when the loss before it stayed in range)."""
    onset = int(event_step)
    steps = out_of_range(loss)
    for step in steps[steps <= event_step][::-1]:
        if onset - int(step) > ONSET_GAP:
            break
        onset = int(step)
    return onset


def replay_start(kept: Iterable[int], onset: int, event_step: int) -> ReplayStart | None:
    """The last kept step before the onset, else the last before the event (late); None
    when no kept step lies before the event."""
    kept = sorted(int(step) for step in kept)
    healthy = [step for step in kept if step < onset]
    if healthy:
        return ReplayStart(healthy[-1], onset)
    earlier = [step for step in kept if step < event_step]
    return ReplayStart(earlier[-1], onset) if earlier else None
