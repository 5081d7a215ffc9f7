"""What a probe step measures, each statistic under its name in core.spec's registry.

The device side computes the statistics of a group (a tap's, the stream's, the FFN
units', the output logits', the heads') as {name: tensor} and `stacked` lays them out in
the order of the group's registry tuple (TAP_STATS, STREAM_STATS, ...), so a probe step
still reaches the host in one transfer. The host side reads the values back with the same
tuple. Reordering a tuple reorders both sides; a statistic computed under a name its tuple
lacks, or a name with no statistic, fails at once instead of filing a value under another
statistic's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from blockviz.core.spec import (
    ABOVE_RANGE,
    ATTENTION_HEAD_STATS,
    ATTN_ENTROPY,
    ATTN_LOGIT_MAX,
    ATTN_LOGIT_MAX_ABS,
    BELOW_RANGE,
    DEAD_FRAC,
    FFN_TAP,
    FFN_UNIT_STATS,
    GRAD_NORM,
    HIST_BINS,
    HIST_RANGE,
    MAX_ABS,
    MAX_OVER_MEDIAN,
    MEAN,
    PARAM_NORM,
    PROBE_LOG_Z,
    PROBE_LOGIT_MAX_ABS,
    PROBE_SCALARS,
    RMS,
    STD,
    STREAM_STATS,
    STREAM_TAP,
    TAP_STATS,
    TOKEN_COS,
    UPDATE_RATIO,
    WEIGHTS_COMPONENT,
    ZERO_FRAC,
)
from blockviz.training.sinks import AttentionMap, Histogram, LayerStat


def stacked(values: Mapping[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """The statistics `values` ({name: tensor}, equal shapes) stacked in the order of
    `names`, which must name each of them once: (len(names), *shape)."""
    if len(names) != len(values) or set(names) != set(values):
        raise ValueError(f"statistics {sorted(values)} computed, {list(names)} expected")
    return torch.stack([values[name] for name in names])


def tap_statistics(
    activation: torch.Tensor, bins: int = HIST_BINS, value_range: tuple[float, float] = HIST_RANGE
) -> torch.Tensor:
    """One activation's TAP_STATS (in that order), then its histogram's `bins` counts.

    Computed on the activation's device. The histogram has `bins` equal bins over
    `value_range` and counts only the values inside it (both ends included); below_range
    and above_range are the fractions of values beyond each end, so bins + below + above
    cover every finite value and an outlier is never drawn as if it lay in an end bin.
    """
    x = activation.float().reshape(-1)  # (N,)
    lo, hi = value_range
    moments = {
        MEAN: x.mean(),
        STD: x.std(unbiased=False),
        RMS: x.square().mean().sqrt(),
        MAX_ABS: x.abs().max(),
        ZERO_FRAC: (x == 0).float().mean(),
        BELOW_RANGE: (x < lo).float().mean(),
        ABOVE_RANGE: (x > hi).float().mean(),
    }
    counts = torch.histc(x, bins=bins, min=lo, max=hi)  # (bins,) values outside are ignored
    return torch.cat([stacked(moments, TAP_STATS), counts])  # (len(TAP_STATS) + bins,)


def stream_statistics(activation: torch.Tensor) -> torch.Tensor:
    """STREAM_STATS (token_cos, max_over_median) of a (B, T, C) stream, in that order.

    token_cos is the mean, over the windows and over every pair of different positions
    i != j in a window, of cos(x_i, x_j): with unit vectors u_i, the sum over i != j is
    |sum_i u_i|^2 - sum_i |u_i|^2, so no T x T matrix is needed. NaN for one position.
    """
    x = activation.float()  # (B, T, C)
    T = x.size(1)
    unit = torch.nn.functional.normalize(x, dim=-1)  # (B, T, C); a zero vector stays 0
    pair_sum = unit.sum(dim=1).square().sum(dim=-1) - unit.square().sum(dim=(1, 2))  # (B,)
    token_cos = (pair_sum / (T * (T - 1))).mean() if T > 1 else x.new_tensor(math.nan)
    magnitude = x.abs().reshape(-1)  # (N,)
    max_over_median = magnitude.max() / magnitude.median()  # inf when most values are 0
    return stacked({TOKEN_COS: token_cos, MAX_OVER_MEDIAN: max_over_median}, STREAM_STATS)


def ffn_unit_statistics(hidden: torch.Tensor) -> torch.Tensor:
    """FFN_UNIT_STATS (dead_frac) of FFN hidden activations (B, T, d_ff): the fraction of
    the d_ff units that are exactly zero at every position of every window."""
    alive = (hidden != 0).reshape(-1, hidden.size(-1)).any(dim=0)  # (d_ff,)
    return stacked({DEAD_FRAC: 1.0 - alive.float().mean()}, FFN_UNIT_STATS)  # (1,)


def output_statistics(logits: torch.Tensor) -> torch.Tensor:
    """PROBE_SCALARS (largest |logit|, mean log Z) of output logits (B, T, V), in that
    order; log Z = logsumexp over the vocabulary, the quantity z-loss penalises."""
    z = logits.float()
    measured = {
        PROBE_LOGIT_MAX_ABS: z.abs().max(),
        PROBE_LOG_Z: torch.logsumexp(z, dim=-1).mean(),
    }
    return stacked(measured, PROBE_SCALARS)  # (2,)


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of each head's attention rows: (B, nh, T, T) -> (nh,)."""
    p = weights.float()
    row_entropy = -(p * p.clamp_min(1e-12).log()).sum(dim=-1)  # (B, nh, T)
    return row_entropy.mean(dim=(0, 2))  # (nh,)


