"""The init-gradients measurement (`training.init_grads`) as data, torch-free: what it
measures, which requests it can measure, and its rows summarised and printed (per init and
depth, Post-LN's last-block gradient norm over Pre-LN's).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from blockviz.core import spec
from blockviz.core.config import BOUNDS
from blockviz.core.config_model import INITS, ModelConfig
from blockviz.core.flags import UsageError

QUANTITY = "ffn.fc_out.weight"  # the per-layer gradient measured, by parameter name
POSITIONS = ("pre", "post")


def check_request(
    model_cfg: ModelConfig, depths: Sequence[int], inits: Sequence[str], seeds: Sequence[int]
) -> None:
    """UsageError naming the first option that cannot be measured."""
    if not model_cfg.ffn:
        raise UsageError(f"ffn is off: init-grads measures each block's {QUANTITY} gradient")
    if not depths or not inits or not seeds:
        raise UsageError("give at least one depth, one init and one seed")
    low, high = BOUNDS["n_layer"].low, BOUNDS["n_layer"].high
    for depth in depths:
        if isinstance(depth, bool) or not isinstance(depth, int) or not low <= depth <= high:
            raise UsageError(f"--depths {depth!r}: each must be an integer in [{low}, {high}]")
    for init in inits:
        if init not in INITS:
            raise UsageError(f"--inits {init!r}: choose from {', '.join(INITS)}")


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (init, depth): each position's last-block norm (seed mean), post/pre, its seed range."""
    last: dict[tuple[str, int, str], dict[int, float]] = {}
    for row in rows:
        if row["layer"] == row["depth"] - 1:
            key = (row["init"], row["depth"], row["norm_position"])
            last.setdefault(key, {})[row["seed"]] = row[spec.GRAD_NORM]
    pairs = sorted({(init, depth) for init, depth, _ in last}, key=lambda k: (k[0], k[1]))
    summary = []
    for init, depth in pairs:
        post, pre = last[(init, depth, "post")], last[(init, depth, "pre")]
        per_seed = [post[s] / pre[s] for s in sorted(post)]
        post_mean, pre_mean = statistics.mean(post.values()), statistics.mean(pre.values())
        summary.append(
            {
                "init": init,
                "depth": depth,
                "post_last": post_mean,
                "pre_last": pre_mean,
                "ratio": post_mean / pre_mean,  # ratio of the seed means
                "ratio_min": min(per_seed),
                "ratio_max": max(per_seed),
            }
        )
    return summary


def layer_means(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int, str], list[float]]:
    """Seed-mean gradient norm per layer, keyed by (init, depth, norm_position)."""
    values: dict[tuple[str, int, str], dict[int, list[float]]] = {}
    for row in rows:
        key = (row["init"], row["depth"], row["norm_position"])
        values.setdefault(key, {}).setdefault(row["layer"], []).append(row[spec.GRAD_NORM])
    return {
        key: [statistics.mean(by_layer[layer]) for layer in sorted(by_layer)]
        for key, by_layer in values.items()
    }


def table(result: dict[str, Any]) -> str:
    """The printed report: one line per (init, depth) with post/pre, then the per-layer values."""
    means = layer_means(result["rows"])
    lines = [
        f"gradient L2 norm of each block's {result['quantity']} at initialization "
        f"(one batch of {result['batch_size']} × {result['block_size']} characters of "
        f"{result['dataset']}, mean of seeds {', '.join(map(str, result['seeds']))})",
        f"{'init':<8} {'depth':>5} {'post last':>10} {'pre last':>10} "
        f"{'post/pre':>9} {'seed range':>12}",
    ]
    for row in result["summary"]:
        lines.append(
            f"{row['init']:<8} {row['depth']:>5} "
            f"{row['post_last']:>10.4g} {row['pre_last']:>10.4g} "
            f"{row['ratio']:>9.2f} {row['ratio_min']:>5.2f}–{row['ratio_max']:.2f}"
        )
        for position in ("post", "pre"):
            values = " ".join(f"{v:.4g}" for v in means[(row["init"], row["depth"], position)])
            lines.append(f"    {position:<4} by layer: {values}")
    return "\n".join(lines)
