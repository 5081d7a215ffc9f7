"""What kept checkpoints and a replay cost: disk per run, and a replay against its span.

    .venv/bin/python benchmarks/forks_cost.py      # about 1.5 minutes on 2 CPU cores

1. Disk: a default run (the default config, Tiny Shakespeare, 300 steps) and the size of
   each checkpoint it keeps; what a default 2,000-step run keeps follows from the thinning
   rule (`core.forks.thinned`), each one the size measured.
2. Replay: the no-norm run of docs/forks.md (lr 6e-3, no warm-up, no clipping, constant
   lr), which spikes and diverges on Tiny Shakespeare; `replay` around its largest loss
   spike. Reported: the replay's training seconds against the seconds the parent spent
   on the same steps (both from train/elapsed_s), the replay command's wall time (process
   start, data, analysis), and what it named.

Needs Tiny Shakespeare in the download cache (or the network once). One thread per run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPIKY = (
    *("--dataset", "shakespeare", "--norm_position", "none", "--lr", "6e-3"),
    *("--warmup_steps", "0", "--grad_clip", "0", "--lr_schedule", "constant"),
    *("--max_steps", "1500"),
)


def blockviz(store: Path, *args: str) -> float:
    """Run `python -m blockviz ARGS --store STORE`, one thread; its wall seconds."""
    command = [sys.executable, "-m", "blockviz", *args, "--store", str(store)]
    command += ["--threads", "1", "--no_progress"]
    began = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=False, capture_output=True, timeout=1800)
    return time.perf_counter() - began


def main() -> int:
    from blockviz.core import forks
    from blockviz.core.spec import TRAIN_ELAPSED_S
    from blockviz.store import RunStore

    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        store_path = Path(tmp) / "runs.db"
        blockviz(store_path, "train", "--dataset", "shakespeare", "--max_steps", "300")
        with RunStore(store_path, readonly=True) as store:
            run_dir = store.run_dir(1)
            sizes = {
                s: forks.kept_path(run_dir, s).stat().st_size for s in forks.kept_steps(run_dir)
            }
            n_params = store.get_run(1).n_params
        one = max(sizes.values())
        steps: list[int] = []
        every = 100
        for step in range(100, 2001, 100):
            if step % every == 0:
                steps.append(step)
                every, dropped = forks.thinned(steps, every, 8)
                steps = [s for s in steps if s not in dropped]
        print(f"default model: {n_params:,} parameters; one kept checkpoint {one / 1e6:.2f} MB")
        print(f"a default 2,000-step run keeps {steps}: {len(steps) * one / 1e6:.1f} MB")
        print(f"(at most ckpt_keep 8: {8 * one / 1e6:.1f} MB; last.ckpt and best.ckpt besides)")

        blockviz(store_path, "train", *SPIKY, "--name", "spiky")
        wall = blockviz(store_path, "replay", "spiky")  # its divergence: a short span
        with RunStore(store_path, readonly=True) as store:
            first = store.twins_of("spiky", "replay")[-1]
        # A step just before that replay's start: the replay starts one kept step earlier.
        around = int(first.fork_step) - 9
        walls = [wall, blockviz(store_path, "replay", "spiky", "--around", str(around))]
        with RunStore(store_path, readonly=True) as store:
            parent = store.scalars("spiky", TRAIN_ELAPSED_S).set_index("step")["value"]
            for replay, wall in zip(store.twins_of("spiky", "replay"), walls, strict=True):
                ours = store.scalars(int(replay.id), TRAIN_ELAPSED_S).set_index("step")["value"]
                start = int(replay.fork_step)
                ours = ours[ours.index >= start]
                last = int(ours.index.max())
                span = float(parent.loc[last] - parent.loc[start - 1])
                info = replay.fork_info or {}
                print(f"replay around the {info.get('event')} at {info.get('event_step')}:")
                print(
                    f"  steps {start}-{last}: {ours.loc[last]:.2f} s training against "
                    f"{span:.2f} s in the parent ({ours.loc[last] / span:.2f}x); the command "
                    f"took {wall:.1f} s"
                )
                print(f"  it named: {info.get('sentence')}")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
