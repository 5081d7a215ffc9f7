"""Export cost: one chart as PNG / SVG / HTML / CSV, and the report zip of a few runs.

    .venv/bin/python benchmarks/bench_export.py [--runs 4] [--steps 2000] [--layers 4]

Fills a temporary store with fake runs (tests/fakes.py), times vl-convert
rendering of the Compare page's loss chart in each format (median of --repeats), then
one build_report of all runs. Not a test: numbers for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_store import timed  # (median ms, best ms, CPU ms, len(result))
from blockviz.store import RunStore
from blockviz.views import charts
from blockviz.views.export.render import chart_csv, chart_html, chart_png, chart_svg
from blockviz.views.export.report import build_report
from tests import fakes  # fake runs shaped like real ones (ROOT is on sys.path)


def main(argv: list[str] | None = None) -> int:
    """Populate, time the exports, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(Path(tmp) / "blockviz.db")
        ids = fakes.populate(store, n_runs=args.runs, n_steps=args.steps, n_layer=args.layers)
        frame = store.scalars(ids, names=["train/loss", "val/loss"], max_points=800)
        chart = charts.loss_chart(frame, smoothing=0.6)
        chart_png(chart)  # the first call loads vl-convert's engine
        rows = [
            ("loss chart PNG (2x)", *timed(lambda: chart_png(chart), args.repeats)),
            ("loss chart SVG", *timed(lambda: chart_svg(chart), args.repeats)),
            ("loss chart HTML", *timed(lambda: chart_html(chart), args.repeats)),
            ("loss chart CSV", *timed(lambda: chart_csv(chart), args.repeats)),
            (f"report zip, {args.runs} runs", *timed(lambda: build_report(store, ids), 1)),
        ]
        store.close()

    print(
        f"machine: {platform.machine()} {os.cpu_count()} CPUs, python {platform.python_version()}"
    )
    print(f"runs: {args.runs} fake x {args.steps} steps x {args.layers} layers")
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print()
    print(f"{'export':<24} {'wall s':>7} {'cpu s':>7} {'bytes':>11}")
    for label, wall_ms, _, cpu_ms, size in rows:
        print(f"{label:<24} {wall_ms / 1000:>7.3f} {cpu_ms / 1000:>7.3f} {size:>11,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
