"""Rules over the forward pass, as the probes saw it inside the model: dead FFN units,
attention entropy and logits, rank collapse, the residual stream's growth, massive
activations, output logits. Each is a state rule (it must hold at the last PERSIST probe
steps). Torch-free.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.core.findings.base import (
    Finding,
    RunSeries,
    blocks,
    layer_name,
    layer_names,
    num,
    per_layer,
    step_text,
    streak,
    streaking,
)
from blockviz.core.findings.suggestions import (
    gelu,
    lower_lr,
    normalise_qk,
    residual_on,
    tame_logits,
)
from blockviz.core.findings.thresholds import (
    ATTN_LOGIT_MAX,
    DEAD_FRAC,
    ENTROPY_FLOOR,
    LOG_Z_MAX,
    LOGIT_GROWTH,
    MASSIVE_ABS,
    MASSIVE_RATIO,
    OUTPUT_LOGIT_MAX,
    RANK_COS,
    RESID_GROWTH,
    RESID_RMS,
)


def dead_units(series: RunSeries) -> Finding | None:
    """More than DEAD_FRAC of a layer's FFN units zero on every probe token."""
    table = blocks(series.table("tap", spec.DEAD_FRAC, spec.FFN_TAP), series.n_layer)
    if table.empty:
        return None
    held = streaking(table > DEAD_FRAC)
    if held is None:
        return None
    layers, since = [int(c) for c in held[0]], held[1]
    newest = int(table.index[-1])
    shares = ", ".join(f"{layer_name(c, series.n_layer)} {table[c].iloc[-1]:.1%}" for c in layers)
    text = (
        f"At {step_text(newest)} more than {DEAD_FRAC:.0%} of the FFN's hidden units are zero for "
        f"every token of the probe batch ({shares}), at every probe since {step_text(since)}: "
        "those units pass no signal and get no gradient."
    )
    suggestion = None
    if series.config is not None:
        relu = series.config.model.activation == "relu"
        suggestion = gelu() if relu else lower_lr(series.config)
    return per_layer(
        "dead_units",
        f"Dead FFN units in {layer_names(layers, series.n_layer)}",
        text,
        spec.DEAD_FRAC,
        layers,
        since,
        newest,
        table,
        suggestion,
    )


def attention_collapse(series: RunSeries) -> Finding | None:
    """A layer whose every head attends almost to one position (entropy below the floor)."""
    table = series.table("head", spec.ATTN_ENTROPY)
    if table.empty:
        return None
    by_layer = table.T.groupby(level=0).max().T  # step x layer: the layer's largest entropy
    held = streaking(by_layer < ENTROPY_FLOOR)
    if held is None:
        return None
    layers, since = [int(c) for c in held[0]], held[1]
    newest = int(by_layer.index[-1])
    text = (
        f"At {step_text(newest)} every head of {layer_names(layers, series.n_layer)} has a mean "
        f"attention entropy below {ENTROPY_FLOOR:g} nats (largest: "
        + ", ".join(f"{num(float(by_layer[c].iloc[-1]))}" for c in layers)
        + f"), at every probe since {step_text(since)}: each query attends to about one position."
    )
    title = f"Attention entropy collapsed in {layer_names(layers, series.n_layer)}"
    return per_layer(
        "attention_collapse",
        title,
        text,
        spec.ATTN_ENTROPY,
        layers,
        since,
        newest,
        by_layer,
        normalise_qk(series),
    )


def logit_table(series: RunSeries) -> tuple[pd.DataFrame, str]:
    """Each head's largest |pre-softmax logit| by step, and its stat's name; a run recorded
    before that statistic existed gives its largest signed logit (a lower bound of it)."""
    table = series.table("head", spec.ATTN_LOGIT_MAX_ABS)
    if not table.empty:
        return table, spec.ATTN_LOGIT_MAX_ABS
    return series.table("head", spec.ATTN_LOGIT_MAX), spec.ATTN_LOGIT_MAX


