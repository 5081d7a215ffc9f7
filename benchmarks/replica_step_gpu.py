"""The bare step on a GPU (issue 34): one solo baby-cpu step against K = 8, 64 and 256
replicas of it, no Lightning, bf16 autocast, then a profile of five solo steps.

    python3 benchmarks/replica_step_gpu.py [--ks 8,64,256]

The solo step is LitCharModel.objective, clip_grad_norm_ and torch's AdamW; a batch
step is LitReplicas.objective, its per-replica clipping and ReplicaAdamW. Random
tokens, 5 warm-up steps, then the mean of 30 (synchronised). Prints one JSON line per K
(ms per step, per replica ÷ solo, K × solo ÷ batch, peak MiB) and the profiler's table of
the solo step's host work. Not a test: the numbers in docs/replicas.md and BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from blockviz.core import config as cfg
from blockviz.training.lit import LitCharModel
from blockviz.training.replicas import LitReplicas

VOCAB = 65
DEVICE = torch.device("cuda")


def timed(step: Callable[[], None], steps: int = 30) -> float:
    """Mean ms of `step` over `steps` calls after 5 warm-up calls, device synchronised."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def solo_step(config: cfg.RunConfig) -> Callable[[], None]:
    lit = LitCharModel(config.to_dict()).to(DEVICE)
    optimizer = torch.optim.AdamW(lit.parameters(), lr=1e-3)
    shape = (config.train.batch_size, config.model.block_size)
    x, y = (torch.randint(0, VOCAB, shape, device=DEVICE) for _ in range(2))

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = lit.objective((x, y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lit.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()

    return step


def batch_step(config: cfg.RunConfig, k: int) -> Callable[[], None]:
    lit = LitReplicas([cfg.replace(config, seed=i).to_dict() for i in range(k)]).to(DEVICE)
    optimizer = lit.configure_optimizers()
    shape = (k, config.train.batch_size, config.model.block_size)
    x, y = (torch.randint(0, VOCAB, shape, device=DEVICE) for _ in range(2))

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = lit.objective((x, y))
        loss.backward()
        lit.configure_gradient_clipping(optimizer)
        optimizer.step()
        optimizer.zero_grad()

    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="8,64,256")
    args = parser.parse_args(argv)
    print(torch.cuda.get_device_name(0), torch.__version__, flush=True)
    config = cfg.replace(cfg.preset("baby-cpu"), vocab_size=VOCAB, dropout=0.0).validate()
    solo = solo_step(config)
    solo_ms = timed(solo)
    print(json.dumps({"k": 1, "solo_ms": round(solo_ms, 3)}), flush=True)
    for k in (int(v) for v in args.ks.split(",")):
        try:
            torch.cuda.reset_peak_memory_stats()
            ms = timed(batch_step(config, k))
        except Exception as exc:  # one K failing still reports the others
            print(f"K {k} failed: {exc!r}"[:500], flush=True)
            continue
        row = {
            "k": k,
            "batch_ms": round(ms, 3),
            "per_replica_vs_solo": round(ms / k / solo_ms, 4),
            "speedup_total": round(k * solo_ms / ms, 2),
            "peak_MiB": torch.cuda.max_memory_allocated() >> 20,
        }
        print(json.dumps(row), flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            solo()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
