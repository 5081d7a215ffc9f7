"""A study worker's memory over a long study: does it grow run after run?

    .venv/bin/python benchmarks/bench_worker_memory.py [--study lr-sensitivity]
        [--out benchmarks/results/worker-memory.json]

Starts `python -m blockviz study run STUDY --size quick --workers 1 --detach` into a fresh
store, then samples the one worker's resident memory (psutil RSS) every second until the
study ends, noting how many runs had finished at each sample. Reported: the RSS after each
run (the last sample before the next run finished), and the least-squares slope of RSS
against runs finished over the second half of the study (past the first runs' warm-up of
allocator pools and imports). Not a test: numbers for BENCHMARKS.md.
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

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blockviz.store import RunStore  # noqa: E402


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="lr-sensitivity")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/worker-memory.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = Path(tmp) / "runs.db"
        command = [sys.executable, "-m", "blockviz", "study", "run", args.study, "--size"]
        command += ["quick", "--workers", "1", "--detach", "--store", str(store_path)]
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
        samples: list[dict] = []
        with RunStore(store_path) as store:
            study_id = int(store.studies_frame()["id"].iloc[-1])
            pid = int(store.get_study(study_id).workers[0][0])
            worker = psutil.Process(pid)
            began = time.monotonic()
            while worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE:
                try:
                    rss = worker.memory_info().rss
                except psutil.Error:
                    break
                runs = store.study_runs(study_id)
                done = int(runs["status"].isin(("completed", "diverged")).sum())
                samples.append(
                    {"t": round(time.monotonic() - began, 1), "done": done, "rss_mib": rss / 2**20}
                )
                if store.get_study(study_id).status != "running":
                    break
                time.sleep(1.0)
            total = len(store.study_runs(study_id))
    after_run: dict[int, float] = {}
    for sample in samples:  # the last sample at each count of finished runs
        after_run[sample["done"]] = sample["rss_mib"]
    counts = sorted(k for k in after_run if k > 0)
    half = counts[len(counts) // 2 :]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "study": args.study,
        "runs": total,
        "rss_after_run_mib": {k: round(after_run[k], 1) for k in counts},
        "first_mib": round(after_run[counts[0]], 1) if counts else None,
        "last_mib": round(after_run[counts[-1]], 1) if counts else None,
        "slope_second_half_mib_per_run": round(slope(half, [after_run[k] for k in half]), 3)
        if len(half) > 1
        else None,
        "samples": len(samples),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rss_after_run_mib"}, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
