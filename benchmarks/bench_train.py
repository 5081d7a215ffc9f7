"""Training throughput of `blockviz train` against a plain PyTorch loop, probe cost, memory.

Each measurement runs in a fresh worker process (this script with `--worker`):

- `full`: the real command, `python -m blockviz train --preset baby-cpu ...` (Lightning,
  BlockProbe at its default intervals, StoreLogger, checkpoints), called in-process in the
  worker through `blockviz.cli.main`; the numbers come from the run's final metrics and
  its `train/step_time` series in the store.
- `plain`: the same CharTransformer on the same batches (same data module and seed), the
  same AdamW groups and LR schedule, gradient clipping and the same evaluation cadence,
  in a bare loop: no Lightning, no probes, no store.

Both report tokens/s while training (evaluation time excluded) over all steps and over
the steady state (steps >= 1: the one-off first step, with its allocations and the step-0
probe and sample, left out; the periodic probes and samples stay in), and the wall time
of the whole loop (evaluation included). Workers alternate (plain, full, full, plain, ...) so a
busy machine slows both alike; the script prints the medians and their ratio.

    .venv/bin/python benchmarks/bench_train.py --steps 300 --reps 5
    .venv/bin/python benchmarks/bench_train.py --accelerator gpu --precision auto --compile true
    .venv/bin/python benchmarks/bench_train.py --reps 0 --quality data/tinyshakespeare.txt
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: import this checkout's blockviz
RESULT_PREFIX = "BENCH_RESULT "


def _peak_memory() -> dict[str, float | None]:
    """Peak resident memory of this process (MiB) and peak CUDA memory when there is a GPU."""
    import torch

    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    cuda_mib = None
    if torch.cuda.is_available():
        cuda_mib = torch.cuda.max_memory_allocated() / 2**20
    return {"peak_rss_mib": rss_mib, "peak_cuda_mib": cuda_mib}


def _config_args(args: argparse.Namespace) -> list[str]:
    """The `blockviz train` flags shared by both workers."""
    flags = ["--preset", args.preset, "--max_steps", str(args.steps)]
    for name in ("dataset", "accelerator", "precision", "compile", "log_interval"):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name}", str(value)]
    for setting in args.set or []:
        name, _, value = setting.partition("=")
        flags += [f"--{name}", value]
    return flags


# ------------------------------------------------------------------------------ workers


def worker_full(args: argparse.Namespace) -> dict[str, Any]:
    """Run `blockviz train` in this process and read its numbers back from the store."""
    import numpy as np
    import torch

    from blockviz import cli
    from blockviz.store import RunStore

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        store_path = Path(tmp) / "blockviz.db"
        argv = ["train", *_config_args(args), "--store", str(store_path), "--no_progress"]
        started = time.perf_counter()
        code = cli.main(argv)
        process_s = time.perf_counter() - started
        if code != 0:
            raise SystemExit(f"blockviz train exited with {code}")
        with RunStore(store_path) as store:
            run = store.get_run(1)
            step_time = store.scalars(1, names=["train/step_time"]).set_index("step")["value"]
    train = run.config["train"]
    final = run.final
    steps = step_time.index.to_numpy()
    probe = (steps % train["probe_interval"] == 0) & (steps % train["sample_interval"] != 0)
    sample = steps % train["sample_interval"] == 0
    ordinary = ~(probe | sample) & (steps > 0)
    tokens_per_step = train["batch_size"] * run.config["model"]["block_size"]
    tokens = tokens_per_step * final["steps"]
    after_first = step_time[step_time.index > 0]
    return {
        "kind": "full",
        "tokens_per_sec": final["tokens_per_sec"],
        "steady_tokens_per_sec": tokens_per_step * len(after_first) / after_first.sum(),
        "wall_s": final["time_s"],
        "wall_tokens_per_sec": tokens / final["time_s"],
        "process_s": process_s,
        "val_loss": final["val_loss"],
        "train_loss": final["train_loss"],
        "device": run.device,
        "precision": run.precision,
        "n_params": run.n_params,
        "step_time_ordinary_s": float(np.median(step_time[ordinary])),
        "step_time_probe_s": float(np.median(step_time[probe])) if probe.any() else None,
        "step_time_sample_s": float(np.median(step_time[sample & (steps > 0)]))
        if (sample & (steps > 0)).any()
        else None,
        **_peak_memory(),
    }


def worker_plain(args: argparse.Namespace) -> dict[str, Any]:
    """The same model, batches, optimizer and schedule in a bare PyTorch loop."""
    import torch

    from blockviz import cli
    from blockviz.core import config as cfg
    from blockviz.core.flags import run_config_from_args
    from blockviz.training.data import CharDataModule
    from blockviz.training.lit import lr_at, param_groups
    from blockviz.training.model import CharTransformer
    from blockviz.training.trainer import resolve_precision

    if args.threads:
        torch.set_num_threads(args.threads)
    parsed = cli.build_parser().parse_args(["train", *_config_args(args)])
    config = run_config_from_args(parsed)
    train = config.train
    datamodule = CharDataModule(
        config.data, config.model.block_size, train.batch_size, train.seed, train.eval_iters
    )
    datamodule.setup()
    config = cfg.replace(config, vocab_size=datamodule.vocab.size)
    use_cuda = train.accelerator in ("auto", "gpu") and torch.cuda.is_available()
    device = torch.device("cuda" if use_cuda else "cpu")
    precision = resolve_precision(train.precision, "gpu" if use_cuda else "cpu")
    autocast_dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    torch.manual_seed(train.seed)
    model = CharTransformer(config.model).to(device)
    step_model = torch.compile(model) if train.compile else model
    optimizer = torch.optim.AdamW(
        param_groups(model, train.weight_decay), lr=train.lr, betas=(train.beta1, train.beta2)
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, train) / train.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "16-mixed")
    val_batches = [(x.to(device), y.to(device)) for x, y in datamodule.val_dataloader()]

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    eval_s = eval_before_steady = 0.0
    val_loss = float("nan")
    batches = iter(datamodule.train_dataloader())
    synchronize()
    started = first_done = time.perf_counter()
    for step in range(train.max_steps):
        if step == 1:  # steady state starts after the first step (allocations, warm-up)
            synchronize()
            first_done = time.perf_counter()
            eval_before_steady = eval_s
        x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast():
            _, loss = step_model(x, y)
        scaler.scale(loss).backward()
        if train.grad_clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if step % train.log_interval == 0:
            loss.item()  # what a logging loop does: one host sync per log_interval
        if (step + 1) % train.eval_interval == 0 or step + 1 == train.max_steps:
            synchronize()
            eval_started = time.perf_counter()
            model.eval()
            with torch.no_grad(), autocast():
                total = sum(step_model(vx, vy)[1].float() for vx, vy in val_batches)
            val_loss = float(total) / len(val_batches)
            model.train()
            eval_s += time.perf_counter() - eval_started
    synchronize()
    ended = time.perf_counter()
    wall_s = ended - started
    tokens_per_step = train.batch_size * config.model.block_size
    tokens = train.max_steps * tokens_per_step
    steady_s = ended - first_done - (eval_s - eval_before_steady)
    return {
        "kind": "plain",
        "tokens_per_sec": tokens / (wall_s - eval_s),
        "steady_tokens_per_sec": tokens_per_step * (train.max_steps - 1) / steady_s,
        "wall_s": wall_s,
        "wall_tokens_per_sec": tokens / wall_s,
        "val_loss": val_loss,
        "device": str(device),
        "precision": precision,
        **_peak_memory(),
    }


# ------------------------------------------------------------------------------- driver


def run_worker(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one worker process and parse its result line."""
    command = [sys.executable, __file__, "--worker", kind, *_forwarded(args)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise SystemExit(f"worker {kind} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def _forwarded(args: argparse.Namespace) -> list[str]:
    flags = ["--preset", args.preset, "--steps", str(args.steps)]
    for name in ("dataset", "accelerator", "precision", "compile", "log_interval", "threads"):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name}", str(value)]
    for setting in args.set or []:
        flags += ["--set", setting]
    return flags


def _median(results: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in results if r.get(key) is not None]
    return statistics.median(values) if values else None


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_at_start": os.getloadavg(),
    }
    try:
        import lightning

        info["lightning"] = lightning.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def main() -> int:
    """Parse flags; run a worker, or drive the comparison and print the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each side")
    parser.add_argument("--preset", default="baby-cpu")
    parser.add_argument("--dataset", help="dataset (default: the preset's, pydocs)")
    parser.add_argument("--accelerator", help="auto | cpu | gpu")
    parser.add_argument("--precision", help="auto | 32-true | bf16-mixed | 16-mixed")
    parser.add_argument("--compile", help="true | false: torch.compile both sides")
    parser.add_argument("--log_interval", help="steps between loss fetches (both sides)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads per worker")
    parser.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="any other config field for both sides, e.g. --set probe_interval=1000000",
    )
    parser.add_argument(
        "--quality", metavar="TEXT", help="also train the preset to its max_steps on this file"
    )
    parser.add_argument("--quality_steps", type=int, default=2000, help="steps of that run")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--worker", choices=["full", "plain"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        result = worker_full(args) if args.worker == "full" else worker_plain(args)
        print(RESULT_PREFIX + json.dumps(result))
        return 0

    report: dict[str, Any] = {"command": " ".join(sys.argv), "machine": machine(), "runs": []}
    plain, full = [], []
    for rep in range(args.reps):
        order = ("plain", "full") if rep % 2 == 0 else ("full", "plain")
        for kind in order:
            result = run_worker(kind, args)
            (plain if kind == "plain" else full).append(result)
            report["runs"].append(result)
            print(
                f"rep {rep} {kind:5s}: {result['steady_tokens_per_sec']:9.0f} tok/s steady, "
                f"{result['tokens_per_sec']:9.0f} tok/s training, "
                f"{result['wall_tokens_per_sec']:9.0f} tok/s wall, "
                f"val_loss {result['val_loss']:.4f}",
                flush=True,
            )
    if plain and full:
        summary = {
            "plain_tokens_per_sec": _median(plain, "tokens_per_sec"),
            "full_tokens_per_sec": _median(full, "tokens_per_sec"),
            "plain_wall_tokens_per_sec": _median(plain, "wall_tokens_per_sec"),
            "full_wall_tokens_per_sec": _median(full, "wall_tokens_per_sec"),
            "ratios_training": [
                f["tokens_per_sec"] / p["tokens_per_sec"] for p, f in zip(plain, full, strict=True)
            ],
            "ratios_steady": [
                f["steady_tokens_per_sec"] / p["steady_tokens_per_sec"]
                for p, f in zip(plain, full, strict=True)
            ],
            "ratios_wall": [
                f["wall_tokens_per_sec"] / p["wall_tokens_per_sec"]
                for p, f in zip(plain, full, strict=True)
            ],
            "step_time_ordinary_s": _median(full, "step_time_ordinary_s"),
            "step_time_probe_s": _median(full, "step_time_probe_s"),
            "step_time_sample_s": _median(full, "step_time_sample_s"),
            "full_peak_rss_mib": _median(full, "peak_rss_mib"),
            "plain_peak_rss_mib": _median(plain, "peak_rss_mib"),
            "full_peak_cuda_mib": _median(full, "peak_cuda_mib"),
            "plain_peak_cuda_mib": _median(plain, "peak_cuda_mib"),
        }
        summary["ratio_training_median"] = statistics.median(summary["ratios_training"])
        summary["ratio_steady_median"] = statistics.median(summary["ratios_steady"])
        summary["ratio_wall_median"] = statistics.median(summary["ratios_wall"])
        if summary["step_time_probe_s"]:
            summary["probe_step_cost"] = (
                summary["step_time_probe_s"] / summary["step_time_ordinary_s"]
            )
        if summary["step_time_sample_s"]:
            summary["sample_step_cost"] = (
                summary["step_time_sample_s"] / summary["step_time_ordinary_s"]
            )
        report["summary"] = summary
        print(json.dumps(summary, indent=2))
    if args.quality:
        quality_args = argparse.Namespace(
            **{**vars(args), "dataset": args.quality, "steps": args.quality_steps}
        )
        quality = run_worker("full", quality_args)
        report["quality"] = quality
        print("quality:", json.dumps(quality, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
