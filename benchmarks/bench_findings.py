"""Time of the findings engine on a long run: the rules alone, and with the store reads.

    .venv/bin/python benchmarks/bench_findings.py [--steps 5000] [--layers 4] [--repeats 20]

Writes one fake completed run (tests/fakes.py: a loss every step, probes every 50 steps,
every statistic a real run records) into a temporary store, then times
`core.findings.evaluate` + `headline` on frames already read (the rules alone), and
`views.run_findings.read_findings` (the store reads of Live, `show`, Compare and the report,
then the rules). Prints the medians. Not a test.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _median_ms(action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Write the run, time both paths, print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)

    from blockviz.core import findings
    from blockviz.core.findings.base import run_series
    from blockviz.core.findings.training import headline
    from blockviz.store import RunStore
    from blockviz.views import run_findings
    from tests import fakes

    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(Path(tmp) / "blockviz.db")
        config = fakes.fake_config(
            max_steps=args.steps, n_layer=args.layers, log_interval=1, probe_interval=50
        )
        run_id = fakes.add_run(store, config, "completed")
        store.flush()
        run = store.get_run(run_id)
        scalars = store.scalars(run_id, names=run_findings.SCALARS)
        layers = run_findings.read_layers(store, run_id)

        def rules_only() -> None:
            series = run_series(run, scalars, layers)
            headline(series, findings.evaluate(series))

        rules_ms = _median_ms(rules_only, args.repeats)
        read_ms = _median_ms(lambda: run_findings.read_findings(store, run), args.repeats)
        store.close()
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {load[0]:.2f}")
    print(
        f"run: {args.steps:,} steps (a loss each), {args.layers} layers, probes every 50: "
        f"{len(scalars):,} scalar rows and {len(layers):,} layer rows read"
    )
    print(f"the rules on frames in memory:       {rules_ms:.1f} ms (median of {args.repeats})")
    print(f"store reads + rules (Live, show, ...): {read_ms:.1f} ms (median of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
