"""Wall time of the quick studies, and what a study worker saves over a process per run.

    .venv/bin/python benchmarks/bench_studies.py [--only studies,overhead] [--keys a,b]
        [--out benchmarks/results/studies-quick.json]

studies   each built-in study at `--size quick` (its default seeds) through the CLI,
          `python -m blockviz study run KEY --size quick`, one after another into one fresh
          store: the wall time of each (launch to the CLI's return) and its results
          (`study show --json`: the per-variant table and every claim's verdict).
overhead  the same six quick runs (lr-sensitivity's Pre-LN variants at six learning rates,
          seed 1) trained two ways: six `python -m blockviz train` processes one after
          another, and one study worker (`study sweep`) that trains all six in one process.
          Per run: wall time, and the training time the run itself recorded (`time_s`);
          the difference is the fixed cost (interpreter, torch and Lightning imports, data).

Options for issue 21's measurements:

--beside      a second training run (the baby-cpu preset, 200,000 steps, its own store,
              started the way a user would: `python -m blockviz train`, default threads)
              trains for the whole benchmark and is stopped at its end, as on a shared box
--code DIR    run the studies with the blockviz of another checkout (e.g. a worktree of
              an earlier commit), for before/after numbers on one machine; the analysis
              below is always this checkout's
--threads N   pass `--threads N` to `study run` (only where the code has the flag)

Every study's entry also holds each variant's seed-to-seed spread of final val loss
(max − min over its seeds) and the worst of them: with one evaluation set the spread is the
models' own, not which windows each seed drew.

Not a test: numbers for BENCHMARKS.md, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDY_KEYS = (
    "lr-sensitivity",
    "norm-position",
    "residual-depth",
    "normalization",
    "ffn-ratio",
    "activation",
    "sublayers",
    "init-gradients",
)
OVERHEAD_LRS = ("3e-4", "1e-3", "3e-3", "1e-2", "3e-2", "1e-1")


CODE = ROOT  # the checkout whose blockviz runs (--code)


def _blockviz(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "blockviz", *args]
    env = {**os.environ, "PYTHONPATH": str(CODE)}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=CODE, env=env
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def seed_spreads(store: Path, study_id: int) -> dict[str, float]:
    """Each variant's max − min final val loss over its seeds (finite values only)."""
    from blockviz.store import RunStore

    with RunStore(store) as opened:
        runs = opened.study_runs(study_id)
        losses: dict[str, list[float]] = {}
        for run in runs.itertuples():
            final = opened.get_run(int(run.id)).final or {}
            value = final.get("val_loss")
            if isinstance(value, int | float) and math.isfinite(value):
                losses.setdefault(str(run.variant), []).append(float(value))
    return {v: round(max(xs) - min(xs), 4) for v, xs in losses.items() if len(xs) > 1}


def bench_studies(store: Path, keys: list[str], threads: int | None = None) -> list[dict]:
    out = []
    extra = ["--threads", str(threads)] if threads else []
    for index, key in enumerate(keys, start=1):
        began = time.perf_counter()
        _blockviz("study", "run", key, "--size", "quick", "--store", str(store), *extra)
        wall = time.perf_counter() - began
        shown = json.loads(
            _blockviz("study", "show", str(index), "--json", "--store", str(store)).stdout
        )
        spreads = seed_spreads(store, index)
        worst = max(spreads.values(), default=math.nan)
        print(f"{key}: {wall:.1f} s, worst seed spread {worst:.3f} (load {_load()})", flush=True)
        out.append(
            {
                "key": key,
                "wall_s": round(wall, 1),
                "load": _load(),
                "seed_spread": spreads,
                "worst_seed_spread": worst,
                "show": shown,
            }
        )
    return out


def start_beside(folder: Path) -> subprocess.Popen[bytes]:
    """A second training run, as a user would start one beside the studies."""
    command = [sys.executable, "-m", "blockviz", "train", "--preset", "baby-cpu"]
    command += ["--max_steps", "200000", "--store", str(folder / "beside.db"), "--no_progress"]
    env = {**os.environ, "PYTHONPATH": str(CODE)}
    proc = subprocess.Popen(
        command, cwd=CODE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    time.sleep(10)  # past its imports: training when the first study starts
    return proc


def bench_overhead(folder: Path) -> dict:
    quick = [
        *("--n_layer", "2", "--n_head", "2", "--d_model", "64", "--block_size", "64"),
        *("--batch_size", "16", "--max_steps", "300", "--warmup_steps", "30"),
        *("--log_interval", "10", "--eval_interval", "100", "--eval_iters", "10"),
        *("--probe_interval", "300", "--sample_interval", "300", "--seed", "1"),
    ]
    separate = folder / "separate.db"
    began = time.perf_counter()
    for lr in OVERHEAD_LRS:
        _blockviz(
            "train", *quick, "--lr", lr, "--min_lr", "0", "--store", str(separate), "--no_progress"
        )
    separate_s = time.perf_counter() - began
    worker = folder / "worker.db"
    began = time.perf_counter()
    _blockviz(
        "study",
        "sweep",
        *quick,
        "--min_lr",
        "0",
        "--lr",
        ",".join(OVERHEAD_LRS),
        "--store",
        str(worker),
    )
    worker_s = time.perf_counter() - began

    def trained(path: Path) -> float:
        from blockviz.store import RunStore

        with RunStore(path) as store:
            return sum(
                float((store.get_run(int(i)).final or {}).get("time_s") or 0.0)
                for i in store.runs_frame()["id"]
            )

    n = len(OVERHEAD_LRS)
    return {
        "runs": n,
        "separate_processes_s": round(separate_s, 1),
        "separate_training_s": round(trained(separate), 1),
        "one_worker_s": round(worker_s, 1),
        "worker_training_s": round(trained(worker), 1),
        "fixed_cost_per_run_separate_s": round((separate_s - trained(separate)) / n, 2),
        "fixed_cost_per_run_worker_s": round((worker_s - trained(worker)) / n, 2),
        "load": _load(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="studies,overhead")
    parser.add_argument("--keys", default=",".join(STUDY_KEYS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/studies-quick.json"))
    parser.add_argument("--beside", action="store_true", help="a second run trains meanwhile")
    parser.add_argument("--code", help="the checkout whose blockviz runs the studies")
    parser.add_argument("--threads", type=int, help="--threads for `study run`")
    args = parser.parse_args()
    global CODE
    CODE = Path(args.code).resolve() if args.code else ROOT
    only = set(args.only.split(","))
    result: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "python": platform.python_version(),
        "load_before": _load(),
        "code": subprocess.run(
            ["git", "-C", str(CODE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "beside": "a baby-cpu `blockviz train` run" if args.beside else "nothing",
        "threads": args.threads or "default",
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        beside = start_beside(folder) if args.beside else None
        if "overhead" in only:
            result["overhead"] = bench_overhead(folder)
            print(json.dumps(result["overhead"], indent=2), flush=True)
        if "studies" in only:
            keys = [k for k in args.keys.split(",") if k]
            result["studies"] = bench_studies(folder / "studies.db", keys, args.threads)
            result["total_s"] = round(sum(s["wall_s"] for s in result["studies"]), 1)
        if beside is not None:
            beside.terminate()
            beside.wait(timeout=60)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
