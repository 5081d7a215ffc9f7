"""Real tiny runs that each show what a findings rule looks for, trained once per session.

Like tests/real_runs.py: `python -m blockviz train`'s own entry point, every run in one
subprocess with one CPU thread, into a store of their own. Each config was chosen by
training it and reading what it did (BENCHMARKS.md, "Findings"), not by what the
literature says it should do; the tests assert what these runs of this code show.

They take about 30 s of one core: conftest's `finding_runs` trains them when the first test
asks (collecting alone starts nothing), once per test run, however many pytest-xdist
workers ask.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from blockviz.store import RunStore
from tests.real_runs import TRAIN_ALL

ROOT = Path(__file__).resolve().parent.parent
# Two of README's three starter runs, cut short: the Post-LN stall starts by step 10 and
# the divergence comes at step 2, so 120 and 10 steps show them.
STARTER = ("--preset", "baby-cpu", "--warmup_steps", "0")
# Tiny runs: probes every 10 steps, a few validation batches, no samples to speak of.
TINY = (
    *("--preset", "tiny", "--eval_interval", "50", "--eval_iters", "4"),
    *("--probe_interval", "10", "--sample_interval", "1000"),
)
CONSTANT = ("--warmup_steps", "0", "--lr_schedule", "constant")
# label -> flags; {spiky} and {small} are text files this module writes.
RUNS: dict[str, tuple[str, ...]] = {
    "starter-post": (*STARTER, "--norm_position", "post", "--lr", "0.01", "--max_steps", "120"),
    "starter-none": (
        *STARTER,
        *("--norm_position", "none", "--grad_clip", "0", "--lr", "0.1", "--max_steps", "10"),
    ),
    "healthy": (*TINY, "--max_steps", "300", "--lr", "3e-3", "--warmup_steps", "30"),
    "relu": (*TINY, *CONSTANT, "--max_steps", "300", "--activation", "relu", "--lr", "0.1"),
    # lr 1 with the default weight decay 0.1: decay alone takes a tenth of every matrix
    # each step, besides AdamW's own step.
    "lr-1": (*TINY, *CONSTANT, "--max_steps", "60", "--lr", "1.0"),
    "blow-up": (
        *TINY,
        *("--max_steps", "30", "--norm_position", "none", "--grad_clip", "0", "--lr", "0.3"),
        *("--warmup_steps", "0", "--probe_interval", "5"),
    ),
    "spiky": (
        *TINY,
        *("--max_steps", "300", "--lr", "3e-3", "--warmup_steps", "20", "--dataset", "{spiky}"),
    ),
    # lr 0.1 without decay: down to 3.1 by step 100, then no lower (pydocs' unigram entropy is
    # 3.25); the same lr with its cosine decay, or 3× lower, keeps learning.
    "plateau": (*TINY, *CONSTANT, "--max_steps", "400", "--lr", "0.1"),
    "overfit": (
        *TINY,
        *("--max_steps", "600", "--d_model", "64", "--lr", "3e-3", "--weight_decay", "0"),
        *("--dataset", "{small}", "--eval_interval", "25"),
    ),
}


def noisy_repeat(line: str, seed: int) -> str:
    """One line repeated, with a block of random symbols a third of the way in: once the
    model knows the line, a batch that draws from the block costs far more."""
    rng = random.Random(seed)
    body = line * 400
    noise = "".join(rng.choice("0123456789#$%&*+=<>?@^~") for _ in range(600))
    cut = len(body) // 3
    return body[:cut] + noise + body[cut:]


def spiky_text() -> str:
    """The spiky run's text: a sentence repeated, with a block of random symbols."""
    return noisy_repeat("the cat sat on the mat and the dog sat on the log.\n", seed=0)


def small_text() -> str:
    """The first 3,000 characters of pydocs: small enough for 600 steps to memorise."""
    import pydoc_data.topics as topics

    return "".join(topics.topics[key] for key in sorted(topics.topics))[:3000]


@dataclass(frozen=True)
class FindingRuns:
    """The store of the runs, the id of each label, and the training time."""

    path: Path
    ids: dict[str, int]
    seconds: float


def train_finding_runs(folder: Path) -> FindingRuns:
    """Write the text files and train every run of RUNS into folder/findings.db."""
    files = {"spiky": folder / "spiky.txt", "small": folder / "small.txt"}
    files["spiky"].write_text(spiky_text(), encoding="utf-8")
    files["small"].write_text(small_text(), encoding="utf-8")
    commands = [
        [
            *(flag.format(**{k: str(v) for k, v in files.items()}) for flag in flags),
            *("--store", str(folder / "findings.db"), "--accelerator", "cpu", "--no_progress"),
            *("--name", label),
        ]
        for label, flags in RUNS.items()
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BLOCKVIZ_CACHE": str(folder / "cache")}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", TRAIN_ALL, json.dumps(commands)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=600,
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"training the findings runs failed:\n{result.stderr[-3000:]}")
    path = folder / "findings.db"
    with RunStore(path, readonly=True) as store:
        runs = store.runs_frame()
    ids = {name: int(run_id) for name, run_id in zip(runs["name"], runs["id"], strict=True)}
    if set(ids) != set(RUNS):
        raise RuntimeError(f"expected runs {sorted(RUNS)} in {path}, found {sorted(ids)}")
    return FindingRuns(path, ids, seconds)
