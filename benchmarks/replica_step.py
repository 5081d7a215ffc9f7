"""The bare batched step of `LitReplicas` (issue 25): vmap against a loop over the replicas,
against one solo step, in ms per replica.

    .venv/bin/python benchmarks/replica_step.py [--shapes quick,baby-cpu] [--ks 1,4,8]
        [--steps 30] [--threads 1] [--out benchmarks/results/replica-step.json]

One step is what the Trainer runs between data fetches, without Lightning: the forward and
backward pass of every replica (`LitReplicas.training_step`), its per-replica clipping and
`ReplicaAdamW`; the solo step is `LitCharModel.training_step`, `clip_grad_norm_` and torch's
AdamW on one model of the same shape. Random token batches, dropout 0, 5 warm-up steps,
then the mean of `--steps`. The two ways of running the replicas:

vmap   `torch.func.vmap` over the stacked parameters (what a GPU uses)
loop   `functional_call` once per replica over views of the stack (what a CPU uses)

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
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blockviz.core import config as cfg  # noqa: E402
from blockviz.core.studies import SIZE_PRESETS  # noqa: E402
from blockviz.training.lit import LitCharModel  # noqa: E402
from blockviz.training.replicas import LitReplicas  # noqa: E402

VOCAB = 65
KS = (1, 4, 8)


def shape(name: str) -> cfg.RunConfig:
    """The run config of a shape: the quick study size, or baby-cpu as it is."""
    base = cfg.replace(cfg.preset("baby-cpu"), vocab_size=VOCAB, dropout=0.0)
    if name == "quick":
        fields = cfg.field_types(cfg.ModelConfig) | cfg.field_types(cfg.TrainConfig)
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


def batched_ms(config: cfg.RunConfig, k: int, vectorize: bool, steps: int) -> float:
    configs = [cfg.replace(config, seed=seed).to_dict() for seed in range(k)]
    lit = LitReplicas(configs, vectorize=vectorize)
    optimizer = lit.configure_optimizers()
    batch, block = config.train.batch_size, config.model.block_size
    x = torch.randint(0, VOCAB, (k, batch, block))
    y = torch.randint(0, VOCAB, (k, batch, block))

    def step() -> None:
        lit.training_step((x, y), 0)["loss"].backward()
        lit.configure_gradient_clipping(optimizer)
        optimizer.step()
        for param in lit.stacked_params():
            param.grad = None

    return timed(step, steps) * 1e3


def solo_ms(config: cfg.RunConfig, steps: int) -> float:
    lit = LitCharModel(config.to_dict())
    train = config.train
    optimizer = torch.optim.AdamW(lit.parameters(), lr=train.lr, betas=(train.beta1, train.beta2))
    batch, block = train.batch_size, config.model.block_size
    x = torch.randint(0, VOCAB, (batch, block))
    y = torch.randint(0, VOCAB, (batch, block))

    def step() -> None:
        lit.training_step((x, y), 0).backward()
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
    warnings.filterwarnings("ignore", message=".*batching rule.*")
    load_before = os.getloadavg()
    rows = []
    for name in args.shapes.split(","):
        config = shape(name)
        for k in (int(v) for v in args.ks.split(",")):
            solo = solo_ms(config, args.steps)
            row = {"shape": name, "k": k, "solo_ms": round(solo, 2)}
            for way, vectorize in (("vmap", True), ("loop", False)):
                total = batched_ms(config, k, vectorize, args.steps)
                row[f"{way}_ms"] = round(total, 2)
                row[f"{way}_ratio"] = round(total / k / solo, 3)
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
    print("\n| shape | K | solo ms | vmap ms (per replica ÷ solo) | loop ms (per replica ÷ solo) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['shape']} | {r['k']} | {r['solo_ms']} | {r['vmap_ms']} ({r['vmap_ratio']}×) "
            f"| {r['loop_ms']} ({r['loop_ratio']}×) |"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
