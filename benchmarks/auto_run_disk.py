"""What one Playground auto-run leaves on disk, now and as it was before auto-runs stopped
keeping fork points (issue 35, defect 14).

    .venv/bin/python benchmarks/auto_run_disk.py                       # the Playground's start
    .venv/bin/python benchmarks/auto_run_disk.py --preset baby-cpu --steps 300

Trains the preset as the Playground's Auto-run does (`views.playground.auto_config`, in
`python -m blockviz train --config`, one thread) twice into a temporary store: as now
(`ckpt_interval` 0: last.ckpt and best.ckpt only) and as before (the preset's own
`ckpt_interval` and `ckpt_keep`, so step-N.ckpt fork points too), and prints each run
folder's bytes and its checkpoints' (`core.disk`, what the Runs page and `show` print).
Not a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from blockviz.core import config, disk, forks  # noqa: E402  (after the path)
from blockviz.core.presets import PLAYGROUND_PRESET  # noqa: E402
from blockviz.store import RunStore  # noqa: E402
from blockviz.views import playground as pg  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=PLAYGROUND_PRESET)
    parser.add_argument("--steps", type=int, default=pg.DEFAULT_STEPS)
    args = parser.parse_args()
    sidebar = config.preset(args.preset)
    now = pg.auto_config(sidebar, args.steps)
    before = config.replace(now, ckpt_interval=sidebar.train.ckpt_interval)
    with tempfile.TemporaryDirectory() as tmp:
        store_path = Path(tmp) / "blockviz.db"
        for label, run_config in (("now", now), ("before", before)):
            config_path = Path(tmp) / f"{label}.json"
            config_path.write_text(run_config.to_json())
            command = [sys.executable, "-m", "blockviz", "train", "--config", str(config_path)]
            command += ["--store", str(store_path), "--threads", "1", "--no_progress"]
            command += ["--name", label]
            subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=1800)
            with RunStore(store_path) as store:
                run_dir = store.run_dir(store.get_run(label).id)
            print(
                f"{args.preset}, {args.steps} steps, {label} "
                f"(ckpt_interval {run_config.train.ckpt_interval}): "
                f"folder {disk.size_text(disk.folder_bytes(run_dir))}, checkpoints "
                f"{disk.size_text(disk.checkpoint_bytes(run_dir))} "
                f"(kept steps: {forks.steps_text(forks.kept_steps(run_dir))})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
