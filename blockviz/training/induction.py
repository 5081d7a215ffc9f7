"""Induction-head statistics of a probe step, per head: `prefix_score` (attention on the
token after the previous occurrence, on a fixed batch of repeated random sequences),
`copy_score` (the eigenvalue positivity of the head's OV circuit) and the loss gain on the
second repeat; docs/internals.md ("The induction statistics") defines each one.

The repeated batch is drawn once from its own generator (INDUCTION_SEED), so the training
RNG never moves. Its forward pass runs at probe steps only, on the device, and its
results join the probe step's one transfer; the eigenvalues of the small h x h matrices
(h = head_dim; the nonzero eigenvalues of W_U W_O W_V W_E are those of W_V W_E W_U W_O)
are taken on the host after it, in numpy (`torch.linalg.eigvals` on a GPU waits for the
host).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from blockviz.core.induction import repeat_half
from blockviz.core.spec import COPY_SCORE, PREFIX_SCORE, PROBE_REPEAT_GAIN
from blockviz.training.model import capture_attention
from blockviz.training.sinks import LayerStat

INDUCTION_SEED = 27  # the repeated batch's own generator: the same tokens at every probe
INDUCTION_BATCH = 4  # sequences in the repeated batch
PREFIX_PART, OV_PART, GAIN_PART = "induction_prefix", "induction_ov", "induction_gain"


def repeated_batch(
    vocab_size: int, block_size: int, batch: int = INDUCTION_BATCH, seed: int = INDUCTION_SEED
) -> torch.Tensor | None:
    """(batch, 2L) token ids, each row a uniformly random half of L = block_size // 2 tokens
    followed by the same half; None when L < 2 (no query has a previous token to match)."""
    half = repeat_half(block_size)
    if half < 2:
        return None
    generator = torch.Generator().manual_seed(seed)
    first = torch.randint(vocab_size, (batch, half), generator=generator)  # (B, L)
    return torch.cat([first, first], dim=1)  # (B, 2L)


def prefix_scores(weights: torch.Tensor, half: int) -> torch.Tensor:
    """Each head's mean weight from query i of the second repeat to key i - half + 1:
    (B, nh, 2L, 2L) -> (nh,)."""
    # The diagonal at offset -(half - 1) pairs query j + half - 1 with key j; its first
    # entry is the last query of the first repeat, the rest are the second repeat's.
    diagonal = torch.diagonal(weights.float(), offset=-(half - 1), dim1=-2, dim2=-1)
    return diagonal[..., 1:].mean(dim=(0, 2))  # (nh,)


@torch.no_grad()
def ov_circuits(model: nn.Module, layers: Sequence[int]) -> torch.Tensor:
    """W_V^h W_E W_U W_O^h of every head of `layers`: (L, nh, hs, hs), in float32."""
    embed = model.tok_emb.weight.float()  # (V, C): W_E transposed
    unembed = model.lm_head.weight.float()  # (V, C): W_U
    through = embed.T @ unembed  # (C, C): W_E W_U
    circuits = []
    for layer in layers:
        attn = model.blocks[layer].attn
        nh, C = attn.n_head, embed.size(1)
        hs = C // nh
        w_v = attn.qkv.weight[2 * C :].float().view(nh, hs, C)  # (nh, hs, C)
        w_o = attn.proj.weight.float().view(C, nh, hs).transpose(0, 1)  # (nh, C, hs)
        circuits.append(w_v @ through @ w_o)  # (nh, hs, hs)
    return torch.stack(circuits)  # (L, nh, hs, hs)


def copying_scores(circuits: np.ndarray) -> np.ndarray:
    """Σ Re λ / Σ |λ| of each (..., n, n) matrix's eigenvalues; NaN for a zero matrix and
    for one holding a NaN or an infinity (a diverging model's: it gets a score, not a
    LinAlgError that would fail the run).

    On the host, in numpy: the matrices are small, and the probe step's values are already
    there (no torch call after the one transfer)."""
    matrices = np.asarray(circuits, dtype=np.float64)
    finite = np.isfinite(matrices).all(axis=(-2, -1))  # (...,)
    eigenvalues = np.linalg.eigvals(np.where(finite[..., None, None], matrices, 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        scores = eigenvalues.real.sum(axis=-1) / np.abs(eigenvalues).sum(axis=-1)
    return np.where(finite, scores, np.nan)


def repeat_gain(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The mean loss predicting the first repeat's tokens 1..L-1 minus that predicting the
    second repeat's L+1..2L-1 (nats; L - 1 predictions each): (1,)."""
    half = tokens.size(1) // 2
    loss = F.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), tokens[:, 1:], reduction="none"
    )  # (B, 2L - 1): position t predicting t + 1
    first, second = loss[:, : half - 1], loss[:, half:]
    return (first.mean() - second.mean()).reshape(1)


@torch.no_grad()
def induction_parts(
    model: nn.Module,
    tokens: torch.Tensor,
    precision: Callable[[], AbstractContextManager[object]],
) -> dict[str, torch.Tensor]:
    """A probe step's device tensors of the induction statistics: one forward pass of the
    repeated batch `tokens` (B, 2L) under `precision`, attention captured; {} when the
    model has no attention."""
    with precision(), capture_attention(model) as attention:
        logits, _ = model(tokens)  # (B, 2L, V)
    layers = sorted(attention)
    if not layers:
        return {}
    half = tokens.size(1) // 2
    return {
        PREFIX_PART: torch.stack([prefix_scores(attention[layer], half) for layer in layers]),
        OV_PART: ov_circuits(model, layers),  # (L, nh, hs, hs)
        GAIN_PART: repeat_gain(logits, tokens),  # (1,)
    }


def induction_records(
    step: int, layers: Sequence[int], host: Mapping[str, Sequence[float]]
) -> tuple[list[LayerStat], dict[str, float]]:
    """The prefix_score and copy_score rows of every head, and the repeat-gain scalar,
    from the host values of `induction_parts`."""
    prefix = host[PREFIX_PART]
    n_head = len(prefix) // len(layers)
    flat = np.asarray(host[OV_PART], dtype=np.float64)
    size = math.isqrt(len(flat) // len(prefix))
    copying = copying_scores(flat.reshape(len(prefix), size, size))  # (L * nh,)
    rows = []
    for i, (matching, copies) in enumerate(zip(prefix, copying, strict=True)):
        layer, head = layers[i // n_head], str(i % n_head)
        rows.append(LayerStat(step, layer, "head", head, PREFIX_SCORE, float(matching)))
        rows.append(LayerStat(step, layer, "head", head, COPY_SCORE, float(copies)))
    return rows, {PROBE_REPEAT_GAIN: float(host[GAIN_PART][0])}
