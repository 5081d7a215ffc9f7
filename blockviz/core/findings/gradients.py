"""Rules over the backward pass and the optimizer step, as the probes saw them: gradients
across depth, and how much each step moves the blocks' weight matrices (slow and large
updates, and the update sizes the loss-curve rules read). Each is a state rule (it must hold
at the last PERSIST probe steps). Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.core.findings.base import (
    Finding,
    RunSeries,
    blocks,
    finite_rows,
    layer_name,
    layer_names,
    lr_at,
    num,
    per_layer,
    step_text,
    streak,
    streaking,
)
from blockviz.core.findings.suggestions import lower_lr, pre_ln, residual_on
from blockviz.core.findings.thresholds import (
    GRAD_DEPTH_RATIO,
    UPDATE_HIGH,
    UPDATE_LOW,
    UPDATE_NORMAL,
)


def gradient_depth(series: RunSeries) -> Finding | None:
    """First block's gradient norm against the last's, beyond GRAD_DEPTH_RATIO."""
    n = series.n_layer
    if n < 2:
        return None
    grads = finite_rows(blocks(series.table("component", spec.GRAD_NORM, "block"), n))
    if grads.empty or 0 not in grads.columns or n - 1 not in grads.columns:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = grads[0] / grads[n - 1]
    for direction, condition in (
        ("vanish", ratio < 1 / GRAD_DEPTH_RATIO),
        ("grow", ratio > GRAD_DEPTH_RATIO),
    ):
        since = streak(condition)
        if since is None:
            continue
        newest = int(ratio.index[-1])
        first, last = float(grads[0].iloc[-1]), float(grads[n - 1].iloc[-1])
        value = float(ratio.iloc[-1])
        if direction == "vanish":
            title = "Gradients vanish towards the input"
            how = f"{num(last / first)}× smaller than" if first > 0 else "zero, against"
        else:
            title = "Gradients grow towards the input"
            how = f"{num(value)}× larger than" if math.isfinite(value) else "non-zero, against"
        text = (
            f"At {step_text(newest)} the first block's gradient norm ({num(first)}) is {how} the "
            f"last block's ({num(last)}), beyond the bound of {GRAD_DEPTH_RATIO:g}× either "
            f"way at every probe since {step_text(since)}."
        )
        suggestion = None
        if series.config is not None:
            model = series.config.model
            if not model.residual:
                suggestion = residual_on()
            elif model.norm_position != "pre":
                suggestion = pre_ln()
        return Finding(
            "gradient_depth",
            "warning",
            title,
            text,
            since,
            spec.GRAD_NORM,
            {
                "since": since,
                "step": newest,
                "first_block": first,
                "last_block": last,
                "ratio": value,
            },
            suggestion,
        )
    return None


def _update_tables(series: RunSeries) -> tuple[pd.DataFrame, pd.Series]:
    """Block weight matrices' update ratios by step (step 0 left out) and the lr there."""
    table = blocks(
        series.table("component", spec.UPDATE_RATIO, spec.WEIGHTS_COMPONENT), series.n_layer
    )
    if table.empty:
        return table, pd.Series(dtype=float)
    table = table[table.index > 0]
    return table, lr_at(series, table.index)


@dataclass(frozen=True)
class UpdateSizes:
    """How the blocks' weight matrices moved at one probe step, for the lr there."""

    size: str  # large | slow | normal | small
    per_lr: pd.Series  # each block's ‖Δθ‖/‖θ‖ ÷ lr
    lr: float
    step: int


