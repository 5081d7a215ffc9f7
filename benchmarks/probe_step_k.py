"""What a probe step costs for K replicas: the probe's own time at each probe step, for a
solo run (K = 1) and batches of K, through the real `train` path.

    .venv/bin/python benchmarks/probe_step_k.py [--ks 1,8,32] [--steps 41]
        [--probe-interval 4] [--threads 1] [--out benchmarks/results/probe-step-k.json]

Each K trains `--steps` steps of a tiny model (n_layer 2, d_model 32, block 32, batch 4,
the tiny preset otherwise) on the test corpus, probes every `--probe-interval` steps and
samples only at step 0 and the end. The probe's time at a probe step is the wall time of
`BlockProbe.on_before_optimizer_step` plus `on_train_batch_end` at that step (the probe
forward, the norms, the one transfer, the rows handed to the store's buffer): what the
step costs beyond an ordinary one; beside it the CPU time of the thread in those hooks.
Step 0 (also a sample step) is left out; the median and mean of the others are printed.
Run it from a checkout to time that checkout's code (the same script from two checkouts
compares them). `--ops` counts the tensor operations of those hooks at a probe step
instead (each a kernel launch on a GPU; a count does not depend on the machine's load).
Not a test: numbers for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from blockviz.core import config as cfg  # noqa: E402
from blockviz.core.plans import Member, Plan  # noqa: E402
from blockviz.core.requests import Session  # noqa: E402
from blockviz.training import probes  # noqa: E402
from blockviz.training.train import train  # noqa: E402
from tests.fakes import CORPUS  # noqa: E402


class OpCount(TorchDispatchMode):
    """Counts the tensor operations (aten calls, each a kernel launch on a GPU) run inside."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def timed_probe(count_ops: bool) -> tuple[dict[int, float], dict[int, float]]:
    """Wrap the probe's two per-step hooks; {step: seconds} of their wall time at each
    step (or with `count_ops` {step: tensor operations}: slower, not a timing), and
    {step: seconds} of the CPU time of their thread (less disturbed by a busy machine)."""
    spent: dict[int, float] = {}
    cpu_spent: dict[int, float] = {}
    for name in ("on_before_optimizer_step", "on_train_batch_end"):
        original = getattr(probes.BlockProbe, name)

        def hook(self, trainer, *args, _original=original, _name=name):
            # on_train_batch_end runs after the update has advanced global_step
            step = trainer.global_step - (_name == "on_train_batch_end")
            counter = OpCount() if count_ops else contextlib.nullcontext()
            start, cpu = time.perf_counter(), time.thread_time()
            with counter:
                result = _original(self, trainer, *args)
            took = counter.calls if count_ops else time.perf_counter() - start
            spent[step] = spent.get(step, 0.0) + took
            cpu_spent[step] = cpu_spent.get(step, 0.0) + time.thread_time() - cpu
            return result

        setattr(probes.BlockProbe, name, hook)
    return spent, cpu_spent


def measure(
    k: int, steps: int, interval: int, threads: int, folder: Path, count_ops: bool = False
) -> dict[str, float]:
    """Train K replicas (one solo run for K = 1); the probe's time (or tensor operations)
    at its probe steps."""
    corpus = folder / "fox.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    base = cfg.replace(
        cfg.preset("tiny"),
        dataset=str(corpus),
        accelerator="cpu",
        n_layer=2,
        d_model=32,
        block_size=32,
        batch_size=4,
        max_steps=steps,
        probe_interval=interval,
        sample_interval=10 * steps,
        eval_interval=10 * steps,
        warmup_steps=1,
    )
    members = tuple(Member(cfg.replace(base, seed=s), f"k{k}-s{s}") for s in range(k))
    spent, cpu_spent = timed_probe(count_ops)
    started = time.perf_counter()
    session = Session(str(folder / f"k{k}.db"), threads=threads)
    ran = train(Plan(members), session, create=True)
    wall = time.perf_counter() - started
    if ran.exit_code != 0:
        raise SystemExit(f"K={k}: train exited {ran.exit_code}")
    probed = [s for s in range(1, steps) if s % interval == 0 or s == steps - 1]
    if count_ops:
        return {
            "k": k,
            "probe_steps": len(probed),
            "ops": statistics.median(spent[s] for s in probed),
        }
    times = [spent[s] * 1000 for s in probed]
    return {
        "k": k,
        "probe_steps": len(times),
        "probe_ms_median": statistics.median(times),
        "probe_ms_mean": statistics.fmean(times),
        "probe_cpu_ms_median": statistics.median(cpu_spent[s] * 1000 for s in probed),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ks", default="1,8,32")
    parser.add_argument("--steps", type=int, default=41)
    parser.add_argument("--probe-interval", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="")
    parser.add_argument("--ops", action="store_true", help="count tensor operations instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("BLOCKVIZ_QUIET", "1")
    rows = []
    for k in (int(k) for k in args.ks.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            row = measure(k, args.steps, args.probe_interval, args.threads, Path(folder), args.ops)
        rows.append(row)
        if args.ops:
            print(f"K={k:>3}: {row['ops']:.0f} tensor operations a probe step", flush=True)
            continue
        print(
            f"K={k:>3}: probe step {row['probe_ms_median']:8.1f} ms median, "
            f"{row['probe_ms_mean']:8.1f} ms mean, CPU time {row['probe_cpu_ms_median']:8.1f} "
            f"ms median, over {row['probe_steps']} probe steps ({row['wall_s']:.1f} s in all)",
            flush=True,
        )
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; torch {torch.__version__}")
    if args.out:
        meta = {"machine": platform.processor() or platform.machine(), "load": load}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
