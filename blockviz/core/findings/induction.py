"""The induction-head rule: when a head's prefix matching formed, and whether the training
loss bent there. Informational: a head forming is neither a fault nor a requirement.

An induction head (Olsson et al. 2022) needs a head of an earlier layer to move the
previous token's identity forward, so the rule reads models of two blocks or more. A head
has formed at the first probe step from which its prefix_score stays at or above the
formation threshold (`formation_threshold`: PREFIX_THRESHOLD, or PREFIX_OVER_UNIFORM times
what uniform attention scores where that is more) at every probe up to the newest (at
least PERSIST of them): a score that crosses and falls back has not formed. The bend test
compares least-squares slopes of the logged training loss over the BEND_WINDOW steps before
and after that step. Torch-free.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.core.findings.base import (
    Finding,
    RunSeries,
    blocks,
    layer_name,
    num,
    step_text,
    streak,
)
from blockviz.core.findings.thresholds import (
    BEND_FACTOR,
    BEND_MIN_POINTS,
    BEND_WINDOW,
    BEND_Z,
    PREFIX_OVER_UNIFORM,
    PREFIX_THRESHOLD,
)
from blockviz.core.induction import repeat_half, uniform_prefix_score

RULE = "induction_heads"
FLAT_SLOPE = 1e-9  # nats per 1,000 steps: a loss this flat has no slope to compare with


def loss_slope(loss: pd.DataFrame, start: int, stop: int) -> tuple[float, float] | None:
    """The least-squares slope of the logged loss over steps [start, stop) and its standard
    error, both in nats per 1,000 steps; None when the window starts before step 0, the
    loss was not logged up to its end, or it holds fewer than BEND_MIN_POINTS finite values."""
    if start < 0 or loss.empty or int(loss["step"].iloc[-1]) < stop - 1:
        return None
    window = loss[(loss["step"] >= start) & (loss["step"] < stop)]
    steps = window["step"].to_numpy(dtype=float)
    values = window["value"].to_numpy(dtype=float)
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    if len(steps) < BEND_MIN_POINTS:
        return None
    centred = steps - steps.mean()
    slope = float((centred * values).sum() / (centred**2).sum())
    residuals = values - values.mean() - slope * centred
    error = math.sqrt(float((residuals**2).sum()) / (len(steps) - 2) / float((centred**2).sum()))
    return slope * 1000.0, error * 1000.0


def loss_bend(series: RunSeries, step: int) -> dict[str, float | bool | None]:
    """The train loss's slope over the BEND_WINDOW steps before `step` and after it, their
    ratio (after / before) and the change's z score (|after − before| over its standard
    error); it bends when the ratio is beyond BEND_FACTOR either way and z ≥ BEND_Z."""
    loss = series.scalar(spec.TRAIN_LOSS)
    before = loss_slope(loss, step - BEND_WINDOW, step)
    after = loss_slope(loss, step, step + BEND_WINDOW)
    bend: dict[str, float | bool | None] = {
        "before": before[0] if before else None,
        "after": after[0] if after else None,
        "ratio": None,
        "z": None,
        "bends": None,
    }
    if before is None or after is None:
        return bend
    error = math.hypot(before[1], after[1])
    bend["z"] = abs(after[0] - before[0]) / error if error > 0 else math.inf
    if abs(before[0]) < FLAT_SLOPE:
        return bend
    ratio = after[0] / before[0]
    bend["ratio"] = ratio
    beyond = ratio >= BEND_FACTOR or ratio <= 1.0 / BEND_FACTOR
    bend["bends"] = bool(beyond and bend["z"] >= BEND_Z)
    return bend


def bend_text(bend: dict[str, float | bool | None], step: int) -> str:
    """The bend test's result in words, with its numbers."""
    before, after, ratio, z = bend["before"], bend["after"], bend["ratio"], bend["z"]
    if before is None or after is None:
        return (
            f" Whether the training loss bends there needs {BEND_WINDOW:,} logged steps on "
            f"each side of {step_text(step)}."
        )
    slopes = (
        f"its slope is {num(float(before))} nats per 1,000 steps over the {BEND_WINDOW:,} steps "
        f"before and {num(float(after))} over the {BEND_WINDOW:,} after"
    )
    if ratio is None:
        return f" The training loss was flat before it: {slopes}."
    change = f"{num(float(ratio))}× the slope before, a change of {num(float(z))} standard errors"
    if bend["bends"]:
        way = "steeper" if float(ratio) >= BEND_FACTOR else "flatter"
        return f" The training loss bends there: {slopes}, {change} ({way})."
    return (
        f" The training loss does not bend there: {slopes}, {change} (a bend is a factor of "
        f"{BEND_FACTOR:g} either way and at least {BEND_Z:g} standard errors)."
    )


