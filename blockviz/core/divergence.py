"""Where and how a run diverged, from its stored row and scalars (pure, torch-free).

Facts first (a dataclass), words second (`render_divergence`), so the findings (on Live, in
`show` and the report) tell a diverged run's story in the same sentences, as plain text
(Live escapes it for Markdown).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from blockviz.core import spec


@dataclass(frozen=True)
class Divergence:
    """Where a run diverged and how, from its last steps read whole (not downsampled)."""

    step: int | None  # the stored diverged step, else the first step with a non-finite value
    last_finite_loss: float | None  # the last finite train/loss, and its step
    last_finite_step: int | None
    nonfinite_step: int | None  # the first step with non-finite values, and those values
    nonfinite: tuple[tuple[str, float], ...]
    error: str | None  # what the run recorded when it stopped


def summarize_divergence(
    scalars: pd.DataFrame, *, diverged_step: int | None = None, error: str | None = None
) -> Divergence:
    """The facts of a divergence from the run's scalars around the step and what its row
    recorded (the step it diverged at, its error)."""
    values = scalars["value"].to_numpy(dtype=float)
    bad = scalars[~np.isfinite(values)]
    step = diverged_step
    if step is None and not bad.empty:
        step = int(bad["step"].min())
    loss = scalars[scalars["name"] == spec.TRAIN_LOSS]
    finite = loss[np.isfinite(loss["value"].to_numpy(dtype=float))]
    last = finite.iloc[-1] if not finite.empty else None
    nonfinite_step = None if bad.empty else int(bad["step"].min())
    first = bad[bad["step"] == nonfinite_step]
    return Divergence(
        step=None if step is None else int(step),
        last_finite_loss=None if last is None else float(last["value"]),
        last_finite_step=None if last is None else int(last["step"]),
        nonfinite_step=nonfinite_step,
        nonfinite=tuple(
            (str(name), float(value))
            for name, value in zip(first["name"], first["value"], strict=True)
        ),
        error=str(error) if error else None,
    )


def format_nonfinite(value: float) -> str:
    """'NaN', '+inf' or '-inf'."""
    return "NaN" if math.isnan(value) else ("+inf" if value > 0 else "-inf")


def _unchanged(text: str) -> str:
    return text


def render_divergence(
    facts: Divergence,
    *,
    bold: Callable[[str], str] = _unchanged,
    code: Callable[[str], str] = _unchanged,
    text: Callable[[str], str] = _unchanged,
) -> str:
    """The divergence in sentences; plain text unless the markup callables say otherwise.

    `bold` wraps the headline, `code` each metric name, `text` the run's recorded error
    (user-facing text: a Markdown caller escapes it).
    """
    where = f" at step {facts.step:,}" if facts.step is not None else ""
    parts = [bold(f"This run diverged{where}.")]
    if facts.last_finite_loss is not None and facts.last_finite_step is not None:
        parts.append(
            f"The last finite training loss was {facts.last_finite_loss:.4g} "
            f"at step {facts.last_finite_step:,}."
        )
    if facts.nonfinite_step is not None:
        what = ", ".join(
            f"{code(name)} = {format_nonfinite(value)}" for name, value in facts.nonfinite
        )
        parts.append(f"At step {facts.nonfinite_step:,}: {what}.")
    if facts.error:
        parts.append(text(facts.error))
    return " ".join(parts)
