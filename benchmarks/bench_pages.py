"""Server time of each dashboard page against a store of 20 runs x 5,000 steps x 12 layers.

    .venv/bin/python benchmarks/bench_pages.py [--runs 20] [--steps 5000] [--layers 12]
    .venv/bin/python benchmarks/bench_pages.py --store /tmp/big.db
    .venv/bin/python benchmarks/bench_pages.py --store 'postgresql://me@127.0.0.1:5432/db?runs=/tmp/ws'

Fills a temporary store with fake runs (tests/fakes.py, every one completed, so
each holds all its steps), then runs app.py through Streamlit's AppTest and times one
script run of each page: the sidebar plus the page, everything the server does for a
browser's rerun except sending the result over the websocket. Compare overlays all runs.
The first run of a page (imports, cold caches) is reported apart from the warm reruns a
user's clicks cause. `--store` (a file path or a postgresql:// URL, as $BLOCKVIZ_STORE
takes) times the pages on that store's runs; an empty store (a new file, a fresh database)
is filled with the fakes first. `--json PATH` also writes the numbers there. Not a test:
numbers for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAGES = ("pages/train.py", "pages/live.py", "pages/compare.py", "pages/runs.py")
LIVE_TABS = ("Loss", "Gradients", "Activations", "Updates", "Attention", "Samples")


def main(argv: list[str] | None = None) -> int:
    """Populate a store, time every page, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--store",
        help="time the pages on this store (a file path or a postgresql:// URL): its runs, "
        "or the fakes written into it when it has none",
    )
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["BLOCKVIZ_STORE"] = args.store or str(Path(tmp) / "blockviz.db")
        os.chdir(ROOT)
        # Imported after the environment is set: the app reads BLOCKVIZ_STORE.
        from streamlit.testing.v1 import AppTest

        from blockviz.dashboard import ui
        from blockviz.store import RunStore
        from tests import fakes  # fake runs shaped like real ones

        store = RunStore(os.environ["BLOCKVIZ_STORE"])
        ids = store.runs_frame()["id"].tolist() if args.store else []
        filled_s: float | None = None
        if not ids:
            start = time.perf_counter()
            ids = fakes.populate(
                store,
                n_runs=args.runs,
                n_steps=args.steps,
                n_layer=args.layers,
                statuses=("completed",),
            )
            filled_s = time.perf_counter() - start
        store.close()

        rows = []
        cases = [(page, None) for page in PAGES if page != "pages/live.py"]
        cases[1:1] = [("pages/live.py", tab) for tab in LIVE_TABS]
        for page, tab in cases:
            at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
            at.session_state[ui.RUN_KEY] = ids[-1]
            at.session_state[ui.COMPARE_KEY] = list(ids)
            if tab is not None:
                at.session_state["live.tab"] = tab  # Live draws only its open tab
            start = time.perf_counter()
            at.run()
            if page != "pages/train.py":
                at.switch_page(page)
                start = time.perf_counter()  # the app's first run has warmed the imports
                at.run()
            first = time.perf_counter() - start
            if at.exception or at.error:
                raise SystemExit(f"{page} {tab}: {[e.value for e in [*at.exception, *at.error]]}")
            warm, cpu = [], []
            for _ in range(args.repeats):
                start, start_cpu = time.perf_counter(), time.process_time()
                at.run()
                warm.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
            label = page if tab is None else f"{page} [{tab}]"
            charts = len(at.get("vega_lite_chart"))
            rows.append(
                (label, first, statistics.median(warm), min(warm), statistics.median(cpu), charts)
            )

    print(
        f"machine: {platform.machine()} {os.cpu_count()} CPUs, python {platform.python_version()}"
    )
    shape = f"{args.runs} runs x {args.steps} steps x {args.layers} layers (completed)"
    if args.store and filled_s is None:
        print(f"store: {args.store} ({len(ids)} runs)")
    else:
        print(f"store: {args.store or 'a temporary file'}, {shape}")
    if filled_s is not None:
        print(f"filled in {filled_s:.1f} s")
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print()
    print(
        f"{'page':<34} {'first s':>8} {'warm median s':>14} {'warm best s':>12} "
        f"{'cpu s':>6} {'charts':>6}"
    )
    for page, first, median, best, cpu, charts in rows:
        print(f"{page:<34} {first:>8.3f} {median:>14.3f} {best:>12.3f} {cpu:>6.3f} {charts:>6}")
    if args.json:
        fields = ("page", "first_s", "warm_median_s", "warm_best_s", "cpu_s", "charts")
        result = {
            "store": args.store,
            "runs": len(ids),
            "filled_s": filled_s,
            "shape": shape if filled_s is not None else None,
            "repeats": args.repeats,
            "load": [round(x, 2) for x in os.getloadavg()],
            "pages": [dict(zip(fields, row, strict=True)) for row in rows],
        }
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
