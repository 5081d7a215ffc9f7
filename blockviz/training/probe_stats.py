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
from torch.func import functional_call

from blockviz.core.params import param_component
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
    """The statistics `values` ({name: (K, ...) tensor}, equal shapes) stacked in the order
    of `names`, which must name each of them once: (K, len(names), ...)."""
    if len(names) != len(values) or set(names) != set(values):
        raise ValueError(f"statistics {sorted(values)} computed, {list(names)} expected")
    return torch.stack([values[name] for name in names], dim=1)


def histograms(x: torch.Tensor, bins: int, value_range: tuple[float, float]) -> torch.Tensor:
    """`torch.histc` of each row of x (K, N), all rows in one scatter: (K, bins).

    A value's bin is histc's, floor((x - lo) · bins / (hi - lo)) in x's dtype, with hi in
    the last bin; values outside [lo, hi] (and NaN) are in none."""
    lo, hi = value_range
    inside = (x >= lo) & (x <= hi)  # (K, N)
    position = torch.where(inside, (x - lo) * bins / (hi - lo), 0.0).long().clamp_(max=bins - 1)
    rows = torch.arange(x.size(0), device=x.device).unsqueeze(1) * bins  # (K, 1)
    counts = torch.zeros(x.size(0) * bins, device=x.device)
    counts.index_add_(0, (position + rows).reshape(-1), inside.float().reshape(-1))
    return counts.view(-1, bins)  # (K, bins)


def tap_statistics(
    activation: torch.Tensor, bins: int = HIST_BINS, value_range: tuple[float, float] = HIST_RANGE
) -> torch.Tensor:
    """Each run's TAP_STATS (in that order), then its histogram's `bins` counts, of one
    tap's activations (K, ...): (K, len(TAP_STATS) + bins).

    Computed on the activation's device. The histogram has `bins` equal bins over
    `value_range` and counts only the values inside it (both ends included); below_range
    and above_range are the fractions of values beyond each end, so bins + below + above
    cover every finite value and an outlier is never drawn as if it lay in an end bin.
    """
    x = activation.float().reshape(activation.size(0), -1)  # (K, N)
    lo, hi = value_range
    mean = x.mean(dim=1)  # (K,)
    root_n = math.sqrt(x.size(1))
    moments = {
        MEAN: mean,
        # two passes through a norm: a tenth of the time of std's one-pass update on a CPU
        STD: torch.linalg.vector_norm(x - mean.unsqueeze(1), dim=1) / root_n,
        RMS: torch.linalg.vector_norm(x, dim=1) / root_n,
        MAX_ABS: x.abs().amax(dim=1),
        ZERO_FRAC: (x == 0).float().mean(dim=1),
        BELOW_RANGE: (x < lo).float().mean(dim=1),
        ABOVE_RANGE: (x > hi).float().mean(dim=1),
    }
    return torch.cat([stacked(moments, TAP_STATS), histograms(x, bins, value_range)], dim=1)


def stream_statistics(activation: torch.Tensor) -> torch.Tensor:
    """Each run's STREAM_STATS (token_cos, max_over_median) of a (K, B, T, C) stream, in
    that order: (K, 2).

    token_cos is the mean, over the windows and over every pair of different positions
    i != j in a window, of cos(x_i, x_j): with unit vectors u_i, the sum over i != j is
    |sum_i u_i|^2 - sum_i |u_i|^2, so no T x T matrix is needed. NaN for one position.
    """
    x = activation.float()  # (K, B, T, C)
    K, T = x.size(0), x.size(2)
    unit = torch.nn.functional.normalize(x, dim=-1)  # (K, B, T, C); a zero vector stays 0
    pair_sum = unit.sum(dim=2).square().sum(dim=-1) - unit.square().sum(dim=(2, 3))  # (K, B)
    token_cos = (pair_sum / (T * (T - 1))).mean(dim=1) if T > 1 else x.new_full((K,), math.nan)
    magnitude = x.abs().reshape(K, -1)  # (K, N)
    # inf where most values are 0
    max_over_median = magnitude.amax(dim=1) / magnitude.median(dim=1).values
    return stacked({TOKEN_COS: token_cos, MAX_OVER_MEDIAN: max_over_median}, STREAM_STATS)


def ffn_unit_statistics(hidden: torch.Tensor) -> torch.Tensor:
    """Each run's FFN_UNIT_STATS (dead_frac) of FFN hidden activations (K, B, T, d_ff): the
    fraction of the d_ff units that are exactly zero at every position of every window."""
    K, d_ff = hidden.size(0), hidden.size(-1)
    alive = (hidden != 0).reshape(K, -1, d_ff).any(dim=1)  # (K, d_ff)
    return stacked({DEAD_FRAC: 1.0 - alive.float().mean(dim=1)}, FFN_UNIT_STATS)  # (K, 1)


def output_statistics(logits: torch.Tensor) -> torch.Tensor:
    """Each run's PROBE_SCALARS (largest |logit|, mean log Z) of output logits (K, B, T, V),
    in that order: (K, 2); log Z = logsumexp over the vocabulary, what z-loss penalises."""
    z = logits.float()
    K = z.size(0)
    measured = {
        PROBE_LOGIT_MAX_ABS: z.abs().reshape(K, -1).amax(dim=1),
        PROBE_LOG_Z: torch.logsumexp(z, dim=-1).reshape(K, -1).mean(dim=1),
    }
    return stacked(measured, PROBE_SCALARS)  # (K, 2)


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of each head's attention rows: (..., B, nh, T, T) -> (..., nh)."""
    p = weights.float()
    row_entropy = -(p * p.clamp_min(1e-12).log()).sum(dim=-1)  # (..., B, nh, T)
    return row_entropy.mean(dim=(-3, -1))  # (..., nh)


