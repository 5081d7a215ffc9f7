"""Real tiny runs for tests: trained once per session by blockviz itself, then copied.

`train_real_runs` trains RUNS with `python -m blockviz train`'s own entry point, all in one
subprocess (one torch import, no training state left in the test process), into a store
of their own. Tests never write that store: `copy_run` adds one of its runs to a test's
store (same run row, same rows, same small files), and `as_running` turns such a copy
into a run still training, the way it looked partway through.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from blockviz.core import procs
from blockviz.store import RunStore
from tests.fakes import CORPUS, CORPUS_NAME

ROOT = Path(__file__).resolve().parent.parent
# Tiny and quick, with probe, eval and sample steps on different grids, so a test that
# mixes them up fails: probes at 0, 10, 20; validation at 15, 30; samples at 0, 20, 30.
COMMON_FLAGS = (
    *("--preset", "tiny", "--max_steps", "30", "--accelerator", "cpu", "--no_progress"),
    *("--probe_interval", "10", "--eval_interval", "15", "--sample_interval", "20"),
)
# label -> the flags that make the run what it is; trained in this order (ids 1, 2, ...).
RUNS = {
    "pre": (),
    "post": ("--norm_position", "post"),
    "ffn_only": ("--attention", "false", "--tie_weights", "true"),
    # lr 10 without warm-up, clipping or norms: the loss is non-finite at step 1, a probe
    # step here (what a diverged step still records is part of the shape).
    "diverged": (
        *("--lr", "10", "--warmup_steps", "0", "--grad_clip", "0", "--norm_position", "none"),
        *("--n_layer", "6", "--activation", "relu", "--probe_interval", "1"),
    ),
}
# The train commands of a JSON list, one after another in one process (one torch import).
TRAIN_ALL = """
import json, sys
from blockviz import cli
for flags in json.loads(sys.argv[1]):
    code = cli.main(["train", *flags])
    if code:
        sys.exit(f"blockviz train {' '.join(flags)} exited {code}")
"""
# What a copy takes along of a run's folder (checkpoints are large and no page reads them).
_RUN_FILES = ("config.json", "vocab.json", "train.log")
# Each table's columns after run_id, in the order RunStore.restore_rows takes them.
_COLUMNS = {
    "scalars": "step, name, value",
    "layer_stats": "step, layer, kind, component, stat, value",
    "histograms": "step, layer, tap, lo, hi, counts",
    "samples": "step, prompt, text",
    "attention": "step, layer, head, tokens, weights",
}


@dataclass(frozen=True)
class RealRuns:
    """A store of real runs: its file, the id of each RUNS label, and the training time."""

    path: Path
    ids: dict[str, int]
    seconds: float


def train_real_runs(folder: Path) -> RealRuns:
    """Train every run of RUNS into folder/real.db (a few seconds on one CPU core)."""
    corpus = folder / CORPUS_NAME
    corpus.write_text(CORPUS, encoding="utf-8")
    path = folder / "real.db"
    where = ("--dataset", str(corpus), "--store", str(path))
    # Short names, so a legend shows them whole.
    commands = [
        [*COMMON_FLAGS, *flags, *where, "--name", f"real-{label}"] for label, flags in RUNS.items()
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BLOCKVIZ_CACHE": str(folder / "cache")}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", TRAIN_ALL, json.dumps(commands)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"training the real test runs failed:\n{result.stderr[-3000:]}")
    with RunStore(path, readonly=True) as store:
        ids = sorted(store.runs_frame()["id"].tolist())
    if len(ids) != len(RUNS):
        raise RuntimeError(f"expected {len(RUNS)} real runs in {path}, found {len(ids)}")
    return RealRuns(path, dict(zip(RUNS, ids, strict=True)), seconds)


def copy_run(store: RunStore, source: Path, run_id: int) -> int:
    """Add run `run_id` of the store file `source` to `store`; its id there.

    The run row (name made unique), every metric row and the small files of its folder
    come along unchanged; `source` is only read.
    """
    with RunStore(source, readonly=True) as real:
        run = real.get_run(run_id)
        rows = {
            table: [
                list(row)
                for row in real.conn.execute(
                    f"SELECT {columns} FROM {table} WHERE run_id = ?", (run_id,)
                )
            ]
            for table, columns in _COLUMNS.items()
        }
        folder = real.run_dir(run_id)
    fields = {k: v for k, v in run.to_dict().items() if k not in ("id", "name", "config", "status")}
    new_id = store.create_run(run.name, run.config, status=run.status, **fields)
    store.restore_rows(new_id, rows)
    target = store.run_dir(new_id)
    target.mkdir(parents=True, exist_ok=True)
    for name in _RUN_FILES:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, target / name)
    return new_id


def as_running(store: RunStore, run_id: int, step: int) -> None:
    """Make a finished run look as it did while training at `step`, in this process.

    Its rows after `step` go, its end and final metrics are cleared, and it names this
    process (alive) as its own with a fresh heartbeat.
    """
    store.truncate_after(run_id, step)
    me = procs.identity_of()
    store.update_run(
        run_id,
        status="running",
        ended=None,
        final=None,
        step=step,
        pid=os.getpid(),
        pid_started=me.started if me else None,
        heartbeat=time.time(),
    )
    store.flush()
