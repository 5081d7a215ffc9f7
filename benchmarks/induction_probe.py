"""What the induction statistics add to a probe step (issue 27): an ordinary training step
against a probe step with and without them, in ms and in ordinary steps.

    .venv/bin/python benchmarks/induction_probe.py [--shapes attn-only-128,baby-cpu]
        [--steps 120] [--reps 2] [--threads 1] [--out benchmarks/results/induction-probe.json]

Each fit is the Trainer a run uses (`make_trainer`, `LitCharModel`, `BlockProbe`) on Tiny
Shakespeare, probing every other step (`probe_interval` 2), no samples after step 0, no
store (the probe writes to a sink that drops its records, so the time is measuring and
the one transfer, not SQLite). A callback times each step from `on_train_batch_start` to
`on_train_batch_end`; each fit gives the median of its ordinary steps and of its probe
steps, the first 10 steps left out. The fits with the induction statistics
(`BlockProbe(induction=True)`, the default) and without alternate, `--reps` times each.

Shapes: `attn-only-128` and `attn-only-256` are the 2-layer, 4-head, d_model 128
attention-only models of the induction runs (block_size 128, batch 12; block_size 256,
batch 16); `baby-cpu` is the default run. Not a test: numbers for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lightning.pytorch.callbacks import Callback  # noqa: E402

from benchmarks.bench_train import machine  # noqa: E402
from blockviz.core import config as cfg  # noqa: E402
from blockviz.training.data import CharDataModule  # noqa: E402
from blockviz.training.lit import LitCharModel  # noqa: E402
from blockviz.training.probes import BlockProbe  # noqa: E402
from blockviz.training.trainer import make_trainer, quiet_lightning  # noqa: E402

SKIP = 10  # first steps left out of the medians (allocation, caches)
ATTN_ONLY = {"n_layer": 2, "n_head": 4, "d_model": 128, "ffn": False}
SHAPES = {
    "attn-only-128": {**ATTN_ONLY, "block_size": 128, "batch_size": 12},
    "attn-only-256": {**ATTN_ONLY, "block_size": 256, "batch_size": 16},
    "baby-cpu": {},
}


class DropSink:
    """A probe sink that takes the records and keeps nothing."""

    def write(self, records: object) -> None:
        """Drop one probe step's records."""

    def flush(self) -> None:
        """Nothing kept, nothing to flush."""


class StepTimer(Callback):
    """Wall seconds of each training step, batch start to batch end, by step."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # global_step has moved past the step just taken
        self.seconds[trainer.global_step - 1] = time.perf_counter() - self._start


def fit_ms(config: cfg.RunConfig, induction: bool) -> tuple[float, float]:
    """(median ordinary step ms, median probe step ms) of one fit."""
    dm = CharDataModule(config.data, config.model.block_size, config.train.batch_size)
    dm.setup()
    config = cfg.replace(config, vocab_size=dm.vocab.size)
    probe = BlockProbe([[DropSink()]], probe_interval=2, sample_interval=10**9, induction=induction)
    timer = StepTimer()
    lit = LitCharModel(config.to_dict(), dm.vocab.to_json())
    with tempfile.TemporaryDirectory() as run_dir:
        make_trainer(config, [probe, timer], run_dir=run_dir).fit(lit, datamodule=dm)
    probed = set(probe.probe_steps)
    kept = {step: s for step, s in timer.seconds.items() if step >= SKIP}
    ordinary = [s for step, s in kept.items() if step not in probed]
    probes = [s for step, s in kept.items() if step in probed]
    return statistics.median(ordinary) * 1e3, statistics.median(probes) * 1e3


def cpu_model() -> str:
    """The CPU's model name as lscpu gives it (the platform's processor field otherwise)."""
    try:
        listing = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()
    for line in listing.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="attn-only-128,baby-cpu")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/induction-probe.json"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    quiet_lightning()
    measured_on = {**machine(), "cpu_model": cpu_model()}
    rows = []
    for name in args.shapes.split(","):
        base = cfg.replace(
            cfg.preset("baby-cpu"),
            dataset="shakespeare",
            max_steps=args.steps,
            warmup_steps=0,
            eval_interval=10**6,
            eval_iters=1,
            log_interval=10**6,
            **SHAPES[name],
        ).validate()
        for rep in range(args.reps):
            for induction in (True, False):
                ordinary, probe = fit_ms(base, induction)
                row = {
                    "shape": name,
                    "rep": rep,
                    "induction": induction,
                    "ordinary_ms": round(ordinary, 2),
                    "probe_ms": round(probe, 2),
                    "probe_cost": round(probe / ordinary, 3),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    measured_on["load_avg_at_end"] = os.getloadavg()
    command = " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        json.dump({"command": command, "machine": measured_on, "rows": rows}, out, indent=2)
    print(f"\n{measured_on['cpu_model']}, load average {measured_on['load_avg_at_start']}")
    print(summary(rows))
    print(f"wrote {args.out}")
    return 0


def summary(rows: list[dict]) -> str:
    """A Markdown table: per shape, the medians over its fits with and without."""
    lines = [
        "| shape | ordinary step | probe step without / with | probe cost without / with |",
        "|---|---:|---:|---:|",
    ]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        fits = [r for r in rows if r["shape"] == shape]
        ordinary = statistics.median(r["ordinary_ms"] for r in fits)
        without, with_ = ([r for r in fits if r["induction"] is flag] for flag in (False, True))
        probe, cost = (
            [statistics.median(r[key] for r in side) for side in (without, with_)]
            for key in ("probe_ms", "probe_cost")
        )
        lines.append(
            f"| {shape} | {ordinary:.1f} ms | {probe[0]:.1f} / {probe[1]:.1f} ms "
            f"| {cost[0]:.2f} / {cost[1]:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
