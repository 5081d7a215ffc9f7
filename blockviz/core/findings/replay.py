"""The words a spike or divergence finding adds when a replay of it has been analysed, and
the analysis a replay run keeps (`replay_result`).

Kept out of the findings package's rules (it is not one): the lead's store link calls it
with a replay's `flight.first_break` and appends the sentence. Torch-free.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from blockviz.core import flight
from blockviz.core.findings.base import step_text
from blockviz.core.flight import Break


def replay_note(
    brk: Break | None, from_step: int, event: str = "loss spike", onset: int | None = None
) -> str:
    """ "A replay from step 400 names the first statistic to leave its range: …", or that
    it found none before the event (`event` is used only then; a Break names its own). A
    window (flight.AROUND) is said to be one; an `onset` at or before `from_step` (the loss
    had left its range by then) is said to put the event's start before the replay's."""
    if event not in flight.REPLAYED:
        raise ValueError(f"event: {event!r} is not one of {', '.join(flight.REPLAYED)}")
    start = f"A replay from {step_text(from_step)}"
    late = ""
    if event != flight.AROUND and onset is not None and onset <= from_step:
        late = (
            f"The loss had already left its range at {step_text(onset)}, before this "
            f"replay's start: the {event} began before its window, and what broke first may "
            "lie before it. "
        )
    if event == flight.AROUND:
        found = "found no statistic out of its range" if brk is None else None
        text = (
            f"{start} {found} in its window, which ends at no loss spike or divergence."
            if found
            else f"{start} names a statistic that left its range in a window with no loss "
            f"spike or divergence (a departure from the run's recent past, not the start of an "
            f"event): {brk.sentence()}"
        )
        return text
    if brk is None:
        return f"{late}{start} found no statistic out of its range before the {event}."
    return (
        f"{late}{start} names the first statistic to leave its range: {brk.sentence()} {caveat()}"
    )


def caveat() -> str:
    """What the rule's held-out calibration says of any break it names."""
    return (
        f"(The rule also named a break in {flight.HELD_OUT_FALSE_ALARMS} of "
        f"{flight.HELD_OUT_WINDOWS} healthy windows of held-out runs: a lead, not a proven "
        "cause.)"
    )


def replay_result(
    ranges: pd.DataFrame,
    scalars: pd.DataFrame,
    layers: pd.DataFrame,
    start: int,
    step: int,
    event: str,
    n_layer: int,
    onset: int | None = None,
) -> dict[str, Any]:
    """What a replay from `start` of the `event` at `step` keeps (its fork_info): the first
    statistic of its probe rows (`scalars`, `layers`) out of the parent's healthy `ranges`,
    and the sentence that says so, or why it could not judge. `onset`: where the parent's
    loss left its range on the way to the event (`core.flight_start`)."""
    result: dict[str, Any] = {"event": event, "event_step": step, "start": start}
    if onset is not None:
        result["onset"] = onset
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
    result["sentence"] = replay_note(brk, start, event, onset)
    return result
