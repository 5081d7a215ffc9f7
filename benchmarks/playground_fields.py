"""What each of the Playground's eight fields does to an auto-run, flipped alone.

    .venv/bin/python benchmarks/playground_fields.py                 # the Playground's default
    .venv/bin/python benchmarks/playground_fields.py --preset tiny --set n_layer=4 --set lr=0.01
    .venv/bin/python benchmarks/playground_fields.py --fields norm_position,lr --seeds 1

For a base config (a preset, with `--set` overrides; by default the Playground's own
preset) and each seed, it trains the base and every field of `QUICK_FIELDS` flipped alone
(to each value `flips_of` names), each as the Playground's Auto-run trains it:
`views.playground.auto_config` of the config with `--steps` steps (default the Playground's),
through `python -m blockviz train --config` into a temporary store, one torch thread (a
2-core laptop's share: two run slots of one thread each). Then it prints, per field, the
flip, the final-loss gap (flipped minus base, paired by seed) of the recent train loss
(what the chart's solid line ends at) and of the val loss (the dashed line's last point),
each as the mean and the min..max of the per-seed gaps, whether that reads as visible,
and the wall seconds per run (the training process from start to exit) and milliseconds
per training step (the run's recorded training time / steps).

Not a test: it trains (1 + flips) x seeds runs of the config, about 19 s each at the
Playground's default on one core of the dev box. docs/pages.md holds its table.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from blockviz.core import config  # noqa: E402  (after the path: run from a checkout)
from blockviz.core.config import RunConfig  # noqa: E402
from blockviz.core.config_model import ACTIVATIONS, NORM_POSITIONS, NORM_TYPES  # noqa: E402
from blockviz.core.flags import coerce_fields  # noqa: E402
from blockviz.core.presets import PLAYGROUND_PRESET  # noqa: E402
from blockviz.dashboard.config_fields import QUICK_FIELDS  # noqa: E402
from blockviz.views import playground as pg  # noqa: E402

# What each quick field is flipped to: every other choice of a select, the other value of
# a switch, a tenth of the base's learning rate, and half its layers (two more from one).
CHOICES: dict[str, tuple[Any, ...]] = {
    "norm_position": NORM_POSITIONS,
    "norm_type": NORM_TYPES,
    "activation": ACTIVATIONS,
}
VISIBLE_NATS = 0.05  # a gap a learner sees between two curves, when every seed agrees on its sign


def flips_of(base: RunConfig, field: str) -> list[Any]:
    """The values `field` is flipped to from `base`."""
    if field == "lr":
        return [base.train.lr / 10]
    if field == "n_layer":
        layers = base.model.n_layer
        return [layers // 2 if layers > 1 else layers + 2]
    if field in CHOICES:
        return [value for value in CHOICES[field] if value != getattr(base.model, field)]
    return [not getattr(base.model, field)]


@dataclass(frozen=True)
class Result:
    """One run's final losses, its wall time and its time per step."""

    train_loss: float
    val_loss: float
    wall_s: float
    step_ms: float


def train(run_config: RunConfig, folder: Path, threads: int) -> Result:
    """Train `run_config` as an auto-run would, in its own process; its final numbers."""
    from blockviz.store import RunStore

    folder.mkdir(parents=True)
    config_path = folder / "run.json"
    config_path.write_text(run_config.to_json())
    store_path = folder / "blockviz.db"
    command = [sys.executable, "-m", "blockviz", "train", "--config", str(config_path)]
    command += ["--store", str(store_path), "--threads", str(threads), "--no_progress"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if done.returncode:  # said at the end, beside the table, instead of losing the others
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"{folder.name}: exit {done.returncode}: {last}", file=sys.stderr)
        return Result(math.nan, math.nan, wall, math.nan)
    with RunStore(store_path) as store:
        final = store.get_run(1).final or {}
    steps = final.get("steps") or run_config.train.max_steps
    return Result(
        float(final.get("train_loss") or "nan"),
        float(final.get("val_loss") or "nan"),
        wall,
        1000 * float(final.get("time_s") or "nan") / steps,
    )


