"""Training time by torch thread count, alone and beside a second training run.

    .venv/bin/python benchmarks/bench_threads.py [--out benchmarks/results/threads.json]

Each case is one `python -m blockviz train` run into a fresh store, with `--threads N`:

quick     the quick study size's model (2 layers, d_model 64, context 64, batch 16, 300
          steps, probes every 100), seed 1
baby-cpu  the default model, 200 steps

once on a quiet box and once beside a second run (the baby-cpu preset with 2 threads,
as a run started before the thread policy would have had on this box, training
throughout). Reported: the training time the run recorded (`time_s`) and its val loss
(the same to float tolerance whatever the threads).

probes    what the quick size's denser probe schedule costs: the quick run at 1 thread
          with probes every 100 steps (0, 100, 200, 299: the schedule now) and every 300
          (0, 299: before), three times each, interleaved, on the quiet box.

Not a test: numbers for BENCHMARKS.md, with the load average.
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
QUICK = [
    *("--n_layer", "2", "--n_head", "2", "--d_model", "64", "--block_size", "64"),
    *("--batch_size", "16", "--max_steps", "300", "--warmup_steps", "30"),
    *("--log_interval", "10", "--eval_interval", "100", "--eval_iters", "10"),
    *("--probe_interval", "100", "--sample_interval", "300", "--seed", "1"),
]
BABY = ["--preset", "baby-cpu", "--max_steps", "200", "--sample_interval", "1000"]
CASES = {"quick": QUICK, "baby-cpu": BABY}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def train(store: Path, flags: list[str], threads: int) -> dict:
    """One run; its recorded training time, val loss and device."""
    command = [sys.executable, "-m", "blockviz", "train", *flags, "--threads", str(threads)]
    command += ["--store", str(store), "--no_progress"]
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
    sys.path.insert(0, str(ROOT))
    from blockviz.store import RunStore

    with RunStore(store) as opened:
        run = opened.get_run(int(opened.runs_frame()["id"].iloc[-1]))
    final = run.final or {}
    return {
        "threads": threads,
        "time_s": final.get("time_s"),
        "val_loss": final.get("val_loss"),
        "device": run.device,
    }


def beside_run(folder: Path) -> subprocess.Popen[bytes]:
    """A baby-cpu run with 2 threads that trains until it is stopped."""
    command = [sys.executable, "-m", "blockviz", "train", "--preset", "baby-cpu"]
    command += ["--max_steps", "200000", "--threads", "2", "--no_progress"]
    command += ["--store", str(folder / "beside.db")]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(10)  # past its imports: training when the measured run starts
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/threads.json"))
    args = parser.parse_args()
    result: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "load_before": _load(),
        "cases": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        result["probes"] = []
        for repeat in range(3):
            for interval in ("100", "300"):
                flags = [*QUICK, "--probe_interval", interval]
                store = folder / f"probes-{interval}-{repeat}.db"
                row = {"probe_interval": int(interval), **train(store, flags, 1)}
                print(json.dumps(row), flush=True)
                result["probes"].append(row)
        for setting in ("quiet", "beside"):
            other = beside_run(folder) if setting == "beside" else None
            try:
                for name, flags in CASES.items():
                    for threads in (1, 2):
                        store = folder / f"{setting}-{name}-{threads}.db"
                        row = {"case": name, "setting": setting, **train(store, flags, threads)}
                        row["load"] = _load()
                        print(json.dumps(row), flush=True)
                        result["cases"].append(row)
            finally:
                if other is not None:
                    other.terminate()
                    other.wait(timeout=60)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
