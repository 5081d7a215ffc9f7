"""What checking a store for damage costs readers: `PRAGMA quick_check` at dashboard scale.

    .venv/bin/python benchmarks/bench_quick_check.py [--runs 20] [--steps 5000] [--layers 12]

`runs`, `show`, `export` and the dashboard run `RunStore.check_integrity` once when they open
a store. This fills a temporary store with fake runs (tests/fakes.py, shaped like real
ones) and times that check, three times, with the file's size. Not a test: numbers for
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from blockviz.store import RunStore
from tests import fakes  # fake runs shaped like real ones (the root is on sys.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "blockviz.db"
        with RunStore(path) as store:
            fakes.populate(
                store,
                n_runs=args.runs,
                n_steps=args.steps,
                n_layer=args.layers,
                statuses=("completed",),
            )
        size_mib = path.stat().st_size / 2**20
        for _ in range(3):
            with RunStore(path, readonly=True) as store:
                started = time.perf_counter()
                store.check_integrity()
                print(f"quick_check of {size_mib:.0f} MiB: {time.perf_counter() - started:.3f} s")


if __name__ == "__main__":
    main()