def attention_logits(series: RunSeries) -> Finding | None:
    """A head's largest |pre-softmax logit| above ATTN_LOGIT_MAX and LOGIT_GROWTH × its
    first probe's."""
    table, stat = logit_table(series)
    if table.empty:
        return None
    grown = (table > ATTN_LOGIT_MAX) & (table >= LOGIT_GROWTH * table.iloc[0].abs())
    held = streaking(grown)
    if held is None:
        return None
    heads, since = held
    newest = int(table.index[-1])
    layer, head = max(heads, key=lambda c: table[c].iloc[-1])
    value, start = float(table[(layer, head)].iloc[-1]), float(table[(layer, head)].iloc[0])
    others = f" ({len(heads)} heads over {ATTN_LOGIT_MAX:g})" if len(heads) > 1 else ""
    where = layer_name(int(layer), series.n_layer)
    what = (
        "largest |attention logit|"
        if stat == spec.ATTN_LOGIT_MAX_ABS
        else "largest attention logit"
    )
    text = (
        f"At {step_text(newest)} the {what} of {where} "
        f"head {head} is {num(value)}, against {num(start)} at "
        f"{step_text(int(table.index[0]))}{others}; above {ATTN_LOGIT_MAX:g} at every probe since "
        f"{step_text(since)}. Logits this large make the softmax close to one-hot."
    )
    if stat == spec.ATTN_LOGIT_MAX:
        text += " (This run predates the |logit| statistic: its signed largest logit was read.)"
    return Finding(
        "attention_logit_growth",
        "warning",
        f"Attention logits grew to {num(value)}",
        text,
        since,
        stat,
        {
            "layer": int(layer),
            "head": int(head),
            "value": value,
            "first": start,
            "since": since,
            "heads": len(heads),
        },
        normalise_qk(series),
    )


def rank_collapse(series: RunSeries) -> Finding | None:
    """Positions at a block's output nearly parallel (mean cosine similarity ≥ RANK_COS)."""
    table = blocks(series.table("tap", spec.TOKEN_COS, spec.STREAM_TAP), series.n_layer)
    if table.empty:
        return None
    held = streaking(table >= RANK_COS)
    if held is None:
        return None
    layers, since = [int(c) for c in held[0]], held[1]
    newest = int(table.index[-1])
    values = ", ".join(f"{layer_name(c, series.n_layer)} {table[c].iloc[-1]:.3f}" for c in layers)
    text = (
        f"At {step_text(newest)} the vectors of different positions leaving "
        f"{layer_names(layers, series.n_layer)} point the same way: mean cosine similarity "
        f"{values} (at least {RANK_COS:g}), at every probe since {step_text(since)}. The stream "
        "there carries almost nothing that tells one position from another."
    )
    suggestion = None
    if series.config is not None and not series.config.model.residual:
        suggestion = residual_on("Dong et al. 2021; Noci et al. 2022")
    return per_layer(
        "rank_collapse",
        f"Rank collapse in {layer_names(layers, series.n_layer)}",
        text,
        spec.TOKEN_COS,
        layers,
        since,
        newest,
        table,
        suggestion,
    )


def residual_growth(series: RunSeries) -> Finding | None:
    """The RMS of the stream leaving a block at least RESID_GROWTH × its first probe's and
    at least RESID_RMS."""
    rms = blocks(series.table("tap", spec.RMS, spec.STREAM_TAP), series.n_layer)
    if rms.empty:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        growth = rms / rms.iloc[0]
    held = streaking((growth >= RESID_GROWTH) & (rms >= RESID_RMS))
    if held is None:
        return None
    layers, since = [int(c) for c in held[0]], held[1]
    first, newest = int(rms.index[0]), int(rms.index[-1])
    worst = max(layers, key=lambda c: growth[c].iloc[-1])
    start, now = float(rms[worst].iloc[0]), float(rms[worst].iloc[-1])
    where = layer_name(worst, series.n_layer)
    others = f" (blocks past both bounds: {layer_names(layers, series.n_layer)})"
    text = (
        f"At {step_text(newest)} the RMS of the residual stream leaving {where} is {num(now)}, "
        f"against {num(start)} at {step_text(first)}: {num(now / start)}× its start"
        + (others if len(layers) > 1 else "")
        + f"; at least {RESID_GROWTH:g}× its first probe's and {RESID_RMS:g} at every probe "
        f"since {step_text(since)}."
    )
    evidence = {
        "layers": layers,
        "since": since,
        "step": newest,
        "layer": worst,
        "start_step": first,
        "start": start,
        "value": now,
        "growth": {c: float(growth[c].iloc[-1]) for c in layers},
    }
    return Finding(
        "residual_growth",
        "warning",
        f"The residual stream grew {num(now / start)}× in {where}",
        text,
        since,
        spec.RMS,
        evidence,
        lower_lr(series.config) if series.config is not None else None,
    )


