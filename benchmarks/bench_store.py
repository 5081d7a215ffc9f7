"""Run-store read speed at dashboard scale: 20 runs x 5,000 steps x 12 layers.

    .venv/bin/python benchmarks/bench_store.py [--runs 20] [--steps 5000] [--layers 12]

Fills a temporary store with fake runs (tests/fakes.py), then times the reads a
Live page and a Compare page make. Each read is repeated; the table shows the median and
the best time in milliseconds and the rows returned. Not a test: numbers for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blockviz.store import RunStore
from tests import fakes  # fake runs shaped like real ones (ROOT is on sys.path)


def timed(read: Callable[[], object], repeats: int) -> tuple[float, float, float, int]:
    """Median and best wall time, median CPU time (ms) of `read`, and its result's length."""
    wall, cpu, size = [], [], 0
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = read()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
        size = len(result)  # type: ignore[arg-type]
    return statistics.median(wall), min(wall), statistics.median(cpu), size


def main(argv: list[str] | None = None) -> int:
    """Populate, time the page reads, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "blockviz.db"
        store = RunStore(path)
        start, start_cpu = time.perf_counter(), time.process_time()
        # Every run completed: each one has all max_steps, the largest store at this scale.
        ids = fakes.populate(
            store,
            n_runs=args.runs,
            n_steps=args.steps,
            n_layer=args.layers,
            statuses=("completed",),
        )
        populate_s = time.perf_counter() - start
        populate_cpu_s = time.process_time() - start_cpu
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size_mb = os.path.getsize(path) / 1e6
        counts = {
            table: store.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
            for table in ("scalars", "layer_stats", "histograms", "attention")
        }
        store.close()

        # A fresh connection, as a dashboard process would have.
        reader = RunStore(path)
        one = ids[0]
        reads: list[tuple[str, Callable[[], object]]] = [
            ("runs_frame()", reader.runs_frame),
            ("reap_dead()", reader.reap_dead),
            ("final_metrics(20 runs)", lambda: reader.final_metrics(ids)),
            (
                "scalars(20 runs, train+val loss, max_points=500)",
                lambda: reader.scalars(ids, names=["train/loss", "val/loss"], max_points=500),
            ),
            (
                "scalars(20 runs, all names, max_points=500)",
                lambda: reader.scalars(ids, max_points=500),
            ),
            (
                "layer_stats(20 runs, component grad_norm, step=0)",
                lambda: reader.layer_stats(ids, kind="component", stat="grad_norm", step=0),
            ),
            (
                "layer_stats(20 runs, component grad_norm, all steps)",
                lambda: reader.layer_stats(ids, kind="component", stat="grad_norm"),
            ),
            ("layer_steps(1 run, kind=component)", lambda: reader.layer_steps(one, "component")),
            (
                "scalars(1 run, all names, max_points=500)",
                lambda: reader.scalars(one, max_points=500),
            ),
            (
                "layer_stats(1 run, kind=tap, max_points=200)",
                lambda: reader.layer_stats(one, kind="tap", max_points=200),
            ),
            (
                "layer_stats(1 run, component grad_norm, max_points=200)",
                lambda: reader.layer_stats(one, kind="component", stat="grad_norm", max_points=200),
            ),
            (
                "scalars(1 run, after_step=4900) (live refresh)",
                lambda: reader.scalars(one, after_step=args.steps - 100),
            ),
            (
                "histograms(1 run, layer 0, resid_post)",
                lambda: reader.histograms(one, 0, "resid_post"),
            ),
            ("attention(1 run, latest step)", lambda: reader.attention(one)),
        ]
        results = [(label, *timed(read, args.repeats)) for label, read in reads]
        reader.close()

    print(f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs,")
    print(f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}")
    print(f"store: {args.runs} runs x {args.steps} steps x {args.layers} layers, {size_mb:.1f} MB")
    print("rows: " + ", ".join(f"{table} {count:,}" for table, count in counts.items()))
    print(f"populate: {populate_s:.1f} s wall, {populate_cpu_s:.1f} s CPU")
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print()
    width = max(len(label) for label, *_ in results)
    print(f"{'read':<{width}}  {'median ms':>9}  {'best ms':>8}  {'cpu ms':>7}  {'rows':>7}")
    for label, median_ms, best_ms, cpu_ms, rows in results:
        print(f"{label:<{width}}  {median_ms:>9.1f}  {best_ms:>8.1f}  {cpu_ms:>7.1f}  {rows:>7,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
