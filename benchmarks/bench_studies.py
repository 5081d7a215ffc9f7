"""Wall time of the quick studies, and what a study worker saves over a process per run.

    .venv/bin/python benchmarks/bench_studies.py [--only studies,overhead] [--keys a,b]
        [--out benchmarks/results/studies-quick.json]

studies   each built-in study at `--size quick` (its default seeds) through the CLI,
          `python -m blockviz study run KEY --size quick`, one after another into one fresh
          store: the wall time of each (launch to the CLI's return) and its results
          (`study show --json`: the per-variant table and every claim's verdict). The
          README's claims-vs-measured table is made from this file
          (benchmarks/studies_table.py).
overhead  the same six quick runs (lr-sensitivity's Pre-LN variants at six learning rates,
          seed 1) trained two ways: six `python -m blockviz train` processes one after
          another, and one study worker (`study sweep`) that trains all six in one process.
          Per run: wall time, and the training time the run itself recorded (`time_s`);
          the difference is the fixed cost (interpreter, torch and Lightning imports, data).

Not a test: numbers for BENCHMARKS.md, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
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


def _blockviz(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "blockviz", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def bench_studies(store: Path, keys: list[str]) -> list[dict]:
    out = []
    for index, key in enumerate(keys, start=1):
        began = time.perf_counter()
        _blockviz("study", "run", key, "--size", "quick", "--store", str(store))
        wall = time.perf_counter() - began
        shown = json.loads(
            _blockviz("study", "show", str(index), "--json", "--store", str(store)).stdout
        )
        print(f"{key}: {wall:.1f} s (load {_load()})", flush=True)
        out.append({"key": key, "wall_s": round(wall, 1), "load": _load(), "show": shown})
    return out


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
                float((store.get_run(int(i))["final"] or {}).get("time_s") or 0.0)
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
    args = parser.parse_args()
    only = set(args.only.split(","))
    result: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "python": platform.python_version(),
        "load_before": _load(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "overhead" in only:
            result["overhead"] = bench_overhead(folder)
            print(json.dumps(result["overhead"], indent=2), flush=True)
        if "studies" in only:
            keys = [k for k in args.keys.split(",") if k]
            result["studies"] = bench_studies(folder / "studies.db", keys)
            result["total_s"] = round(sum(s["wall_s"] for s in result["studies"]), 1)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