def massive_activations(series: RunSeries) -> Finding | None:
    """An activation at a block's output far larger than the median (Sun et al. 2024)."""
    ratio = blocks(series.table("tap", spec.MAX_OVER_MEDIAN, spec.STREAM_TAP), series.n_layer)
    largest = blocks(series.table("tap", spec.MAX_ABS, spec.STREAM_TAP), series.n_layer)
    if ratio.empty or largest.empty:
        return None
    steps = ratio.index.intersection(largest.index)
    columns = ratio.columns.intersection(largest.columns)
    ratio, largest = ratio.loc[steps, columns], largest.loc[steps, columns]
    held = streaking((ratio >= MASSIVE_RATIO) & (largest >= MASSIVE_ABS))
    if held is None:
        return None
    layers, since = [int(c) for c in held[0]], held[1]
    newest = int(steps[-1])
    worst = max(layers, key=lambda c: ratio[c].iloc[-1])
    text = (
        f"At {step_text(newest)} the stream leaving {layer_name(worst, series.n_layer)} holds an "
        f"activation of {num(float(largest[worst].iloc[-1]))}, "
        f"{num(float(ratio[worst].iloc[-1]))}× the median |activation| there "
        f"(layers: {layer_names(layers, series.n_layer)}; since {step_text(since)}). Sun et al. "
        "2024 find such activations in large trained models, where they act like fixed biases."
    )
    title = f"Massive activations in {layer_names(layers, series.n_layer)}"
    return per_layer(
        "massive_activations",
        title,
        text,
        spec.MAX_OVER_MEDIAN,
        layers,
        since,
        newest,
        ratio,
        severity="info",
    )


def output_logits(series: RunSeries) -> Finding | None:
    """The output logits' largest |logit| or |mean log Z| beyond their bounds."""
    largest = series.scalar(spec.PROBE_LOGIT_MAX_ABS).set_index("step")["value"]
    log_z = series.scalar(spec.PROBE_LOG_Z).set_index("step")["value"]
    if largest.empty or log_z.empty:
        return None
    steps = largest.index.intersection(log_z.index)
    largest, log_z = largest.loc[steps], log_z.loc[steps]
    grown = (largest > OUTPUT_LOGIT_MAX) | (log_z.abs() > LOG_Z_MAX)
    since = streak(grown)
    if since is None:
        return None
    newest = int(steps[-1])
    text = (
        f"At {step_text(newest)} the output logits on the probe batch reach |logit| "
        f"{num(float(largest.iloc[-1]))} with a mean log Z of {num(float(log_z.iloc[-1]))} "
        f"(bounds {OUTPUT_LOGIT_MAX:g} and ±{LOG_Z_MAX:g}), at every probe since "
        f"{step_text(since)}."
    )
    suggestion = tame_logits(series)
    return Finding(
        "output_logit_growth",
        "warning",
        f"Output logits grew to {num(float(largest.iloc[-1]))}",
        text,
        since,
        spec.PROBE_LOG_Z,
        {
            "since": since,
            "step": newest,
            "logit_max_abs": float(largest.iloc[-1]),
            "log_z": float(log_z.iloc[-1]),
        },
        suggestion,
    )
