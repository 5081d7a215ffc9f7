"""The words a spike or divergence finding adds when a replay of it has been analysed, and
the analysis a replay run keeps (`replay_result`).

Kept out of the findings package's rules (it is not one): the lead's store link calls it
with a replay's `flight.first_break` and appends the sentence. Torch-free.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from blockviz.core import flight
from blockviz.core.findings.base import EVENTS, step_text
from blockviz.core.flight import Break


def replay_note(brk: Break | None, from_step: int, event: str = "loss spike") -> str:
    """ "A replay from step 400 names the first statistic to leave its range: …", or that
    it found none before the event (`event` is used only then; a Break names its own)."""
    if event not in EVENTS:
        raise ValueError(f"event: {event!r} is not one of {', '.join(EVENTS)}")
    start = f"A replay from {step_text(from_step)}"
    if brk is None:
        return f"{start} found no statistic out of its range before the {event}."
    return f"{start} names the first statistic to leave its range: {brk.sentence()}"


def replay_result(
    ranges: pd.DataFrame,
    scalars: pd.DataFrame,
    layers: pd.DataFrame,
    start: int,
    step: int,
    event: str,
    n_layer: int,
) -> dict[str, Any]:
    """What a replay from `start` of the `event` at `step` keeps (its fork_info): the first
    statistic of its probe rows (`scalars`, `layers`) out of the parent's healthy `ranges`,
    and the sentence that says so, or why it could not judge."""
    result: dict[str, Any] = {"event": event, "event_step": step, "start": start}
    try:
        brk = flight.first_break(ranges, scalars, layers, step, event, n_layer)
    except flight.ShortHistory as exc:
        result["break"] = None
        result["sentence"] = (
            f"A replay from step {start:,} could not judge: the run's probes before it are "
            f"too few to set a healthy range ({exc}); probe it more often (probe_interval) "
            "or keep a later checkpoint (ckpt_interval)."
        )
        return result
    result["break"] = brk.to_dict() if brk is not None else None
    result["sentence"] = replay_note(brk, start, event)
    return result