def formation_threshold(block_size: int | None) -> float:
    """The prefix score a head must keep to count as formed: PREFIX_THRESHOLD, or
    PREFIX_OVER_UNIFORM times the uniform-attention score of the run's repeated batch where
    that is more (short contexts: block_size 32 gives 0.085); PREFIX_THRESHOLD when the
    block size is unknown."""
    if block_size is None or repeat_half(block_size) < 1:
        return PREFIX_THRESHOLD
    uniform = uniform_prefix_score(repeat_half(block_size))
    return max(PREFIX_THRESHOLD, PREFIX_OVER_UNIFORM * uniform)


def induction_heads(series: RunSeries) -> Finding | None:
    """When the first head's prefix-matching score crossed the formation threshold and
    stayed there, and whether the loss bent at that step; or, when none did, the largest
    score seen."""
    table = blocks(series.table("head", spec.PREFIX_SCORE), series.n_layer)
    if table.empty or series.n_layer < 2:
        return None
    scores = table.astype(float)
    newest = int(scores.index[-1])
    block_size = series.config.model.block_size if series.config is not None else None
    threshold = formation_threshold(block_size)
    above = scores >= threshold
    starts = {column: streak(above[column]) for column in scores.columns}
    formed = {column: since for column, since in starts.items() if since is not None}
    if not formed:
        return _not_formed(series, scores, newest, threshold)
    (layer, head), since = min(formed.items(), key=lambda item: (item[1], item[0]))
    where = f"{layer_name(int(layer), series.n_layer)} head {head}"
    at_since = float(scores.loc[since, (layer, head)])
    latest = float(scores[(layer, head)].iloc[-1])
    copies = series.table("head", spec.COPY_SCORE)
    copy = float(copies.iloc[-1][(layer, head)]) if (layer, head) in copies else None
    others = sorted(c for c in formed if c != (layer, head))
    text = (
        f"The prefix-matching score of {where} reached {num(at_since)} at "
        f"{step_text(since)} and has stayed at or above {num(threshold)} at every probe "
        f"since ({num(latest)} at {step_text(newest)})"
    )
    if copy is not None:
        text += f"; its copying score there is {num(copy)}"
    text += "."
    if others:
        names = ", ".join(f"{layer_name(int(c[0]), series.n_layer)} head {c[1]}" for c in others)
        text += f" Also formed: {names}."
    bend = loss_bend(series, since)
    text += bend_text(bend, since)
    evidence = {
        "layer": int(layer),
        "head": int(head),
        "since": since,
        "score": at_since,
        "latest": latest,
        "copying": copy,
        "heads": len(formed),
        "bend": bend,
    }
    title = f"Induction heads formed at {step_text(since)}"
    return Finding(RULE, "info", title, text, since, spec.PREFIX_SCORE, evidence)


def _not_formed(series: RunSeries, scores: pd.DataFrame, newest: int, threshold: float) -> Finding:
    """No head's score has stayed above the threshold: the largest seen, where and when,
    and whether it crossed and fell back."""
    values = scores.to_numpy(dtype=float)
    if not np.isfinite(values).any():
        best_text, evidence = "no finite score was recorded", {"step": newest}
    else:
        row, col = np.unravel_index(np.nanargmax(values), values.shape)
        layer, head = scores.columns[col]
        best, at = float(values[row, col]), int(scores.index[row])
        best_text = (
            f"the largest score seen is {num(best)}, of {layer_name(int(layer), series.n_layer)} "
            f"head {head} at {step_text(at)}"
        )
        evidence = {"step": newest, "layer": int(layer), "head": int(head), "largest": best}
        evidence["at"] = at
        if best >= threshold:
            best_text += f", which fell back to {num(float(scores[(layer, head)].iloc[-1]))}"
    text = (
        f"Up to {step_text(newest)} no head's prefix-matching score has stayed at or above "
        f"{num(threshold)}: {best_text}"
    )
    if series.config is not None:
        half = repeat_half(series.config.model.block_size)
        text += f" (attending uniformly scores {num(uniform_prefix_score(half))})"
    text += "."
    # No step: nothing happened to mark, and newest-first lists put it after the events.
    title = "No induction heads yet"
    return Finding(RULE, "info", title, text, None, spec.PREFIX_SCORE, evidence)
