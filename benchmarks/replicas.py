"""Replicas end to end (issue 25): one `train --seeds 0..K-1` process against K solo
`train --seed i` processes run one after another, in wall-clock time and peak memory.

    .venv/bin/python benchmarks/replicas.py [--shapes quick,baby-cpu] [--ks 1,2,4,8]
        [--max_steps N] [--threads 1] [--out benchmarks/results/replicas.json]

Each case is a real `python -m blockviz train` subprocess (`--threads 1 --no_progress`,
OMP_NUM_THREADS=1) into a fresh temporary store. Two shapes:

quick     exactly what a quick study run trains: the baby-cpu defaults with the quick
          size's overrides (`core.studies.define.SIZE_PRESETS["quick"]`: 2 layers, 2 heads,
          d_model 64, context 64, batch 16, 300 steps, eval and probes every 100, ...)
baby-cpu  `--preset baby-cpu` as it stands (2,000 steps)

For each K: one replicas process, `train --seeds 0,...,K-1` (trained as one batched
model), then the solo seeds. A solo seed is the same run whatever K it is counted in, so
each solo seed 0..max(K)-1 runs once per shape (one process after another, each into its
own store) and "K solo" is the sum of the first K seeds' wall times.

Reported per shape and K:
- wall-clock seconds of the replicas process, and of the K solo processes (start-up,
  imports, data loading and store writes included: what a user waits for);
- solo ÷ replicas (the speedup) and replicas ÷ one solo run (the mean solo seed's wall
  time; the issue's target is 8 quick seeds in at most 3x one run);
- the training seconds each run recorded (`final["time_s"]`; the replicas of one process
  share one clock, so theirs is the largest of them) and tokens/s, from the store;
- peak resident memory (MiB) of the replicas process and of a solo process (the largest
  solo seed's), from `/usr/bin/time -f %M` where it exists, else from polling the process
  tree's RSS with psutil every 50 ms (both are recorded when both can be), and the memory
  one more replica costs, (peak(K) - peak(1)) / (K - 1), peak(1) being the K = 1 replicas
  process's (a solo process's when K = 1 is not measured);
- the largest |final val loss of replica seed i - solo seed i| (replicas promise the solo
  run's losses).

`--max_steps` overrides both shapes' step counts, capping the warmup at them (for a smoke
run; the intervals stay, so a short run evaluates and probes at its ends only). Not a test:
numbers for BENCHMARKS.md, with the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blockviz.core import config as cfg  # noqa: E402
from blockviz.core.studies.define import SIZE_PRESETS  # noqa: E402
from blockviz.store import RunStore  # noqa: E402

# Each shape: the baby-cpu preset and flat overrides on it, passed as `--field value`.
SHAPES: dict[str, dict[str, Any]] = {"quick": dict(SIZE_PRESETS["quick"]), "baby-cpu": {}}
KS = (1, 2, 4, 8)
POLL_S = 0.05
GNU_TIME = "/usr/bin/time"
FALLBACK_MESSAGE = "train one after another"  # train --seeds when a config cannot batch


def shape_flags(name: str, max_steps: int | None = None) -> list[str]:
    """A shape as `train` flags; `max_steps` overrides its steps (and caps its warmup,
    which may not exceed them)."""
    overrides = dict(SHAPES[name])
    if max_steps is not None:
        warmup = overrides.get("warmup_steps", cfg.preset("baby-cpu").train.warmup_steps)
        overrides.update(max_steps=max_steps, warmup_steps=min(warmup, max_steps))
    flags = ["--preset", "baby-cpu"]
    for field, value in overrides.items():
        flags += [f"--{field}", str(value)]
    return flags


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _gnu_time() -> bool:
    """Whether /usr/bin/time is GNU time (takes -f and -o)."""
    if not Path(GNU_TIME).is_file():
        return False
    probe = subprocess.run(
        [GNU_TIME, "-f", "%M", "true"], capture_output=True, text=True, check=False
    )
    return probe.returncode == 0 and probe.stderr.strip().isdigit()


def _tree_rss(root: psutil.Process, include_root: bool) -> int:
    """Resident bytes of a process and its descendants (the root's own left out when it
    is the /usr/bin/time wrapper)."""
    total = 0
    try:
        procs = root.children(recursive=True) + ([root] if include_root else [])
    except psutil.Error:
        return 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


def train(flags: list[str], store: Path, threads: int, gnu_time: bool) -> dict[str, Any]:
    """One `blockviz train` process: its wall time, peak memory and output; raises with
    the output's tail when it fails."""
    command = [sys.executable, "-m", "blockviz", "train", *flags, "--threads", str(threads)]
    command += ["--store", str(store), "--no_progress"]
    time_file = store.parent / "maxrss.txt"
    if gnu_time:
        command = [GNU_TIME, "-f", "%M", "-o", str(time_file), *command]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log_path = store.parent / "train.log"
    peak = 0
    with log_path.open("wb") as log_file:
        began = time.perf_counter()
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
        try:
            watched = psutil.Process(proc.pid)
        except psutil.Error:
            watched = None
        while proc.poll() is None:
            if watched is not None:
                peak = max(peak, _tree_rss(watched, include_root=not gnu_time))
            time.sleep(POLL_S)
        wall = time.perf_counter() - began
    output = log_path.read_text(encoding="utf-8", errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(
            f"exit {proc.returncode}: {' '.join(command)}\n--- output tail ---\n{output[-4000:]}"
        )
    time_mib = None
    if gnu_time and time_file.is_file():
        text = time_file.read_text(encoding="utf-8").strip().splitlines()
        if text and text[-1].strip().isdigit():
            time_mib = int(text[-1].strip()) / 1024
    poll_mib = peak / 2**20
    return {
        "wall_s": round(wall, 3),
        "peak_mib": round(time_mib if time_mib is not None else poll_mib, 1),
        "peak_mib_time": None if time_mib is None else round(time_mib, 1),
        "peak_mib_poll": round(poll_mib, 1),
        "fell_back_to_solo": FALLBACK_MESSAGE in output,
        "runs": _runs(store),
    }


def _runs(store: Path) -> list[dict[str, Any]]:
    """Every run in the store: seed, status, and its recorded training time and loss."""
    out = []
    with RunStore(store) as opened:
        for run_id in opened.runs_frame()["id"]:
            run = opened.get_run(int(run_id))
            final = run.final or {}
            out.append(
                {
                    "id": run.id,
                    "seed": (run.config or {}).get("train", {}).get("seed"),
                    "status": run.status,
                    "device": run.device,
                    "time_s": final.get("time_s"),
                    "tokens_per_sec": final.get("tokens_per_sec"),
                    "val_loss": final.get("val_loss"),
                    "steps": final.get("steps"),
                }
            )
    return out


def one(flags: list[str], threads: int, gnu_time: bool) -> dict[str, Any]:
    """A train process into a fresh temporary store."""
    with tempfile.TemporaryDirectory(prefix="blockviz-replicas-") as tmp:
        return train(flags, Path(tmp) / "runs.db", threads, gnu_time)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def measure_shape(
    name: str, flags: list[str], ks: list[int], threads: int, gnu_time: bool
) -> list[dict[str, Any]]:
    """Every K of one shape: the replicas process, then the solo seeds not yet run."""
    solos: list[dict[str, Any]] = []  # solo seed i at index i
    replicas: dict[int, dict[str, Any]] = {}
    for k in ks:
        seeds = ",".join(str(i) for i in range(k))
        replicas[k] = one([*flags, "--seeds", seeds, "--replicas", str(k)], threads, gnu_time)
        print(json.dumps({"shape": name, "k": k, "replicas_wall_s": replicas[k]["wall_s"]}))
        while len(solos) < k:
            seed = len(solos)
            solos.append(one([*flags, "--seed", str(seed)], threads, gnu_time))
            print(json.dumps({"shape": name, "solo_seed": seed, "wall_s": solos[-1]["wall_s"]}))
            sys.stdout.flush()
    one_solo_wall = sum(s["wall_s"] for s in solos) / len(solos)
    solo_times = [s["runs"][0]["time_s"] for s in solos]
    one_solo_train = (
        sum(solo_times) / len(solo_times) if all(t is not None for t in solo_times) else None
    )
    solo_peak = max(s["peak_mib"] for s in solos)
    base_peak = replicas[1]["peak_mib"] if 1 in replicas else solos[0]["peak_mib"]
    rows = []
    for k in ks:
        rep = replicas[k]
        rep_times = [r["time_s"] for r in rep["runs"] if r["time_s"] is not None]
        rep_train = max(rep_times) if rep_times else None
        k_solo_wall = sum(s["wall_s"] for s in solos[:k])
        k_solo_train = (
            sum(t for t in solo_times[:k]) if all(t is not None for t in solo_times[:k]) else None
        )
        by_seed = {r["seed"]: r for r in rep["runs"]}
        diffs = [
            abs(by_seed[i]["val_loss"] - solos[i]["runs"][0]["val_loss"])
            for i in range(k)
            if i in by_seed
            and by_seed[i]["val_loss"] is not None
            and solos[i]["runs"][0]["val_loss"] is not None
        ]
        rows.append(
            {
                "shape": name,
                "k": k,
                "replicas_wall_s": rep["wall_s"],
                "k_solo_wall_s": round(k_solo_wall, 3),
                "speedup_wall": _round(_ratio(k_solo_wall, rep["wall_s"])),
                "replicas_over_one_solo_wall": _round(_ratio(rep["wall_s"], one_solo_wall)),
                "replicas_train_s": rep_train,
                "k_solo_train_s": _round(k_solo_train, 3),
                "speedup_train": _round(_ratio(k_solo_train, rep_train)),
                "replicas_over_one_solo_train": _round(_ratio(rep_train, one_solo_train)),
                "replicas_peak_mib": rep["peak_mib"],
                "solo_peak_mib": solo_peak,
                "mib_per_replica": _round((rep["peak_mib"] - base_peak) / (k - 1), 1)
                if k > 1
                else None,
                "max_val_loss_diff": max(diffs) if diffs else None,
                "replicas_fell_back_to_solo": rep["fell_back_to_solo"],
                "replicas_runs": rep["runs"],
                "replicas_peak_mib_time": rep["peak_mib_time"],
                "replicas_peak_mib_poll": rep["peak_mib_poll"],
            }
        )
    rows.append(
        {
            "shape": name,
            "solo_seeds": [
                {
                    "seed": i,
                    "wall_s": s["wall_s"],
                    "peak_mib": s["peak_mib"],
                    "peak_mib_time": s["peak_mib_time"],
                    "peak_mib_poll": s["peak_mib_poll"],
                    **{k: v for k, v in s["runs"][0].items() if k != "seed"},
                }
                for i, s in enumerate(solos)
            ],
            "one_solo_wall_s": round(one_solo_wall, 3),
            "one_solo_train_s": _round(one_solo_train, 3),
            "peak1_from": "replicas k=1" if 1 in replicas else "solo seed 0",
        }
    )
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the K rows."""
    head = (
        "| shape | K | replicas wall s | K solo wall s | solo ÷ replicas | replicas ÷ one solo "
        "| replicas train s | K solo train s | solo ÷ replicas (train) | replicas ÷ one solo "
        "(train) | replicas peak MiB | solo peak MiB | MiB per replica | max Δ val loss |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    keys = (
        "shape",
        "k",
        "replicas_wall_s",
        "k_solo_wall_s",
        "speedup_wall",
        "replicas_over_one_solo_wall",
        "replicas_train_s",
        "k_solo_train_s",
        "speedup_train",
        "replicas_over_one_solo_train",
        "replicas_peak_mib",
        "solo_peak_mib",
        "mib_per_replica",
        "max_val_loss_diff",
    )
    for row in rows:
        if "k" not in row:
            continue
        cells = [row[key] for key in keys]
        if isinstance(cells[-1], float):
            cells[-1] = f"{cells[-1]:.2g}"
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    parser.add_argument("--ks", type=_ints, default=list(KS), help="comma-separated")
    parser.add_argument("--max_steps", type=int, default=None, help="override (smoke runs)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/replicas.json")
    args = parser.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; choose from {list(SHAPES)}")
    ks = sorted(set(args.ks))
    if not ks or ks[0] < 1:
        parser.error("--ks: positive integers")
    gnu_time = _gnu_time()
    import torch

    load_before = _load()
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    flags_used = {}
    for name in shapes:
        flags = shape_flags(name, args.max_steps)
        flags_used[name] = flags
        rows += measure_shape(name, flags, ks, args.threads, gnu_time)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.platform()}",
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": args.threads,
        "max_steps_override": args.max_steps,
        "memory_source": "/usr/bin/time %M" if gnu_time else "psutil poll (50 ms)",
        "load_before": load_before,
        "load_after": _load(),
        "total_s": round(time.perf_counter() - started, 1),
        "flags": flags_used,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print()
    print(table(rows))
    print()
    print(f"load {load_before} -> {result['load_after']}; {result['total_s']} s in all")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
