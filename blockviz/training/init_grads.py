"""Gradient norms at initialization, Pre-LN against Post-LN: the Xiong et al. 2020 picture.

No training: for each init, depth, norm position and seed, one model is built from the seed,
one training batch of the config's dataset (drawn by `CharDataModule` with that seed) goes
forward and the mean cross-entropy backward, and the L2 norm of every block's FFN output
weight gradient (`ffn.fc_out.weight`, Xiong et al.'s W² of the FFN) is recorded. Pre and
post share the seed, so they share every weight; only Pre-LN's final norm (auto) differs.
Dropout is set to 0 so the pass is deterministic.

`python -m blockviz init-grads` (registered torch-free in `blockviz.cli`) runs `main`, and
`core.init_grads` summarises and prints the rows; the dashboard's "Gradients at init" page
runs it with `--json` in a subprocess.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from blockviz.core import config as cfg
from blockviz.core import spec
from blockviz.core.config_model import INITS, ModelConfig
from blockviz.core.corpora import load_corpus
from blockviz.core.flags import build_config
from blockviz.core.init_grads import POSITIONS, QUANTITY, check_request, summarise, table
from blockviz.core.requests import InitGradsRequest
from blockviz.training.data import CharDataModule
from blockviz.training.model import CharTransformer

DEFAULT_DEPTHS = (3, 6, 12, 24)
DEFAULT_SEEDS = 3

Progress = Callable[[int, int, str], None]  # (done, total, what is next)


def layer_grad_norms(
    model_cfg: ModelConfig, inputs: torch.Tensor, targets: torch.Tensor, seed: int
) -> list[float]:
    """‖∇ ffn.fc_out.weight‖ of every block after one backward pass of a fresh model."""
    torch.manual_seed(seed)
    model = CharTransformer(model_cfg)
    model.train()
    _, loss = model(inputs, targets)
    loss.backward()
    return [float(block.ffn.fc_out.weight.grad.norm()) for block in model.blocks]


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
    inits: Sequence[str] = INITS,
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
