"""The device check of issue 34: one command that says what blockviz does on this machine.

    python3 benchmarks/gpu_check.py --size full --out gpu_check.json   # one GPU, ~5 minutes
    .venv/bin/python benchmarks/gpu_check.py --size toy --accelerator cpu --out toy.json

It prints the machine (GPU, torch, lightning, load average), then four parts, each a small
table, and writes everything to --out as JSON (rewritten after each part, so a check cut
short still leaves what it measured):

1. replicas   the solo run (`train --seed 0`) and K replicas of the same config
              (`train --seeds 0-(K-1) --replicas K`): tokens/s per run and in total, the
              step time, peak memory, and total tokens/s ÷ the solo run's;
2. equality   each batch's seed-0 replica against the solo run (same seed, same steps):
              the largest |difference| of train/loss over the steps and of final val loss;
3. recipe     nanoGPT's shakespeare_char recipe (6 layers, 6 heads, d_model 384, ctx 256,
              batch 64, dropout 0.2, lr 1e-3 cosine to 1e-4 after 100 warm-up steps, beta2
              0.99, no biases, tied weights, weight decay 0.1, clipping 1.0, 5,000 steps;
              evaluated every 250 steps on 50 batches) on Tiny Shakespeare, compiled and eager:
              step time and best val loss;
4. fork       a no-change fork (`fork RUN --step N`, dropout 0.1) against its parent: the
              largest |difference| over every scalar and layer statistic both logged after
              the fork step (timings left out); anything but 0 fails the check.

Every run is a `python -m blockviz` process: the module runs in a small wrapper (this script
with `--worker`, `runpy` as `python -m` does) that adds one thing, the peak memory after the
command, because blockviz records none: `torch.cuda.max_memory_allocated()` on a GPU, the
peak resident memory (ru_maxrss) on a CPU; the column says which. Results are read back from
each part's own temporary store through `blockviz.store.RunStore`.

Step time is the median of the run's train/step_time rows after the first 10% of its steps
(compilation and warm-up left out); "tok/s per run" is batch x context ÷ that step time,
"total" that times K. `--size toy` runs the same parts in seconds on a CPU (the tiny
preset, K = 1, 2, 4, a 2-layer recipe, eager only: compiling on a CPU takes about 50 s).
A part that fails or runs past its time prints an error row and the rest go on; the exit
status is 1 when any part failed. Every run ends within --budget_s of the start (540 s:
the device machine's limit on one command is 600), cut short or not started if need be;
the parts run replicas, equality, fork, then the recipe (compiled, then eager), so a
tight budget cuts the longest last. Imports the standard library and what `train` needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_train import _peak_memory  # noqa: E402
from replicas import FALLBACK_MESSAGE, _load, _runs  # noqa: E402

from blockviz.core import spec  # noqa: E402
from blockviz.core.download import cache_dir  # noqa: E402

CORPUS = "tinyshakespeare.txt"
# Where the corpus is looked for when --data is not given (the repo's shared copy beside
# the checkout or in it, then blockviz's download cache).
CORPUS_PLACES = (ROOT.parent / "shared" / "data", ROOT / "shared" / "data", cache_dir())
# Series that time the run, not what it computed: a fork may differ in them.
TIMINGS = {spec.TRAIN_STEP_TIME, spec.TRAIN_TOKENS_PER_SEC, spec.TRAIN_ELAPSED_S}
# The whole check's seconds: under the device machine's 10-minute limit on one command,
# with room for the process start and the tables.
BUDGET_S = 540.0
NANOGPT = "nanoGPT shakespeare_char on the H100: 10.2 ms/step compiled, best val 1.4725"


@dataclass(frozen=True)
class Size:
    """What each part trains at one size, and how long each process may take (s)."""

    replicas: list[str]  # flags of the solo run and of every batch
    ks: tuple[int, ...]
    recipe: list[str]
    compile_recipe: bool
    fork: list[str]  # the parent's flags
    fork_step: int
    timeouts: dict[str, int] = field(default_factory=dict)


RECIPE = [
    *("--preset", "gpt2-preln", "--n_layer", "6", "--n_head", "6", "--d_model", "384"),
    *("--block_size", "256", "--batch_size", "64", "--dropout", "0.2", "--bias", "false"),
    *("--tie_weights", "true", "--lr", "1e-3", "--min_lr", "1e-4", "--warmup_steps", "100"),
    *("--lr_schedule", "cosine", "--beta2", "0.99", "--weight_decay", "0.1"),
    *("--grad_clip", "1.0", "--max_steps", "5000", "--eval_interval", "250"),
    *("--eval_iters", "50", "--ckpt_interval", "0"),
]
SIZES = {
    "full": Size(
        replicas=["--preset", "baby-cpu", "--max_steps", "200"],
        ks=(8, 64, 256),
        recipe=RECIPE,
        compile_recipe=True,
        fork=["--preset", "baby-cpu", "--dropout", "0.1", "--max_steps", "300"],
        fork_step=200,
        timeouts={"solo": 120, "batch": 150, "recipe": 240, "fork": 90},
    ),
    "toy": Size(
        replicas=["--preset", "tiny", "--max_steps", "20", "--ckpt_interval", "0"],
        ks=(1, 2, 4),
        recipe=[
            *RECIPE,
            *("--n_layer", "2", "--n_head", "2", "--d_model", "32", "--block_size", "32"),
            *("--batch_size", "8", "--max_steps", "30", "--warmup_steps", "5"),
            *("--eval_interval", "10", "--eval_iters", "2", "--probe_interval", "10"),
        ],
        compile_recipe=False,
        fork=["--preset", "tiny", "--dropout", "0.1", "--max_steps", "20", "--ckpt_interval", "10"],
        fork_step=10,
        timeouts={"solo": 60, "batch": 60, "recipe": 90, "fork": 60},
    ),
}


MIN_RUN_S = 10  # a run is not started with less of the budget left


class CheckError(RuntimeError):
    """A run that failed or ran past its time, or a result the check refuses."""


# ---------------------------------------------------------------------- running the CLI


def worker(peak_path: str, argv: list[str]) -> int:
    """`python -m blockviz ARGV` in this process, then its peak memory to `peak_path`."""
    sys.argv = ["blockviz", *argv]
    code: Any = 0
    try:
        runpy.run_module("blockviz", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code
    finally:
        Path(peak_path).write_text(json.dumps(_peak_memory()), encoding="utf-8")
    return code if isinstance(code, int) else (0 if code is None else 1)


@dataclass
class Check:
    """One check's settings, the temporary folder its stores live in, and the clock time
    (time.monotonic) by which every run must have ended."""

    accelerator: str
    workdir: Path
    deadline: float = math.inf

    def blockviz(self, name: str, argv: list[str], store: Path, timeout: int) -> dict[str, Any]:
        """Run `python -m blockviz ARGV --store STORE --no_progress` (through the worker);
        its wall seconds and peak memory. Raises CheckError with the output's tail when it
        fails or runs past `timeout` seconds, or past the check's deadline."""
        left = self.deadline - time.monotonic()
        if left < MIN_RUN_S:
            raise CheckError(f"{name}: not started, {max(0, left):.0f} s of --budget_s left")
        timeout = int(min(timeout, left))
        log = self.workdir / f"{name}.log"
        peak = self.workdir / f"{name}.peak.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(peak), "--"]
        command += [*argv, "--store", str(store), "--no_progress"]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        began = time.perf_counter()
        with log.open("wb") as out:
            try:
                done = subprocess.run(
                    command,
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                )
                code: int | None = done.returncode
            except subprocess.TimeoutExpired:
                code = None
        wall = time.perf_counter() - began
        if code != 0:
            tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
            why = f"ran past {timeout} s" if code is None else f"exit {code}"
            raise CheckError(f"{name}: {why}: blockviz {' '.join(argv)}\n{tail}")
        memory = json.loads(peak.read_text(encoding="utf-8")) if peak.is_file() else {}
        output = log.read_text(encoding="utf-8", errors="replace")
        return {"wall_s": round(wall, 1), "output": output, **memory}

    def train(self, name: str, flags: list[str], store: Path, timeout: int) -> dict[str, Any]:
        """`train FLAGS` on this check's accelerator."""
        return self.blockviz(
            name, ["train", *flags, "--accelerator", self.accelerator], store, timeout
        )


