"""Induction-head statistics of a probe step, per head: `prefix_score` (attention on the
token after the previous occurrence, on a fixed batch of repeated random sequences) and
its standard error over the batch's rows (`prefix_score_se`), `copy_score` (the eigenvalue
positivity of the head's OV circuit) and the loss gain on the second repeat;
docs/internals.md ("The induction statistics") defines each one.

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

from blockviz.core.induction import probe_rows, repeat_half
from blockviz.core.spec import COPY_SCORE, PREFIX_SCORE, PREFIX_SCORE_SE, PROBE_REPEAT_GAIN
from blockviz.training.model import capture_attention
from blockviz.training.probe_stats import RunStack
from blockviz.training.sinks import LayerStat

INDUCTION_SEED = 27  # the repeated batch's own generator: the same tokens at every probe
PREFIX_PART, OV_PART, GAIN_PART = "induction_prefix", "induction_ov", "induction_gain"
PREFIX_SE_PART = "induction_prefix_se"
COPY_PART = "induction_copying"  # on the host only: the scores of OV_PART's circuits


def repeated_batch(
    tokens: Sequence[int], block_size: int, rows: int | None = None
) -> torch.Tensor | None:
    """(rows, 2L) token ids, each row a half of L = block_size // 2 tokens drawn uniformly
    from `tokens` (core.induction.probe_tokens) followed by the same half; `rows` defaults
    to `probe_rows(block_size)`. None when L < 2 (no query has a previous token to match)."""
    half = repeat_half(block_size)
    if half < 2:
        return None
    rows = probe_rows(block_size) if rows is None else rows
    pool = torch.as_tensor(list(tokens), dtype=torch.int64)  # (P,)
    generator = torch.Generator().manual_seed(INDUCTION_SEED)
    first = pool[torch.randint(len(pool), (rows, half), generator=generator)]  # (B, L)
    return torch.cat([first, first], dim=1)  # (B, 2L)


def prefix_rows(weights: torch.Tensor, half: int) -> torch.Tensor:
    """Each row's and head's mean weight from query i of the second repeat to key
    i - half + 1: (..., B, nh, 2L, 2L) -> (..., B, nh)."""
    # The diagonal at offset -(half - 1) pairs query j + half - 1 with key j; its first
    # entry is the last query of the first repeat, the rest are the second repeat's.
    diagonal = torch.diagonal(weights.float(), offset=-(half - 1), dim1=-2, dim2=-1)
    return diagonal[..., 1:].mean(dim=-1)  # (..., B, nh)


def prefix_scores(weights: torch.Tensor, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's prefix score, the mean of `prefix_rows` over the batch's rows, and its
    standard error (the rows' sample sd / sqrt(rows); 0 for one row): (..., nh) each."""
    per_row = prefix_rows(weights, half)  # (..., B, nh)
    rows = per_row.size(-2)
    spread = per_row.std(dim=-2) if rows > 1 else torch.zeros_like(per_row[..., 0, :])
    return per_row.mean(dim=-2), spread / math.sqrt(rows)