def update_sizes(series: RunSeries) -> UpdateSizes | None:
    """At the newest probe after step 0: "large" when a block's weight matrices moved by
    more than UPDATE_HIGH of their norm, "slow" when one moved by less than UPDATE_LOW × lr,
    "normal" when every one moved by at least UPDATE_NORMAL × lr, else "small". None
    without finite update ratios or a logged lr."""
    table, lr = _update_tables(series)
    if table.empty:
        return None
    newest, rate = table.iloc[-1], float(lr.iloc[-1])
    if not (math.isfinite(rate) and rate > 0 and np.isfinite(newest.to_numpy(float)).all()):
        return None
    per_lr = newest / rate
    if (newest > UPDATE_HIGH).any():
        size = "large"
    elif (per_lr < UPDATE_LOW).any():
        size = "slow"
    elif (per_lr >= UPDATE_NORMAL).all():
        size = "normal"
    else:
        size = "small"
    return UpdateSizes(size, per_lr, rate, int(table.index[-1]))


def slow_updates(series: RunSeries) -> Finding | None:
    """Blocks whose weight matrices move less than UPDATE_LOW × lr per step."""
    table, lr = _update_tables(series)
    if table.empty:
        return None
    per_lr = table.div(lr, axis=0)
    held = streaking(per_lr < UPDATE_LOW)
    if held is None:
        return None
    layers, since = [int(c) for c in held[0]], held[1]
    newest = int(table.index[-1])
    worst = min(layers, key=lambda c: per_lr[c].iloc[-1])
    decay = series.config.train.weight_decay if series.config is not None else None
    text = (
        f"The weight matrices of {layer_names(layers, series.n_layer)} move by less than "
        f"{UPDATE_LOW:g} × lr of their norm per step at every probe since {step_text(since)}: at "
        f"{step_text(newest)} {layer_name(worst, series.n_layer)}'s ‖Δθ‖/‖θ‖ is "
        f"{num(float(table[worst].iloc[-1]))} at lr {num(float(lr.iloc[-1]))} "
        f"({num(float(per_lr[worst].iloc[-1]))} × lr)."
    )
    if decay:
        text += f" Weight decay alone moves them by {num(decay)} × lr: they barely learn."
    suggestion = None
    if series.config is not None and series.config.model.norm_position == "post":
        suggestion = pre_ln()
    elif series.config is not None and not series.config.model.residual:
        suggestion = residual_on()
    return per_layer(
        "slow_updates",
        f"{layer_names(layers, series.n_layer).capitalize()} barely learning",
        text,
        spec.UPDATE_RATIO,
        layers,
        since,
        newest,
        per_lr,
        suggestion,
    )


def large_updates(series: RunSeries) -> Finding | None:
    """Blocks whose weight matrices change by more than UPDATE_HIGH of their norm per step."""
    table, lr = _update_tables(series)
    if table.empty:
        return None
    held = streaking(table > UPDATE_HIGH)
    if held is None:
        return None
    layers, since = [int(c) for c in held[0]], held[1]
    newest = int(table.index[-1])
    worst = max(layers, key=lambda c: table[c].iloc[-1])
    text = (
        f"Each step changes the weight matrices of {layer_names(layers, series.n_layer)} by more "
        f"than {UPDATE_HIGH:g} of their norm, at every probe since {step_text(since)}: "
        f"{layer_name(worst, series.n_layer)}'s ‖Δθ‖/‖θ‖ is {num(float(table[worst].iloc[-1]))} at "
        f"{step_text(newest)} (lr {num(float(lr.iloc[-1]))}). The learning rate is large for "
        "these weights."
    )
    decay = series.config.train.weight_decay if series.config is not None else 0.0
    if decay and float(table[worst].iloc[-1]) < 2 * decay * float(lr.iloc[-1]):
        # AdamW's decoupled decay alone moves them by lr·weight_decay of their norm.
        text += (
            f" Most of it is weight decay: lr × weight_decay = "
            f"{num(decay * float(lr.iloc[-1]))} of the weights each step."
        )
    suggestion = lower_lr(series.config) if series.config is not None else None
    return per_layer(
        "large_updates",
        f"Large updates in {layer_names(layers, series.n_layer)}",
        text,
        spec.UPDATE_RATIO,
        layers,
        since,
        newest,
        table,
        suggestion,
    )