def head_statistics(
    entropies: torch.Tensor, logit_max: torch.Tensor, logit_max_abs: torch.Tensor
) -> torch.Tensor:
    """ATTENTION_HEAD_STATS of every layer's heads, each (L, nh), stacked:
    (len(ATTENTION_HEAD_STATS), L, nh). (The INDUCTION_STATS come from training/induction.py.)"""
    measured = {
        ATTN_ENTROPY: entropies,
        ATTN_LOGIT_MAX: logit_max,
        ATTN_LOGIT_MAX_ABS: logit_max_abs,
    }
    return stacked(measured, ATTENTION_HEAD_STATS)


@dataclass(frozen=True)
class TapGroup:
    """Statistics read at one tap of every block, beside TAP_STATS: their part of a probe
    step's tensors, the tap, their names in the order `reduce` stacks them, and `reduce`."""

    part: str
    tap: str
    names: tuple[str, ...]
    reduce: Callable[[torch.Tensor], torch.Tensor]


TAP_GROUPS = (
    TapGroup("stream", STREAM_TAP, STREAM_STATS, stream_statistics),
    TapGroup("units", FFN_TAP, FFN_UNIT_STATS, ffn_unit_statistics),
)


# -- the host side: flat values back into named rows ------------------------------------


def summed_squares(norms: torch.Tensor, members: torch.Tensor, size: int) -> torch.Tensor:
    """(size,) sum of the squared `norms` of the tensors in each group (`members`: (P,))."""
    return torch.zeros(size, dtype=torch.float64).index_add_(0, members, norms.square())


@dataclass
class ParamIndex:
    """Which (layer, component) group and which layer each probed tensor belongs to."""

    names: list[str]
    params: list[nn.Parameter]
    groups: list[tuple[int, str]]  # (layer, component) per group, component != block
    layers: list[int]  # layer per layer group
    group_of: torch.Tensor  # (P,) group index of each tensor (host)
    layer_of: torch.Tensor  # (P,) layer-group index of each tensor (host)
    matrix_layers: list[int]  # layer per "weights" group (a layer's 2-D tensors only)
    matrix_of: torch.Tensor  # (P,) weights-group index of each tensor, -1 if not 2-D (host)