# ----------------------------------------------------------------------- store reads


def _open(store: Path) -> Any:
    from blockviz.store import RunStore

    return RunStore(store, readonly=True)


def _series(store: Any, run_id: int, name: str) -> dict[int, float]:
    frame = store.scalars(run_id, names=[name])
    return dict(zip(frame["step"].tolist(), frame["value"].tolist(), strict=True))


def step_time(store: Any, run_id: int) -> float | None:
    """The median train/step_time after the first 10% of the steps (warm-up, compilation)."""
    first = max(1, store.get_run(run_id).config["train"]["max_steps"] // 10)
    rows = _series(store, run_id, spec.TRAIN_STEP_TIME)
    after = [value for step, value in rows.items() if step >= first]
    return statistics.median(after) if after else None


def largest_difference(a: dict[Any, float], b: dict[Any, float]) -> tuple[float | None, int]:
    """The largest |a - b| over the keys both hold (NaN where a value is not finite in one
    only), and how many keys that was."""
    common = sorted(set(a) & set(b))
    diffs = []
    for key in common:
        x, y = a[key], b[key]
        if math.isfinite(x) and math.isfinite(y):
            diffs.append(abs(x - y))
        elif not (math.isnan(x) and math.isnan(y)) and x != y:
            diffs.append(math.inf)
        else:
            diffs.append(0.0)
    return (max(diffs) if diffs else None), len(common)


def _memory(result: dict[str, Any]) -> tuple[float | None, str]:
    if result.get("peak_cuda_mib") is not None:
        return round(result["peak_cuda_mib"], 1), "cuda"
    rss = result.get("peak_rss_mib")
    return (None if rss is None else round(rss, 1)), "rss"


# ---------------------------------------------------------------------------- the parts


def replicas_case(check: Check, size: Size, label: str, k: int) -> tuple[dict[str, Any], Any]:
    """One row of part 1: the solo run (label "solo") or a batch of K; and the seed-0
    run's (store, id) for part 2."""
    extra = ["--seed", "0"] if label == "solo" else ["--seeds", f"0-{k - 1}", "--replicas", str(k)]
    store = check.workdir / f"replicas-{label}.db"
    timeout = size.timeouts["solo" if label == "solo" else "batch"]
    result = check.train(f"replicas-{label}", [*size.replicas, *extra], store, timeout)
    runs = _runs(store)
    if not runs:
        raise CheckError(f"{label}: the store holds no run")
    first = min(runs, key=lambda r: r["seed"])
    with _open(store) as opened:
        run = opened.get_run(first["id"])
        per_step = step_time(opened, first["id"])
    tokens_per_step = run.config["train"]["batch_size"] * run.config["model"]["block_size"]
    per_run = tokens_per_step / per_step if per_step else None
    memory, source = _memory(result)
    recorded = [r["tokens_per_sec"] for r in runs]
    row = {
        "case": label,
        "k": k,
        "runs": len(runs),
        "device": run.device,
        "precision": run.precision,
        "step_ms": None if per_step is None else round(per_step * 1e3, 2),
        "tokens_per_s_per_run": None if per_run is None else round(per_run),
        "tokens_per_s_total": None if per_run is None else round(per_run * len(runs)),
        "x_solo": None,
        "peak_mib": memory,
        "memory": source,
        "wall_s": result["wall_s"],
        # blockviz's own final tokens/s (the mean over training, the first steps in)
        "recorded_tokens_per_s_total": None if None in recorded else round(sum(recorded)),
    }
    bad = [(r["id"], r["status"]) for r in runs if r["status"] != "completed"]
    if bad or len(runs) != k:
        row["error"] = f"{len(runs)} runs of {k}; not completed (id, status): {bad}"
    elif label != "solo" and FALLBACK_MESSAGE in result["output"]:
        row["error"] = f"the {k} seeds did not batch: they trained one after another"
    return row, (store, first["id"])


def part_replicas(check: Check, size: Size) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The solo run and each batch: throughput, step time, peak memory; and what part 2
    compares (the stores and run ids)."""
    rows: list[dict[str, Any]] = []
    kept: dict[str, Any] = {"stores": {}}
    for label, k in [("solo", 1), *((f"K={k}", k) for k in size.ks)]:
        try:
            row, kept["stores"][label] = replicas_case(check, size, label, k)
        except Exception as failed:  # one case's failure is a row; the next K runs
            row = {"case": label, "k": k, "error": f"{type(failed).__name__}: {failed}"}
        rows.append(row)
    solo = rows[0].get("tokens_per_s_total")
    for row in rows:
        if solo and row.get("tokens_per_s_total"):
            row["x_solo"] = round(row["tokens_per_s_total"] / solo, 2)
    return rows, kept


def part_equality(kept: dict[str, Any]) -> list[dict[str, Any]]:
    """Each batch's seed-0 replica against the solo run: train/loss and final val loss."""
    if "solo" not in kept["stores"]:
        raise CheckError("the solo run failed (part 1): nothing to compare against")
    solo_store, solo_id = kept["stores"]["solo"]
    with _open(solo_store) as opened:
        solo_loss = _series(opened, solo_id, spec.TRAIN_LOSS)
        solo_val = (opened.get_run(solo_id).final or {}).get("val_loss")
    rows = []
    for label, (store, run_id) in kept["stores"].items():
        if label == "solo":
            continue
        with _open(store) as opened:
            loss = _series(opened, run_id, spec.TRAIN_LOSS)
            val = (opened.get_run(run_id).final or {}).get("val_loss")
        diff, steps = largest_difference(loss, solo_loss)
        rows.append(
            {
                "case": f"{label} seed 0 vs solo",
                "steps_compared": steps,
                "max_abs_train_loss_diff": diff,
                "abs_final_val_loss_diff": None
                if val is None or solo_val is None
                else abs(val - solo_val),
            }
        )
        if steps == 0:
            rows[-1]["error"] = "no train/loss step in common"
    if not rows:
        raise CheckError("no batch ran (part 1): nothing to compare with the solo run")
    return rows


def recipe_case(check: Check, size: Size, data: Path, compiled: bool) -> dict[str, Any]:
    """One row of part 3: the recipe eager or compiled."""
    label = "compiled" if compiled else "eager"
    store = check.workdir / f"recipe-{label}.db"
    flags = [*size.recipe, "--dataset", str(data), "--compile", str(compiled).lower()]
    result = check.train(f"recipe-{label}", flags, store, size.timeouts["recipe"])
    with _open(store) as opened:
        run = opened.get_run(1)
        per_step = step_time(opened, 1)
        val = [v for v in _series(opened, 1, spec.VAL_LOSS).values() if math.isfinite(v)]
    final = run.final or {}
    tokens = final.get("tokens_per_sec")
    batch = run.config["train"]["batch_size"] * run.config["model"]["block_size"]
    memory, source = _memory(result)
    row = {
        "case": label,
        "device": run.device,
        "precision": run.precision,
        "status": run.status,
        "steps": final.get("steps"),
        "step_ms_median": None if per_step is None else round(per_step * 1e3, 2),
        "step_ms_mean": round(batch / tokens * 1e3, 2) if tokens else None,
        "best_val_loss": round(min(val), 4) if val else None,
        "final_val_loss": final.get("val_loss"),
        "peak_mib": memory,
        "memory": source,
        "wall_s": result["wall_s"],
    }
    if run.status != "completed":
        row["error"] = f"status {run.status}"
    return row


def part_recipe(check: Check, size: Size, data: Path | None) -> list[dict[str, Any]]:
    """nanoGPT's shakespeare_char recipe, eager and compiled: step time, best val loss."""
    if data is None or not data.is_file():
        looked = [str(p / CORPUS) for p in CORPUS_PLACES] if data is None else [str(data)]
        raise CheckError(f"no {CORPUS}: looked at {', '.join(looked)}; pass --data PATH")
    rows = []
    for compiled in (True, False):  # compiled first: the target is nanoGPT's compiled step
        label = "compiled" if compiled else "eager"
        if compiled and not size.compile_recipe:
            rows.append({"case": label, "skipped": "toy size: compiling on a CPU takes ~50 s"})
            continue
        try:
            rows.append(recipe_case(check, size, data, compiled))
        except Exception as failed:  # the other one still runs
            rows.append({"case": label, "error": f"{type(failed).__name__}: {failed}"})
    return rows


def _every_series(store: Any, run_id: int, after: int) -> dict[tuple[Any, ...], float]:
    """Every scalar and layer statistic a run logged after step `after`, timings left out."""
    values: dict[tuple[Any, ...], float] = {}
    scalars = store.scalars(run_id)
    for name, step, value in zip(scalars["name"], scalars["step"], scalars["value"], strict=True):
        if name not in TIMINGS and step > after:
            values[("scalar", name, int(step))] = float(value)
    layers = store.layer_stats(run_id, after_step=after)
    keys = zip(layers["kind"], layers["component"], layers["stat"], layers["layer"], strict=True)
    for (kind, component, stat, layer), step, value in zip(
        keys, layers["step"], layers["value"], strict=True
    ):
        values[(kind, component, stat, int(layer), int(step))] = float(value)
    return values


def part_fork(check: Check, size: Size) -> list[dict[str, Any]]:
    """A no-change fork against its parent, over everything both logged after the fork."""
    store = check.workdir / "fork.db"
    timeout = size.timeouts["fork"]
    check.train("fork-parent", size.fork, store, timeout)
    step = str(size.fork_step)
    result = check.blockviz("fork", ["fork", "1", "--step", step], store, timeout)
    with _open(store) as opened:
        fork = opened.get_run(2)
        parent_values = _every_series(opened, 1, size.fork_step)
        fork_values = _every_series(opened, 2, size.fork_step)
    diff, compared = largest_difference(parent_values, fork_values)
    row = {
        "case": f"fork at step {size.fork_step}, no change",
        "device": fork.device,
        "status": fork.status,
        "values_compared": compared,
        "only_in_one": len(set(parent_values) ^ set(fork_values)),
        "max_abs_diff": diff,
        "wall_s": result["wall_s"],
    }
    if fork.status != "completed" or compared == 0:
        row["error"] = f"fork {fork.status}, {compared} values compared"
    elif diff != 0:
        row["error"] = f"a no-change fork differs from its parent by up to {diff:.3g}"
    return [row]


# ---------------------------------------------------------------------------- the output


def machine() -> dict[str, Any]:
    """The GPU, torch and lightning versions, in a process of their own (no CUDA context
    held here), and the load average."""
    probe = (
        "import json, torch, lightning\n"
        "cuda = torch.cuda.is_available()\n"
        "print(json.dumps({'torch': torch.__version__, 'lightning': lightning.__version__,"
        " 'cuda': cuda, 'gpu': torch.cuda.get_device_name(0) if cuda else None}))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    info = json.loads(found.stdout.strip().splitlines()[-1]) if found.returncode == 0 else {}
    return {
        "gpu": info.get("gpu"),
        "torch": info.get("torch"),
        "lightning": info.get("lightning"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "host": platform.node(),
        "load_before": _load(),
    }


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(rows: list[dict[str, Any]]) -> str:
    """A part's rows as a plain table: the columns of its rows in order, lists left out;
    an error row shows its message's first line."""
    columns: list[str] = []
    for row in rows:
        for key, value in row.items():
            if key not in columns and key != "error" and not isinstance(value, list):
                columns.append(key)
    lines = [" | ".join(columns)]
    for row in rows:
        line = " | ".join(_cell(row.get(column)) for column in columns)
        if "error" in row:
            line += " | ERROR: " + row["error"].splitlines()[0]
        lines.append(line)
    return "\n".join(lines)


# The order they run in: the short ones first, so a tight --budget_s cuts the recipe.
PARTS = ("replicas", "equality", "fork", "recipe")


def run_parts(
    check: Check,
    size: Size,
    data: Path | None,
    report: Callable[[dict[str, Any]], None],
    wanted: tuple[str, ...] = PARTS,
) -> dict[str, Any]:
    """The wanted parts in turn; a part that raises gets one error row and the next one
    runs. `report` gets the parts so far after each."""
    parts: dict[str, dict[str, Any]] = {}
    kept: dict[str, Any] = {"stores": {}}
    for part in (p for p in PARTS if p in wanted):
        began = time.perf_counter()
        try:
            if part == "replicas":
                rows, kept = part_replicas(check, size)
            elif part == "equality":
                rows = part_equality(kept)
            elif part == "recipe":
                rows = part_recipe(check, size, data)
            else:
                rows = part_fork(check, size)
        except Exception as failed:  # one part's failure is a row; the rest go on
            rows = [{"case": part, "error": f"{type(failed).__name__}: {failed}"}]
        seconds = round(time.perf_counter() - began, 1)
        parts[part] = {"seconds": seconds, "rows": rows, "ok": not any("error" in r for r in rows)}
        print(f"\n## {part} ({seconds} s)\n{table(rows)}", flush=True)
        for row in rows:
            if "error" in row and "\n" in row["error"]:
                print("  " + row["error"][-1500:].replace("\n", "\n  "), flush=True)
        report(parts)
    return parts


def _last(flags: list[str], name: str) -> str:
    """The value of a flag's last occurrence (the one argparse keeps)."""
    return flags[len(flags) - 1 - flags[::-1].index(name) + 1]


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _ints(text: str) -> list[int]:
    try:
        return [int(part) for part in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not integers: {text!r}") from None


def default_data() -> Path | None:
    return next((p / CORPUS for p in CORPUS_PLACES if (p / CORPUS).is_file()), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1], argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), default="full")
    parser.add_argument("--accelerator", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument("--data", type=Path, default=None, help=f"the {CORPUS} file")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    parser.add_argument(
        "--parts", type=_names, default=PARTS, help=f"comma-separated, of {','.join(PARTS)}"
    )
    parser.add_argument("--ks", type=_ints, default=None, help="batch sizes K, comma-separated")
    parser.add_argument("--recipe_steps", type=int, default=None, help="the recipe's steps")
    parser.add_argument(
        "--budget_s",
        type=float,
        default=BUDGET_S,
        help=f"every run ends by then, cut short if need be (default {BUDGET_S:.0f})",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown or not args.parts:
        parser.error(f"--parts: {', '.join(unknown) or 'none'}; choose from {', '.join(PARTS)}")
    if args.ks is not None and (not args.ks or min(args.ks) < 1):
        parser.error("--ks: positive integers, comma-separated")
    if args.recipe_steps is not None and args.recipe_steps < 1:
        parser.error("--recipe_steps: a positive integer")
    if not args.budget_s > 0:
        parser.error("--budget_s: a positive number of seconds")
    size = SIZES[args.size]
    if args.ks is not None:
        size = dataclasses.replace(size, ks=tuple(args.ks))
    if args.recipe_steps is not None:
        warmup = min(args.recipe_steps, int(_last(size.recipe, "--warmup_steps")))
        steps = ["--max_steps", str(args.recipe_steps), "--warmup_steps", str(warmup)]
        size = dataclasses.replace(size, recipe=[*size.recipe, *steps])
    data = args.data if args.data is not None else default_data()
    started = time.perf_counter()
    info = machine()
    print(
        f"blockviz device check, size {args.size}, accelerator {args.accelerator}\n"
        f"GPU: {info['gpu'] or 'none'}; torch {info['torch']}; lightning {info['lightning']}; "
        f"python {info['python']}; {info['cpus']} CPUs; load average {info['load_before']}\n"
        f"data: {data}\nreference: {NANOGPT}",
        flush=True,
    )
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "size": args.size,
        "accelerator": args.accelerator,
        "data": None if data is None else str(data),
        "machine": info,
        "reference": NANOGPT,
        "flags": {"replicas": size.replicas, "recipe": size.recipe, "fork": size.fork},
    }

    def report(parts: dict[str, Any]) -> None:
        result["parts"] = parts
        result["failed"] = [name for name, part in parts.items() if not part["ok"]]
        result["load_after"] = _load()
        result["total_s"] = round(time.perf_counter() - started, 1)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1, default=str) + "\n", "utf-8")

    with tempfile.TemporaryDirectory(prefix="blockviz-gpu-check-") as tmp:
        check = Check(args.accelerator, Path(tmp), time.monotonic() + args.budget_s)
        run_parts(check, size, data, report, args.parts)
    print(
        f"\n{result['total_s']} s in all; load average {result['load_after']}; "
        f"failed: {', '.join(result['failed']) or 'none'}"
        + (f"; wrote {args.out}" if args.out else "")
    )
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
