"""The words a spike or divergence finding adds when a replay of it has been analysed.

Kept out of the findings package's rules (it is not one): the lead's store link calls it
with a replay's `flight.first_break` and appends the sentence. Torch-free.
"""

from __future__ import annotations

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