def norm_rows(step: int, index: ParamIndex, host: Mapping[str, Sequence[float]]) -> list[LayerStat]:
    """Per-tensor, per-component and per-layer grad_norm, param_norm and update_ratio.

    Component groups: each (layer, component), the whole layer ("block"), and the
    layer's weight matrices alone ("weights").
    """
    grad = torch.tensor(host[GRAD_NORM], dtype=torch.float64)  # (P,)
    param = torch.tensor(host[PARAM_NORM], dtype=torch.float64)  # (P,)
    delta = host.get("delta_norm")
    delta_t = torch.tensor(delta, dtype=torch.float64) if delta is not None else None
    rows: list[LayerStat] = []

    def ratio(step_norm: float, size: float) -> float:
        return step_norm / size if size > 0 else math.nan

    for i, name in enumerate(index.names):
        layer, _ = index.groups[int(index.group_of[i])]
        rows.append(LayerStat(step, layer, "param", name, GRAD_NORM, float(grad[i])))
        rows.append(LayerStat(step, layer, "param", name, PARAM_NORM, float(param[i])))
        if delta_t is not None:
            value = ratio(float(delta_t[i]), float(param[i]))
            rows.append(LayerStat(step, layer, "param", name, UPDATE_RATIO, value))
    # Group norms combine tensors as one vector: sqrt of the summed squares (host side,
    # on a few dozen numbers). `chosen` picks the tensors a grouping sums over.
    every = torch.ones(len(index.names), dtype=torch.bool)
    matrix = index.matrix_of >= 0
    for members, keys, chosen in (
        (index.group_of, list(index.groups), every),
        (index.layer_of, [(layer, "block") for layer in index.layers], every),
        (
            index.matrix_of,
            [(layer, WEIGHTS_COMPONENT) for layer in index.matrix_layers],
            matrix,
        ),
    ):
        members, size = members[chosen], len(keys)
        grad_g = summed_squares(grad[chosen], members, size)
        param_g = summed_squares(param[chosen], members, size)
        delta_g = summed_squares(delta_t[chosen], members, size) if delta_t is not None else None
        for g, (layer, component) in enumerate(keys):
            grad_norm, param_norm = float(grad_g[g].sqrt()), float(param_g[g].sqrt())
            rows.append(LayerStat(step, layer, "component", component, GRAD_NORM, grad_norm))
            rows.append(LayerStat(step, layer, "component", component, PARAM_NORM, param_norm))
            if delta_g is not None:
                value = ratio(float(delta_g[g].sqrt()), param_norm)
                rows.append(LayerStat(step, layer, "component", component, UPDATE_RATIO, value))
    return rows


def chunks(values: Sequence[float], width: int) -> list[Sequence[float]]:
    """`values` cut into consecutive pieces of `width`."""
    return [values[k : k + width] for k in range(0, len(values), width)]


def tap_records(
    step: int,
    keys: Sequence[tuple[int, str]],
    values: Sequence[float],
    bins: int,
    value_range: tuple[float, float],
) -> tuple[list[LayerStat], list[Histogram]]:
    """The rows of TAP_STATS and the histogram of each (layer, tap) in `keys`, from the
    `tap_statistics` of each, one after the other."""
    lo, hi = value_range
    rows: list[LayerStat] = []
    histograms: list[Histogram] = []
    for (layer, tap), chunk in zip(keys, chunks(values, len(TAP_STATS) + bins), strict=True):
        named = zip(TAP_STATS, chunk[: len(TAP_STATS)], strict=True)
        rows += [LayerStat(step, layer, "tap", tap, stat, value) for stat, value in named]
        counts = [round(c) for c in chunk[len(TAP_STATS) :]]
        histograms.append(Histogram(layer, tap, lo, hi, counts))
    return rows, histograms


def group_rows(
    step: int, group: TapGroup, keys: Sequence[tuple[int, str]], values: Sequence[float]
) -> list[LayerStat]:
    """The rows of a TapGroup's statistics at each (layer, tap) in `keys`."""
    rows: list[LayerStat] = []
    for (layer, tap), chunk in zip(keys, chunks(values, len(group.names)), strict=True):
        named = zip(group.names, chunk, strict=True)
        rows += [LayerStat(step, layer, "tap", tap, stat, value) for stat, value in named]
    return rows


def head_rows(step: int, layers: Sequence[int], values: Sequence[float]) -> list[LayerStat]:
    """The rows of ATTENTION_HEAD_STATS per layer and head, from `head_statistics`' values."""
    rows: list[LayerStat] = []
    names = ATTENTION_HEAD_STATS
    for stat, chunk in zip(names, chunks(values, len(values) // len(names)), strict=True):
        n_head = len(chunk) // len(layers)
        for i, value in enumerate(chunk):
            rows.append(LayerStat(step, layers[i // n_head], "head", str(i % n_head), stat, value))
    return rows


def attention_maps(
    layers: Sequence[int], tokens: list[str], values: Sequence[float]
) -> list[AttentionMap]:
    """The flat (L, nh, n, n) weights cut into one map per layer and head."""
    n = len(tokens)
    maps = chunks(values, n * n)
    n_head = len(maps) // len(layers)
    return [
        AttentionMap(layers[m // n_head], m % n_head, tokens, chunks(flat, n))
        for m, flat in enumerate(maps)
    ]