def head_statistics(
    entropies: torch.Tensor, logit_max: torch.Tensor, logit_max_abs: torch.Tensor
) -> torch.Tensor:
    """ATTENTION_HEAD_STATS of every run's layers' heads, each (K, L, nh), stacked:
    (K, len(ATTENTION_HEAD_STATS), L, nh). (The INDUCTION_STATS come from training/induction.py.)"""
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


def parameter_names(model: nn.Module) -> tuple[list[str], list[list[str]]]:
    """The model's parameters' names (a tied matrix once, as `named_parameters` lists it)
    and every name each one goes by (a tied embedding is also the head)."""
    aliases: dict[int, list[str]] = {}  # in the order named_parameters lists them
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    return [names[0] for names in aliases.values()], list(aliases.values())


@dataclass(frozen=True)
class RunStack:
    """Every run a module trains, as one stack: each parameter one (K, ...) tensor, K the
    runs (a solo run's parameters unsqueezed: K = 1), its gradient, and the model that runs
    the stack (whose taps and attention a probe hooks). A probe step measures all K at
    once from these, whatever K."""

    model: nn.Module
    names: list[str]  # each parameter's name, a tied matrix once
    params: list[torch.Tensor]  # (K, ...) each, in `names` order
    grads: list[torch.Tensor | None]  # (K, ...) each; None before a backward pass
    aliases: list[list[str]]  # every name each parameter goes by

    @classmethod
    def of(cls, model: nn.Module) -> RunStack:
        """One model as a stack of one (views of its parameters and gradients)."""
        names, aliases = parameter_names(model)
        params = list(model.parameters())  # in `names` order (a tied matrix once)
        grads = [None if p.grad is None else p.grad.unsqueeze(0) for p in params]
        return cls(model, names, [p.detach().unsqueeze(0) for p in params], grads, aliases)

    def by_alias(self) -> dict[str, torch.Tensor]:
        """The stacked parameters by every name the model knows them by."""
        return {
            alias: param
            for names, param in zip(self.aliases, self.params, strict=True)
            for alias in names
        }

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        """Every run's logits (K, B, T, V) of token ids (B, T): one stacked forward."""
        k = self.params[0].size(0)
        logits, _ = functional_call(self.model, self.by_alias(), (idx.expand(k, *idx.shape),))
        return logits


def row_norms(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Each run's norm of each tensor (K, ...): (K, P), in float32."""
    norms = [torch.linalg.vector_norm(t.flatten(1), dim=1) for t in tensors]  # P x (K,)
    return torch.stack(norms, dim=1).float()


# -- the host side: flat values back into named rows ------------------------------------


@dataclass(frozen=True)
class ParamIndex:
    """The probed tensors, each tensor's layer, and the groups their norms combine into:
    each (layer, component), each whole layer ("block") and each layer's weight matrices
    alone ("weights"); per grouping, each tensor's group (-1: none) and the groups."""

    names: list[str]
    layers: list[int]
    groupings: list[tuple[list[int], list[tuple[int, str]]]]

    @classmethod
    def of(cls, names: Sequence[str], params: Sequence[torch.Tensor], n_layer: int) -> ParamIndex:
        """The index of the tensors `names` ((K, ...) each, `params`) of an n_layer model."""
        keys = [param_component(name, n_layer) for name in names]
        blocks = [(layer, "block") for layer, _ in keys]
        matrices = [  # (K, out, in): a layer's 2-D tensors
            (layer, WEIGHTS_COMPONENT) if p.dim() == 3 else None
            for (layer, _), p in zip(keys, params, strict=True)
        ]
        groupings = []
        for grouped in (keys, blocks, matrices):
            groups = sorted({group for group in grouped if group is not None})
            groupings.append(([-1 if g is None else groups.index(g) for g in grouped], groups))
        return cls(list(names), [layer for layer, _ in keys], groupings)


def summed_squares(norms: Sequence[float], members: Sequence[int], size: int) -> list[float]:
    """The sum of the squared `norms` of the tensors in each of `size` groups (`members`:
    each tensor's group, -1 for none), in float64, tensor by tensor."""
    sums = [0.0] * size
    for norm, group in zip(norms, members, strict=True):
        if group >= 0:
            sums[group] += norm * norm
    return sums


def norm_rows(step: int, index: ParamIndex, host: Mapping[str, Sequence[float]]) -> list[LayerStat]:
    """Per-tensor, per-component and per-layer grad_norm, param_norm and update_ratio, in
    plain floats on the host (a few dozen numbers a run; no tensor call after the transfer).
    A group's norm combines its tensors as one vector: sqrt of the summed squares."""
    grad, param, delta = host[GRAD_NORM], host[PARAM_NORM], host.get("delta_norm")
    rows: list[LayerStat] = []

    def add(layer: int, kind: str, name: str, norms: Sequence[Sequence[float]], i: int) -> None:
        grad_norm, param_norm = norms[0][i], norms[1][i]
        rows.append(LayerStat(step, layer, kind, name, GRAD_NORM, grad_norm))
        rows.append(LayerStat(step, layer, kind, name, PARAM_NORM, param_norm))
        if delta is not None:
            ratio = norms[2][i] / param_norm if param_norm > 0 else math.nan
            rows.append(LayerStat(step, layer, kind, name, UPDATE_RATIO, ratio))

    measured = [grad, param, *([delta] if delta is not None else [])]
    for i, name in enumerate(index.names):
        add(index.layers[i], "param", name, measured, i)
    for members, groups in index.groupings:
        sums = [summed_squares(norms, members, len(groups)) for norms in measured]
        norms = [[math.sqrt(total) for total in summed] for summed in sums]
        for g, (layer, component) in enumerate(groups):
            add(layer, "component", component, norms, g)
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
