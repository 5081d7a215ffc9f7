"""The bare batched step of `LitReplicas` (issues 25 and 34) against one solo step, in ms
per replica.

    .venv/bin/python benchmarks/replica_step.py [--shapes quick,baby-cpu] [--ks 1,4,8]
        [--steps 30] [--threads 1] [--out benchmarks/results/replica-step.json]

One step is what the Trainer runs between data fetches, without Lightning: the forward and
backward pass of every replica (`LitReplicas.objective`), its per-replica clipping and
`ReplicaAdamW`; the solo step is `LitCharModel.objective`, `clip_grad_norm_` and torch's
AdamW on one model of the same shape. Random token batches, dropout 0, 5 warm-up steps,
then the mean of `--steps`. The batch is the one every device runs: the model called once
on the stacked parameters (issue 34; issue 25's vmap and per-replica loop are gone).

The ratio is (batched ms ÷ K) ÷ solo ms: below 1, a replica costs less than a solo step.
Not a test: numbers for BENCHMARKS.md and docs/replicas.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blockviz.core import config as cfg  # noqa: E402
from blockviz.core.config_model import ModelConfig  # noqa: E402
from blockviz.core.config_train import TrainConfig  # noqa: E402
from blockviz.core.studies.define import SIZE_PRESETS  # noqa: E402
from blockviz.training.lit import LitCharModel  # noqa: E402
from blockviz.training.replicas import LitReplicas  # noqa: E402

VOCAB = 65
KS = (1, 4, 8)


def shape(name: str) -> cfg.RunConfig:
    """The run config of a shape: the quick study size, or baby-cpu as it is."""
    base = cfg.replace(cfg.preset("baby-cpu"), vocab_size=VOCAB, dropout=0.0)
    if name == "quick":
        fields = cfg.field_types(ModelConfig) | cfg.field_types(TrainConfig)
        quick = {k: v for k, v in SIZE_PRESETS["quick"].items() if k in fields}
        base = cfg.replace(base, **quick)
    return base.validate()


def timed(step, steps: int) -> float:
    """Mean seconds of `step` over `steps` calls, after 5 warm-up calls."""
    for _ in range(5):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def batched_ms(config: cfg.RunConfig, k: int, steps: int) -> float:
    configs = [cfg.replace(config, seed=seed).to_dict() for seed in range(k)]
    lit = LitReplicas(configs)
    optimizer = lit.configure_optimizers()
    batch, block = config.train.batch_size, config.model.block_size
    x = torch.randint(0, VOCAB, (k, batch, block))
    y = torch.randint(0, VOCAB, (k, batch, block))

    def step() -> None:
        lit.objective((x, y))[0].backward()
        lit.configure_gradient_clipping(optimizer)
        optimizer.step()
        optimizer.zero_grad()

    return timed(step, steps) * 1e3


def solo_ms(config: cfg.RunConfig, steps: int) -> float:
    lit = LitCharModel(config.to_dict())
    train = config.train
    optimizer = torch.optim.AdamW(lit.parameters(), lr=train.lr, betas=(train.beta1, train.beta2))
    batch, block = train.batch_size, config.model.block_size
    x = torch.randint(0, VOCAB, (batch, block))
    y = torch.randint(0, VOCAB, (batch, block))

    def step() -> None:
        lit.objective((x, y))[0].backward()
        torch.nn.utils.clip_grad_norm_(lit.parameters(), train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timed(step, steps) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="quick,baby-cpu")
    parser.add_argument("--ks", default=",".join(map(str, KS)))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/replica-step.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = []
    for name in args.shapes.split(","):
        config = shape(name)
        for k in (int(v) for v in args.ks.split(",")):
            solo = solo_ms(config, args.steps)
            row = {"shape": name, "k": k, "solo_ms": round(solo, 2)}
            total = batched_ms(config, k, args.steps)
            row["batch_ms"] = round(total, 2)
            row["batch_ratio"] = round(total / k / solo, 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": args.threads,
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print("\n| shape | K | solo ms | batch ms (per replica ÷ solo) |")
    print("|---|---:|---:|---:|")
    for r in rows:
        batch = f"{r['batch_ms']} ({r['batch_ratio']}×)"
        print(f"| {r['shape']} | {r['k']} | {r['solo_ms']} | {batch} |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
