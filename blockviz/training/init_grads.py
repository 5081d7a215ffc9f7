"""Gradient norms at initialization, Pre-LN against Post-LN: the Xiong et al. 2020 picture.

No training: for each init, depth, norm position and seed, one model is built from the seed,
one training batch of the config's dataset (drawn by `CharDataModule` with that seed) goes
forward and the mean cross-entropy backward, and the L2 norm of every block's FFN output
weight gradient (`ffn.fc_out.weight`, Xiong et al.'s W² of the FFN) is recorded. Pre and
post share the seed, so they share every weight; only Pre-LN's final norm (auto) differs.
Dropout is set to 0 so the pass is deterministic.

`python -m blockviz init-grads` (registered torch-free in `blockviz.cli`) runs `main`;
the dashboard's "Gradients at init" page runs it with `--json` in a subprocess.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from blockviz.core import config as cfg
from blockviz.core import spec
from blockviz.core.bounds import BOUNDS
from blockviz.core.corpora import load_corpus
from blockviz.core.flags import UsageError, build_config
from blockviz.core.requests import InitGradsRequest
from blockviz.training.data import CharDataModule
from blockviz.training.model import CharTransformer

QUANTITY = "ffn.fc_out.weight"  # the per-layer gradient measured, by parameter name
POSITIONS = ("pre", "post")
DEFAULT_DEPTHS = (3, 6, 12, 24)
DEFAULT_SEEDS = 3

Progress = Callable[[int, int, str], None]  # (done, total, what is next)


def layer_grad_norms(
    model_cfg: cfg.ModelConfig, inputs: torch.Tensor, targets: torch.Tensor, seed: int
) -> list[float]:
    """‖∇ ffn.fc_out.weight‖ of every block after one backward pass of a fresh model."""
    torch.manual_seed(seed)
    model = CharTransformer(model_cfg)
    model.train()
    _, loss = model(inputs, targets)
    loss.backward()
    return [float(block.ffn.fc_out.weight.grad.norm()) for block in model.blocks]


def check_request(
    model_cfg: cfg.ModelConfig, depths: Sequence[int], inits: Sequence[str], seeds: Sequence[int]
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
        if init not in cfg.INITS:
            raise UsageError(f"--inits {init!r}: choose from {', '.join(cfg.INITS)}")


def seed_batch(
    run_config: cfg.RunConfig, corpus: Any, seed: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The first training batch (B, T) inputs and targets for `seed`, and the vocabulary size."""
    datamodule = CharDataModule(
        run_config.data,
        block_size=run_config.model.block_size,
        batch_size=run_config.train.batch_size,
        seed=seed,
        eval_iters=1,
        corpus=corpus,
    )
    datamodule.setup()
    inputs, targets = next(iter(datamodule.train_dataloader()))
    return inputs, targets, datamodule.vocab.size


def measure(
    run_config: cfg.RunConfig,
    depths: Sequence[int] = DEFAULT_DEPTHS,
    inits: Sequence[str] = cfg.INITS,
    seeds: Sequence[int] = tuple(range(DEFAULT_SEEDS)),
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Tidy rows: init, norm_position, depth, seed, layer (0 = first block), grad_norm."""
    check_request(run_config.model, depths, inits, seeds)
    corpus = load_corpus(run_config.data)
    rows: list[dict[str, Any]] = []
    total, done = len(seeds) * len(inits) * len(depths) * len(POSITIONS), 0
    for seed in seeds:
        inputs, targets, vocab_size = seed_batch(run_config, corpus, seed)
        for init in inits:
            for depth in depths:
                for position in POSITIONS:
                    if progress is not None:
                        progress(done, total, f"{init}, {position}-LN, {depth} layers, seed {seed}")
                    model_cfg = cfg.replace(
                        run_config,
                        vocab_size=vocab_size,
                        n_layer=depth,
                        norm_position=position,
                        init=init,
                        dropout=0.0,
                    ).model.validate()
                    norms = layer_grad_norms(model_cfg, inputs, targets, seed)
                    rows += [
                        {
                            "init": init,
                            "norm_position": position,
                            "depth": depth,
                            "seed": seed,
                            "layer": layer,
                            spec.GRAD_NORM: value,
                        }
                        for layer, value in enumerate(norms)
                    ]
                    done += 1
    if progress is not None:
        progress(done, total, "done")
    return rows


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


def run(
    run_config: cfg.RunConfig,
    depths: Sequence[int],
    inits: Sequence[str],
    seeds: Sequence[int],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The whole result as JSON-ready data: what was measured, the rows and the summary."""
    started = time.perf_counter()
    rows = measure(run_config, depths, inits, seeds, progress)
    return {
        "quantity": QUANTITY,
        "dataset": run_config.data.dataset,
        "batch_size": run_config.train.batch_size,
        "block_size": run_config.model.block_size,
        "model": run_config.to_dict()["model"],
        "depths": list(depths),
        "inits": list(inits),
        "seeds": list(seeds),
        "rows": rows,
        "summary": summarise(rows),
        "seconds": time.perf_counter() - started,
    }


def _stderr_progress(done: int, total: int, what: str) -> None:
    # One parseable line per model: the dashboard reads these to draw its progress bar.
    print(f"progress {done}/{total} {what}", file=sys.stderr, flush=True)


def main(request: InitGradsRequest) -> int:
    """`blockviz init-grads`: measure, then print the table (or JSON with --json)."""
    # These matrices are too small for intra-op threads to pay: on a 2-core machine one
    # thread measured 1.9x faster than torch's default (xavier, 1 seed, 8 models).
    torch.set_num_threads(request.threads)
    run_config = build_config(request.source)
    progress = None if request.quiet else _stderr_progress
    depths, inits, seeds = list(request.depths), list(request.inits), list(range(request.seeds))
    result = run(run_config, depths, inits, seeds, progress)
    print(json.dumps(result) if request.json else table(result))
    return 0
