"""A spike for issue 25 (replicas): K models of one shape trained as one batched model with
`torch.func` (stack_module_state + functional_call + vmap), against the same K models
trained one after another, in a bare loop.

    .venv/bin/python benchmarks/replicas_spike.py [--steps 12] [--threads 1]
                                                  [--out benchmarks/results/replicas-spike.json]

What it measures, and what it leaves out: the forward, backward and AdamW step of each
replica on random token batches (dropout 0, no clipping, one learning rate), per step; K =
1, 2, 4, 8; two shapes: `quick` (the quick study size's model: 2 layers, 2 heads, d_model 64,
context 64, batch 16) and `baby-cpu`. Both ways run twice: with the model's own attention
(`scaled_dot_product_attention`, which vmap runs through a per-sample fallback on the CPU)
and with a plain softmax(q k^T) attention under vmap. It reports ms per step (all K replicas)
and the largest difference between a replica's loss and its solo twin's over the steps.
No Lightning, no probes, no data loader, no evaluation: the fixed costs a real run pays per
step and per run (which batching would share) are not in these numbers.

Not a test and not the feature: the numbers that decide how issue 25 is built.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blockviz.core import config as cfg  # noqa: E402
from blockviz.core.config_model import ModelConfig  # noqa: E402
from blockviz.training.model import CharTransformer  # noqa: E402

VOCAB = 80
SHAPES = {
    "quick": {"n_layer": 2, "n_head": 2, "d_model": 64, "block_size": 64, "batch_size": 16},
    "baby-cpu": {},
}
KS = (1, 2, 4, 8)


def shape(name: str) -> tuple[ModelConfig, int]:
    """The model config (dropout 0) and the batch size of a shape."""
    run = cfg.replace(cfg.preset("baby-cpu"), vocab_size=VOCAB, dropout=0.0, **SHAPES[name])
    return run.model, run.train.batch_size


def models(model_cfg: ModelConfig, k: int) -> list[CharTransformer]:
    """K models, seeds 0..K-1."""
    out = []
    for seed in range(k):
        torch.manual_seed(seed)
        out.append(CharTransformer(model_cfg))
    return out


def batches(k: int, batch: int, block: int, steps: int) -> list[torch.Tensor]:
    """Random token windows, (K, B, T + 1) per step: each replica its own batch."""
    generator = torch.Generator().manual_seed(123)
    return [
        torch.randint(0, VOCAB, (k, batch, block + 1), generator=generator) for _ in range(steps)
    ]


def solo(model_cfg: ModelConfig, data: list[torch.Tensor]) -> tuple[float, list[list[float]]]:
    """The K replicas one after another at each step: seconds, losses (step x K)."""
    k = data[0].shape[0]
    replicas = models(model_cfg, k)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in replicas]
    losses = []
    start = time.perf_counter()
    for window in data:
        row = []
        for i, (model, optimizer) in enumerate(zip(replicas, optimizers, strict=True)):
            _, loss = model(window[i, :, :-1], window[i, :, 1:])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            row.append(loss.item())
        losses.append(row)
    return time.perf_counter() - start, losses


def batched(model_cfg: ModelConfig, data: list[torch.Tensor]) -> tuple[float, list[list[float]]]:
    """The K replicas as one vmapped model, one AdamW over the stacked parameters (the
    update is elementwise, so it equals K AdamWs while lr and weight decay are shared)."""
    k = data[0].shape[0]
    replicas = models(model_cfg, k)
    params, buffers = stack_module_state(replicas)  # each (K, ...)
    template = copy.deepcopy(replicas[0]).to("meta")

    def loss_of(p: dict, b: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return functional_call(template, (p, b), (x, y))[1]

    optimizer = torch.optim.AdamW(list(params.values()), lr=1e-3)
    losses = []
    start = time.perf_counter()
    for window in data:
        loss = vmap(loss_of)(params, buffers, window[:, :, :-1], window[:, :, 1:])  # (K,)
        optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()  # the replicas share nothing: each gets its own gradient
        optimizer.step()
        losses.append(loss.tolist())
    return time.perf_counter() - start, losses


def plain_attention(q, k, v, dropout_p=0.0, is_causal=True):
    """softmax(q k^T / sqrt(hs), causal) v: ops that vmap batches (no fallback)."""
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/replicas-spike.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    load_before = os.getloadavg()[0]
    sdpa = F.scaled_dot_product_attention
    for name in SHAPES:
        model_cfg, batch = shape(name)
        for attention in ("sdpa", "plain"):
            for k in KS:
                data = batches(k, batch, model_cfg.block_size, args.steps)
                solo_s, solo_losses = solo(model_cfg, data)
                if attention == "plain":
                    F.scaled_dot_product_attention = plain_attention
                try:
                    batched_s, batched_losses = batched(model_cfg, data)
                finally:
                    F.scaled_dot_product_attention = sdpa
                diff = max(
                    abs(a - b)
                    for solo_row, batched_row in zip(solo_losses, batched_losses, strict=True)
                    for a, b in zip(solo_row, batched_row, strict=True)
                )
                row = {
                    "shape": name,
                    "attention_under_vmap": attention,
                    "k": k,
                    "solo_ms_per_step": round(solo_s / args.steps * 1000, 1),
                    "batched_ms_per_step": round(batched_s / args.steps * 1000, 1),
                    "speedup": round(solo_s / batched_s, 2),
                    "max_loss_diff": diff,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores",
        "torch": torch.__version__,
        "threads": args.threads,
        "steps": args.steps,
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
