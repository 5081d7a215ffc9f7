"""The induction-head rule: when a head's prefix matching formed, and whether the training
loss bent there. Informational: a head forming is neither a fault nor a requirement.

An induction head (Olsson et al. 2022) needs a head of an earlier layer to move the
previous token's identity forward, so the rule reads models of two blocks or more. A head
forms at the first of PERSIST probes in a row at which its prefix_score, less PREFIX_Z
standard errors (prefix_score_se), is at or above the formation threshold
(`formation_threshold`: PREFIX_THRESHOLD, or PREFIX_OVER_UNIFORM times what uniform
attention scores where that is more), and stays formed, at that step, until the score plus
PREFIX_Z standard errors has been under PREFIX_RELEASE times the threshold at PREFIX_REVOKE
probes in a row (`formed_since`): the step a finding names does not move on noise as the
run goes on. A head whose attention entropy is under ENTROPY_FLOOR at a probe has collapsed
onto one position: below, whatever it scores. Runs recorded without prefix_score_se count
their scores as exact. The bend test compares least-squares slopes of the logged training
loss over the BEND_WINDOW steps before and after that step. Torch-free.
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
)
from blockviz.core.findings.thresholds import (
    BEND_FACTOR,
    BEND_MIN_POINTS,
    BEND_WINDOW,
    BEND_Z,
    ENTROPY_FLOOR,
    PERSIST,
    PREFIX_OVER_UNIFORM,
    PREFIX_RELEASE,
    PREFIX_REVOKE,
    PREFIX_THRESHOLD,
    PREFIX_Z,
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


def formed_since(
    scores: np.ndarray, errors: np.ndarray, collapsed: np.ndarray, threshold: float
) -> int | None:
    """The index of the probe at which a head's current formation began, or None: it forms
    at the first of PERSIST probes in a row whose lower bound (score − PREFIX_Z·se) is at
    or above `threshold`, and un-forms only after PREFIX_REVOKE probes in a row whose upper
    bound (score + PREFIX_Z·se) is under PREFIX_RELEASE·threshold; a collapsed probe (or a
    NaN score) is below. Reads only the past: a longer run never moves a formation it keeps."""
    lower = np.where(collapsed, np.nan, scores - PREFIX_Z * errors)
    upper = np.where(collapsed, -np.inf, scores + PREFIX_Z * errors)
    since: int | None = None
    start, ups, downs = 0, 0, 0
    for index in range(len(scores)):
        if since is None:
            above = bool(lower[index] >= threshold)  # False for NaN
            start, ups = (start if ups else index, ups + 1) if above else (index, 0)
            if ups >= PERSIST:
                since, downs = start, 0
        else:
            below = not bool(upper[index] >= PREFIX_RELEASE * threshold)
            downs = downs + 1 if below else 0
            if downs >= PREFIX_REVOKE:
                since, ups = None, 0
    return since


def _head_tables(
    series: RunSeries, scores: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """Each head's standard errors (0 where none was recorded) and whether its attention had
    collapsed (entropy under ENTROPY_FLOOR), on the scores' steps and heads; and whether any
    standard error was recorded."""
    errors = series.table("head", spec.PREFIX_SCORE_SE)
    recorded = not errors.empty
    errors = errors.reindex(index=scores.index, columns=scores.columns) if recorded else None
    errors = errors.fillna(0.0) if errors is not None else scores * 0.0
    entropy = series.table("head", spec.ATTN_ENTROPY)
    if entropy.empty:
        collapsed = pd.DataFrame(False, index=scores.index, columns=scores.columns)
    else:
        entropy = entropy.reindex(index=scores.index, columns=scores.columns)
        collapsed = entropy.astype(float) < ENTROPY_FLOOR  # NaN: not measured, not collapsed
    return errors.astype(float), collapsed, recorded


def _with_error(score: float, error: float, recorded: bool) -> str:
    """A score with its standard error: '0.123 ± 0.008'; the score alone when none."""
    return f"{num(score)} ± {num(error)}" if recorded else num(score)


def induction_heads(series: RunSeries) -> Finding | None:
    """When the earliest head that is formed now formed (`formed_since`), its score with
    its standard error then and now, and whether the loss bent at that step; or, when none
    is formed, the largest score seen."""
    table = blocks(series.table("head", spec.PREFIX_SCORE), series.n_layer)
    if table.empty or series.n_layer < 2:
        return None
    scores = table.astype(float)
    errors, collapsed, recorded = _head_tables(series, scores)
    newest = int(scores.index[-1])
    block_size = series.config.model.block_size if series.config is not None else None
    threshold = formation_threshold(block_size)
    formed = {}
    for column in scores.columns:
        at = formed_since(
            scores[column].to_numpy(),
            errors[column].to_numpy(),
            collapsed[column].to_numpy(dtype=bool),
            threshold,
        )
        if at is not None:
            formed[column] = int(scores.index[at])
    if not formed:
        return _not_formed(series, scores, collapsed, newest, threshold)
    (layer, head), since = min(formed.items(), key=lambda item: (item[1], item[0]))
    where = f"{layer_name(int(layer), series.n_layer)} head {head}"
    at_since = float(scores.loc[since, (layer, head)])
    se_since = float(errors.loc[since, (layer, head)])
    latest = float(scores[(layer, head)].iloc[-1])
    se_latest = float(errors[(layer, head)].iloc[-1])
    copies = series.table("head", spec.COPY_SCORE)
    copy = float(copies.iloc[-1][(layer, head)]) if (layer, head) in copies else None
    others = sorted(c for c in formed if c != (layer, head))
    bound = f"less {PREFIX_Z:g} standard errors " if recorded else ""
    text = (
        f"The prefix-matching score of {where} reached "
        f"{_with_error(at_since, se_since, recorded)} at {step_text(since)} (the score "
        f"{bound}at or above {num(threshold)} there and at the next probe) and has not fallen "
        f"clearly below since, which takes the score plus {PREFIX_Z:g} standard errors under "
        f"{num(PREFIX_RELEASE * threshold)} at {PREFIX_REVOKE} probes in a row: it is "
        f"{_with_error(latest, se_latest, recorded)} at {step_text(newest)}"
    )
    if copy is not None:
        text += f"; its copying score there is {num(copy)}"
    text += "."
    if not recorded:
        text += " This run recorded no standard error (its scores came from 4 rows)."
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
        "score_se": se_since if recorded else None,
        "latest": latest,
        "latest_se": se_latest if recorded else None,
        "copying": copy,
        "heads": len(formed),
        "bend": bend,
    }
    title = f"Induction heads formed at {step_text(since)}"
    return Finding(RULE, "info", title, text, since, spec.PREFIX_SCORE, evidence)


def _not_formed(
    series: RunSeries,
    scores: pd.DataFrame,
    collapsed: pd.DataFrame,
    newest: int,
    threshold: float,
) -> Finding:
    """No head is formed: the largest score seen where attention had not collapsed, where
    and when, whether it fell back, and the collapsed heads left out."""
    values = scores.to_numpy(dtype=float)
    shut = collapsed.to_numpy(dtype=bool)
    counted = np.where(shut, np.nan, values)
    if not np.isfinite(counted).any():
        best_text, evidence = "no finite score was recorded", {"step": newest}
    else:
        row, col = np.unravel_index(np.nanargmax(counted), counted.shape)
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
        f"Up to {step_text(newest)} no head has formed (a prefix-matching score less "
        f"{PREFIX_Z:g} standard errors at or above {num(threshold)} at {PERSIST} probes in a "
        f"row, and not fallen back since): {best_text}"
    )
    if series.config is not None:
        half = repeat_half(series.config.model.block_size)
        text += f" (attending uniformly scores {num(uniform_prefix_score(half))})"
    text += "."
    over = (values >= threshold) & shut
    if over.any():
        heads = sorted({scores.columns[c] for c in np.flatnonzero(over.any(axis=0))})
        names = ", ".join(f"{layer_name(int(c[0]), series.n_layer)} head {c[1]}" for c in heads)
        text += (
            f" Not counted: {names}, whose attention had collapsed onto one position "
            f"(entropy under {ENTROPY_FLOOR:g} nats) at the probes it scored that high; a "
            "head that always attends to one place is not an induction head."
        )
        evidence["collapsed"] = [[int(c[0]), int(c[1])] for c in heads]
    # No step: nothing happened to mark, and newest-first lists put it after the events.
    title = "No induction heads yet"
    return Finding(RULE, "info", title, text, None, spec.PREFIX_SCORE, evidence)
