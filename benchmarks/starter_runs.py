"""Re-run README's "Three runs to start with" (and its fork of the second) and check each
stated outcome.

    .venv/bin/python benchmarks/starter_runs.py            # about a minute on 2 CPU cores

Each row of that table names a command and what it measured; this script runs the same
commands (into a temporary store) and prints the measured outcome beside the stated one,
with the run's findings (the headline must begin as README says), exiting 1 when one no
longer holds. Not a test: it trains three 300-step runs and a 200-step fork.
"""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Starter:
    """One README row: its flags and what README says it does."""

    label: str
    flags: tuple[str, ...]
    status: str  # the run's final status
    val_loss: float | None = None  # final validation loss, as README rounds it
    diverged_step: int | None = None
    headline: str = ""  # how the findings' headline begins (Live, `blockviz show`)
    command: tuple[str, ...] = ("train",)  # the blockviz command that trains it


# The thread count moves the last digit (float sums in another order: round two's windows
# gave 2.183 with two threads and 2.194 with one on the dev box), so a stated loss holds
# within this margin. On the evaluation set, with the default one thread there: 2.151.
VAL_TOLERANCE = 0.015
BASE = ("--preset", "baby-cpu", "--warmup_steps", "0", "--max_steps", "300")
STARTERS = (
    Starter(
        "Pre-LN, no warm-up, lr 0.01",
        (*BASE, "--lr", "0.01", "--name", "pre-starter"),
        "completed",
        val_loss=2.15,
        headline="Trains",
    ),
    Starter(
        "Post-LN, the same",
        (*BASE, "--norm_position", "post", "--lr", "0.01", "--name", "post-starter"),
        "completed",
        val_loss=3.26,
        headline="Stalled at the unigram entropy since step",
    ),
    Starter(
        "no norms, no clipping, lr 0.1",
        (
            *BASE,
            *("--norm_position", "none", "--grad_clip", "0", "--lr", "0.1"),
            *("--name", "no-norm-starter"),
        ),
        "diverged",
        diverged_step=2,
        headline="Diverged at step 2",
    ),
    # README's "Which choice caused it": the stalled Post-LN run forked to Pre-LN.
    Starter(
        "post-starter forked at 100 to Pre-LN",
        ("--step", "100", "--norm_position", "pre"),
        "completed",
        val_loss=2.30,
        headline="Trains",
        command=("fork", "post-starter"),
    ),
)


def main() -> int:
    """Run every starter, compare, print; 1 if any stated outcome does not hold."""
    from blockviz.store import RunStore
    from blockviz.views.run_findings import plain_lines, read_findings

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        store_path = Path(tmp) / "blockviz.db"
        for run_id, starter in enumerate(STARTERS, start=1):  # a fresh store: ids 1, 2, 3, 4
            command = [sys.executable, "-m", "blockviz", *starter.command, *starter.flags]
            command += ["--store", str(store_path), "--no_progress"]
            subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=900)
            with RunStore(store_path) as store:
                run = store.get_run(run_id)
                found = read_findings(store, run)
            val_loss = (run.final or {}).get("val_loss")
            holds = run.status == starter.status
            if starter.val_loss is not None:
                close = val_loss is not None and abs(val_loss - starter.val_loss) <= VAL_TOLERANCE
                holds = holds and close
            if starter.diverged_step is not None:
                holds = holds and run.diverged_step == starter.diverged_step
            holds = holds and found.headline.title.startswith(starter.headline)
            failures += not holds
            measured = f"{run.status}"
            if val_loss is not None and math.isfinite(val_loss):
                measured += f", val loss {val_loss:.4f}"
            if run.diverged_step is not None:
                measured += f" at step {run.diverged_step}"
            stated = starter.status + (
                f", val loss {starter.val_loss}" if starter.val_loss is not None else ""
            )
            stated += f" at step {starter.diverged_step}" if starter.diverged_step else ""
            verdict = "holds" if holds else "DOES NOT HOLD"
            print(f"{starter.label:<32} README: {stated:<28} measured: {measured:<32} {verdict}")
            for line in plain_lines(found):  # what Live's findings panel and `show` say
                print(f"    {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
