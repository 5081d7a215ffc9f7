"""Rules over the loss after it has made progress: a plateau just below the unigram
entropy (the run stopped improving long before the model's size stops it), and
overfitting (the val loss rising while the train loss still falls). Torch-free.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.core.findings.base import Finding, RunSeries, num, step_text
from blockviz.core.findings.suggestions import dropout, plateau_remedy
from blockviz.core.findings.thresholds import (
    OVERFIT_EVALS,
    OVERFIT_RISE,
    OVERFIT_TRAIN,
    PLATEAU_BELOW,
    PLATEAU_FALL,
    PLATEAU_POINTS,
    PLATEAU_STEPS,
    STALL_MARGIN,
    STALL_NEAR,
    STALL_WINDOW,
)
from blockviz.core.findings.training import stalled


def _slope(steps: np.ndarray, values: np.ndarray) -> float:
    """The least-squares slope of values over steps, in nats per 100 steps."""
    centred = steps - steps.mean()
    return float((centred * (values - values.mean())).sum() / (centred**2).sum() * 100)


def plateau(series: RunSeries) -> Finding | None:
    """After the train loss's running median went below the unigram entropy (less the
    margin), it has stayed within PLATEAU_BELOW of it and fallen by less than PLATEAU_FALL
    nats per 100 steps over the last PLATEAU_STEPS steps (a least-squares slope of the
    logged losses). A loss still falling is slow, not stuck; one far below the unigram
    entropy has learned what a model of its size learns first. A stall at the unigram
    entropy is the stall rule's."""
    if series.unigram is None or not math.isfinite(series.unigram):
        return None
    loss = series.scalar(spec.TRAIN_LOSS)
    values = loss["value"].to_numpy(dtype=float)
    steps = loss["step"].to_numpy(dtype=float)
    if len(loss) < STALL_WINDOW or not np.isfinite(values).all():
        return None
    newest = int(steps[-1])
    start = newest - PLATEAU_STEPS
    window = steps > start
    if steps[0] > start or window.sum() < PLATEAU_POINTS:
        return None
    median = pd.Series(values).rolling(STALL_WINDOW, min_periods=1).median().to_numpy()
    low = series.unigram - STALL_MARGIN
    earlier = median[~window]
    if not (earlier < low).any():
        return None  # no progress below the unigram entropy before the window
    level = float(median[-1])
    if not series.unigram - PLATEAU_BELOW <= level <= series.unigram + STALL_NEAR:
        return None
    slope = _slope(steps[window], values[window])
    if slope <= -PLATEAU_FALL or (level >= low and stalled(series) is not None):
        return None
    best = int(np.argmin(median))
    # Since when: the first step its running median came within the margin of its lowest.
    since = int(steps[int(np.flatnonzero(median <= median[best] + STALL_MARGIN)[0])])
    change = (
        f"rising by {num(slope)}"
        if slope > 0
        else f"falling by {num(-slope)} (less than {PLATEAU_FALL:g})"
    )
    text = (
        f"Since {step_text(since)} the train loss (running median of {STALL_WINDOW} logged "
        f"values) has stayed within {STALL_MARGIN:g} nat of its lowest, {num(float(median[best]))} "
        f"at {step_text(int(steps[best]))}: {num(level)} at {step_text(newest)}, against "
        f"{num(series.unigram)} for predicting each character by its frequency alone; over the "
        f"last {PLATEAU_STEPS} steps the logged losses are {change} nats per 100 steps. It "
        "stopped learning soon after it learned the characters' frequencies."
    )
    val = series.scalar(spec.VAL_LOSS)
    val = val[np.isfinite(val["value"].to_numpy(dtype=float))]
    if len(val):
        lowest = int(val["value"].to_numpy().argmin())
        text += (
            f" Val loss: lowest {num(float(val['value'].iloc[lowest]))} at "
            f"{step_text(int(val['step'].iloc[lowest]))}, {num(float(val['value'].iloc[-1]))} "
            f"at {step_text(int(val['step'].iloc[-1]))}."
        )
    return Finding(
        "plateau",
        "warning",
        f"Stopped improving just below the unigram entropy since step {since:,}",
        text,
        since,
        spec.TRAIN_LOSS,
        {
            "since": since,
            "step": newest,
            "median_loss": level,
            "best_loss": float(median[best]),
            "best_step": int(steps[best]),
            "slope_per_100": slope,
            "unigram": series.unigram,
        },
        plateau_remedy(series),
    )


def overfitting(series: RunSeries) -> Finding | None:
    """Val loss rising above its lowest evaluation while the val − train gap widens."""
    val = series.scalar(spec.VAL_LOSS)
    val = val[np.isfinite(val["value"].to_numpy(dtype=float))]
    train = series.scalar(spec.TRAIN_LOSS)
    if len(val) < OVERFIT_EVALS or train.empty:
        return None
    train_values = train["value"].to_numpy(dtype=float)
    means = pd.Series(train_values).rolling(OVERFIT_TRAIN, min_periods=1).mean().to_numpy()
    positions = np.searchsorted(train["step"].to_numpy(), val["step"].to_numpy(), side="right") - 1
    valid = positions >= 0
    val, positions = val[valid], positions[valid]
    if len(val) < OVERFIT_EVALS:
        return None
    trained = means[positions]
    gap = val["value"].to_numpy(dtype=float) - trained
    best = int(np.argmin(val["value"].to_numpy(dtype=float)))
    last = len(val) - 1
    best_loss, last_loss = float(val["value"].iloc[best]), float(val["value"].iloc[last])
    # Val rose, the gap widened by as much, and the train loss did not rise with it (a
    # train loss that rises too is a run getting worse, not one memorising its text), and
    # it is below the unigram entropy: a model that knows only character frequencies has
    # nothing of its training text to memorise.
    memorising = series.unigram is None or trained[last] < series.unigram - STALL_MARGIN
    if (
        best == last
        or last_loss < best_loss + OVERFIT_RISE
        or not gap[last] >= gap[best] + OVERFIT_RISE
        or trained[last] > trained[best]
        or not memorising
    ):
        return None
    since = int(val["step"].iloc[best])
    newest = int(val["step"].iloc[last])
    text = (
        f"The val loss has risen from its lowest, {num(best_loss)} at {step_text(since)}, to "
        f"{num(last_loss)} at {step_text(newest)}, while the val − train gap widened from "
        f"{num(gap[best])} to {num(gap[last])}: the model is learning its training text "
        f"rather than the language. best.ckpt holds the weights of {step_text(since)} "
        "(of a run trained alone: a batch of replicas keeps only its last.ckpt)."
    )
    suggestion = None
    if series.config is not None and series.config.model.dropout == 0:
        suggestion = dropout()
    return Finding(
        "overfitting",
        "warning",
        f"Overfitting since step {since:,}",
        text,
        since,
        spec.VAL_LOSS,
        {
            "since": since,
            "step": newest,
            "best_val": best_loss,
            "val": last_loss,
            "gap_then": float(gap[best]),
            "gap_now": float(gap[last]),
        },
        suggestion,
    )