def gap_text(gaps: list[float]) -> str:
    """'+0.412 (0.37..0.45)': the mean of the per-seed gaps and their min..max."""
    if len(gaps) == 1:
        return f"{gaps[0]:+.3f}"
    return f"{statistics.fmean(gaps):+.3f} ({min(gaps):+.2f}..{max(gaps):+.2f})"


def visible(gaps: list[float]) -> bool:
    """Whether every seed's gap has one sign and is at least VISIBLE_NATS."""
    return all(g >= VISIBLE_NATS for g in gaps) or all(g <= -VISIBLE_NATS for g in gaps)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=PLAYGROUND_PRESET, help="the base config's preset")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a field over it"
    )
    parser.add_argument("--steps", type=int, default=pg.DEFAULT_STEPS, help="steps per auto-run")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument("--fields", default=",".join(QUICK_FIELDS), help="the fields to flip")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once")
    return parser.parse_args()


def main() -> int:
    args = parse()
    pairs = tuple(tuple(item.split("=", 1)) for item in args.set)
    if any(len(pair) != 2 for pair in pairs):
        raise SystemExit("--set takes FIELD=VALUE")
    base = config.replace(config.preset(args.preset), **coerce_fields(pairs, list(config.SECTIONS)))
    seeds = [int(s) for s in args.seeds.split(",")]
    fields = [f for f in args.fields.split(",") if f]
    unknown = [f for f in fields if f not in QUICK_FIELDS]
    if unknown:
        raise SystemExit(f"--fields: {', '.join(unknown)} not among {', '.join(QUICK_FIELDS)}")
    variants: dict[str, tuple[str, RunConfig]] = {"base": ("", base)}
    for field in fields:
        old = getattr(getattr(base, config.section_of(field)), field)
        for value in flips_of(base, field):
            key = f"{field}={value}"
            variants[key] = (f"{old} -> {value}", config.replace(base, **{field: value}))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"base: preset {args.preset} {' '.join(args.set)}; {args.steps} steps; seeds {seeds}")
    print(f"load average at start: {load}")
    jobs: dict[tuple[str, int], Any] = {}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        for seed in seeds:
            for key, (_, run_config) in variants.items():
                auto = pg.auto_config(config.replace(run_config, seed=seed), args.steps)
                folder = Path(tmp) / f"{key}-{seed}"
                jobs[key, seed] = pool.submit(train, auto, folder, args.threads)
        results = {job: future.result() for job, future in jobs.items()}
    base_rows = [results["base", s] for s in seeds]
    walls = [r.wall_s for r in base_rows]
    print(
        f"base: train {statistics.fmean(r.train_loss for r in base_rows):.3f}, "
        f"val {statistics.fmean(r.val_loss for r in base_rows):.3f}; "
        f"{statistics.fmean(walls):.1f} s a run, "
        f"{statistics.fmean(r.step_ms for r in base_rows):.1f} ms a step"
    )
    print("gap = flipped - base, paired by seed: mean (min..max over the seeds)")
    header = ("field", "flip", "train-loss gap", "val-loss gap", "visible", "s/run", "ms/step")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for key in list(variants)[1:]:
        rows = [results[key, s] for s in seeds]
        train_gaps = [r.train_loss - b.train_loss for r, b in zip(rows, base_rows, strict=True)]
        val_gaps = [r.val_loss - b.val_loss for r, b in zip(rows, base_rows, strict=True)]
        cells = (
            key.split("=")[0],
            variants[key][0],
            gap_text(train_gaps),
            gap_text(val_gaps),
            "yes" if visible(train_gaps) and visible(val_gaps) else "no",
            f"{statistics.fmean(r.wall_s for r in rows):.1f}",
            f"{statistics.fmean(r.step_ms for r in rows):.1f}",
        )
        print("| " + " | ".join(cells) + " |")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