@torch.no_grad()
def ov_circuits(stack: RunStack, layers: Sequence[int]) -> torch.Tensor:
    """W_V^h W_E W_U W_O^h of every head of `layers`, of each run of the stack:
    (K, L, nh, hs, hs), in float32."""
    params = stack.by_alias()
    embed = params["tok_emb.weight"].float()  # (K, V, C): W_E transposed
    unembed = params["lm_head.weight"].float()  # (K, V, C): W_U
    through = (embed.transpose(1, 2) @ unembed).unsqueeze(1)  # (K, 1, C, C): W_E W_U
    K, _, C = embed.shape
    nh = stack.model.cfg.n_head
    hs = C // nh
    circuits = []
    for layer in layers:
        qkv = params[f"blocks.{layer}.attn.qkv.weight"]  # (K, 3C, C)
        w_v = qkv[:, 2 * C :].float().reshape(K, nh, hs, C)  # (K, nh, hs, C)
        proj = params[f"blocks.{layer}.attn.proj.weight"].float()  # (K, C, C)
        w_o = proj.reshape(K, C, nh, hs).transpose(1, 2)  # (K, nh, C, hs)
        circuits.append(w_v @ through @ w_o)  # (K, nh, hs, hs)
    return torch.stack(circuits, dim=1)  # (K, L, nh, hs, hs)


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
    """Each run's mean loss predicting the first repeat's tokens 1..L-1 minus that
    predicting the second repeat's L+1..2L-1 (nats; L - 1 predictions each), of its logits
    (K, B, 2L, V) on `tokens` (B, 2L): (K, 1)."""
    half = tokens.size(1) // 2
    targets = tokens[:, 1:].expand(logits.size(0), -1, -1)  # (K, B, 2L - 1)
    scores = logits[:, :, :-1].float().movedim(-1, 1)  # (K, V, B, 2L - 1)
    loss = F.cross_entropy(scores, targets, reduction="none")  # position t predicting t + 1
    first, second = loss[..., : half - 1], loss[..., half:]
    return (first.mean(dim=(1, 2)) - second.mean(dim=(1, 2))).unsqueeze(1)


@torch.no_grad()
def induction_parts(
    stack: RunStack,
    tokens: torch.Tensor,
    precision: Callable[[], AbstractContextManager[object]],
) -> dict[str, torch.Tensor]:
    """A probe step's device tensors of the induction statistics of every run of `stack`
    ((K, ...) each): one stacked forward pass of the repeated batch `tokens` (B, 2L) under
    `precision`, attention captured; {} when the model has no attention."""
    with precision(), capture_attention(stack.model) as attention:
        logits = stack(tokens)  # (K, B, 2L, V)
    layers = sorted(attention)
    if not layers:
        return {}
    half = tokens.size(1) // 2
    scored = [prefix_scores(attention[layer], half) for layer in layers]  # L x 2 x (K, nh)
    prefix, errors = zip(*scored, strict=True)
    return {
        PREFIX_PART: torch.stack(prefix, dim=1),  # (K, L, nh)
        PREFIX_SE_PART: torch.stack(errors, dim=1),  # (K, L, nh)
        OV_PART: ov_circuits(stack, layers),  # (K, L, nh, hs, hs)
        GAIN_PART: repeat_gain(logits, tokens),  # (K, 1)
    }


def add_copying(hosts: Sequence[dict[str, list[float]]]) -> None:
    """Each run's copy_score of every head into its host values (COPY_PART), from the OV
    circuits of `induction_parts`: one eigenvalue call for every run of a probe step."""
    runs = [host for host in hosts if OV_PART in host]
    if not runs:
        return
    flat = np.asarray([host[OV_PART] for host in runs], dtype=np.float64)  # (K, L·nh·hs·hs)
    heads = len(runs[0][PREFIX_PART])
    size = math.isqrt(flat.shape[1] // heads)
    scores = copying_scores(flat.reshape(len(runs), heads, size, size))  # (K, L·nh)
    for host, copying in zip(runs, scores, strict=True):
        host[COPY_PART] = copying.tolist()


def induction_records(
    step: int, layers: Sequence[int], host: Mapping[str, Sequence[float]]
) -> tuple[list[LayerStat], dict[str, float]]:
    """The prefix_score, prefix_score_se and copy_score rows of every head, and the
    repeat-gain scalar, from the host values of `induction_parts` (with `add_copying`'s
    scores)."""
    prefix = host[PREFIX_PART]
    n_head = len(prefix) // len(layers)
    rows = []
    values = zip(prefix, host[PREFIX_SE_PART], host[COPY_PART], strict=True)
    for i, (matching, error, copies) in enumerate(values):
        layer, head = layers[i // n_head], str(i % n_head)
        rows.append(LayerStat(step, layer, "head", head, PREFIX_SCORE, float(matching)))
        rows.append(LayerStat(step, layer, "head", head, PREFIX_SCORE_SE, float(error)))
        rows.append(LayerStat(step, layer, "head", head, COPY_SCORE, float(copies)))
    return rows, {PROBE_REPEAT_GAIN: float(host[GAIN_PART][0])}
