"""A parameter breakdown as the pages show it: tidy frames, block shares, one sentence."""

from __future__ import annotations

import pandas as pd

from blockviz.core.config_model import ModelConfig
from blockviz.core.params import Breakdown
from blockviz.core.spec import layer_label


def breakdown_frames(
    breakdown: Breakdown, n_layer: int
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per component, per layer and component, every row) frames of a parameter breakdown."""
    rows = pd.DataFrame(
        [
            (r.layer, layer_label(r.layer, n_layer), r.component, r.count, r.formula)
            for r in breakdown.rows
        ],
        columns=["layer_index", "layer", "component", "count", "formula"],
    )
    total = max(breakdown.total, 1)
    components = []
    for component, count in breakdown.by_component().items():
        mine = rows[rows["component"] == component]
        formula = mine["formula"].iloc[0]
        if len(mine) > 1:
            formula = f"{len(mine)} × [{formula}]"
        components.append((component, count, count / total, len(mine), formula))
    by_component = pd.DataFrame(
        components, columns=["component", "count", "share", "layers", "formula"]
    )
    by_layer = rows.sort_values("layer_index", kind="stable")[["layer", "component", "count"]]
    return by_component, by_layer.reset_index(drop=True), rows


def _block_counts(breakdown: Breakdown) -> dict[str, int]:
    """Parameters of one block (all blocks are alike): total, ffn, attn, norm."""
    block = [r for r in breakdown.rows if r.layer == 0]
    counts = {"total": sum(r.count for r in block)}
    for part in ("ffn", "attn", "norm"):
        counts[part] = sum(r.count for r in block if r.component.startswith(part))
    return counts


def block_shares(breakdown: Breakdown) -> dict[str, float]:
    """Fractions of one block's parameters in its FFN, attention and norms."""
    counts = _block_counts(breakdown)
    total = max(counts["total"], 1)
    return {part: counts[part] / total for part in ("ffn", "attn", "norm")}


def share_sentence(model_cfg: ModelConfig, breakdown: Breakdown) -> str:
    """Where the parameters sit, in words computed from the breakdown."""
    counts = _block_counts(breakdown)
    block_total, ffn, attn, norms = (counts[k] for k in ("total", "ffn", "attn", "norm"))
    total = max(breakdown.total, 1)
    blocks_total = sum(r.count for r in breakdown.rows if 0 <= r.layer < model_cfg.n_layer)
    parts = []
    if block_total:
        width = f"ffn_mult {model_cfg.ffn_mult}, {model_cfg.activation}"
        if ffn:
            parts.append(
                f"The FFN holds {ffn / block_total:.1%} of each block's {block_total:,} "
                f"parameters ({ffn:,} at {width})"
            )
        if attn:
            parts.append(f"attention {attn / block_total:.1%} ({attn:,})")
        if norms:
            parts.append(f"norms {norms / block_total:.1%} ({norms:,})")
    sentence = "; ".join(parts) + "." if parts else ""
    rest = total - blocks_total
    return (
        f"{sentence} The {model_cfg.n_layer} blocks hold {blocks_total / total:.1%} of the "
        f"{breakdown.total:,} parameters; embeddings and the head the other {rest / total:.1%}."
    ).strip()
