"""How long one solo training step takes, and where its host time goes (issue 34).

Runs the real `blockviz train` in this process (flags parsed by the CLI, the run
registered in a throw-away store, the product's own Trainer, probes, loggers and
checkpoints) with a clock added to the Trainer's callbacks, and prints:

- the mean (and median) wall time of ordinary steps, of probe steps and of sample steps
  (validation and the checkpoints after it are left out of the step they follow);
- tokens/s of the ordinary steps and of all training steps;
- the CPU time of an ordinary step (`time.process_time`), and the top host-side ops of 5
  profiled ordinary steps (torch.profiler, CPU activity, plus CUDA where there is one),
  per step; with `--python`, the top Python functions of 20 other ordinary steps
  (cProfile); with `--hooks`, Lightning's own timing of each hook and loop action
  (its SimpleProfiler: about 3 ms a step more on the H100 box).

    python benchmarks/solo_step.py --accelerator gpu                 # H100 box: about 25 s
    python benchmarks/solo_step.py --accelerator gpu --compile --out solo.json   # about 50 s
    python benchmarks/solo_step.py --accelerator gpu --compile-mode default
    python benchmarks/solo_step.py --accelerator cpu --threads 1 --set n_layer=1 \
        --set d_model=16 --set block_size=16 --set batch_size=4      # host work on a CPU

`--compile` compiles as the product does (`lit.compile_mode`: on one GPU reduce-overhead,
which replays the step's forward and backward as CUDA graphs); `--compile-mode MODE`
another way (`default`: torch's default mode, no graphs).
On a GPU nothing waits for the device in an ordinary step unless the code makes it, so
the mean over many steps is what a step really costs: max(host work, device work).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import platform
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: import this checkout's blockviz

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.profilers import SimpleProfiler  # noqa: E402

PROFILED_STEPS = 5  # ordinary steps measured under torch.profiler (left out of the timings)
PYTHON_STEPS = 20  # ordinary steps measured under cProfile with --python (likewise)
TOP_OPS = 10


class StepClock(L.Callback):
    """The wall and CPU time of each training step, and profiles of a few ordinary ones.

    A step's time runs from the end of the step before (or of the validation and
    checkpoints after it) to the end of this step's last callback: the batch's loading,
    forward, backward, update and every callback. Appended last, its hooks run after all
    of the run's own. Steps under a profiler are left out of the timings: the Python
    profile (`python`) covers PYTHON_STEPS steps before `profile_from`, torch.profiler the
    PROFILED_STEPS from `profile_from` on.
    """

    def __init__(self, profile_from: int, python: bool) -> None:
        self.wall: dict[int, float] = {}
        self.cpu: dict[int, float] = {}
        self.profile_from = profile_from
        self.profiled: list[int] = []
        self.torch_profile: torch.profiler.profile | None = None
        self.python = cProfile.Profile() if python else None
        self.python_steps: list[int] = []
        self._step = 0
        self._wall = self._cpu = 0.0

    def _sync(self, trainer: L.Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()

    def _restart(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the first step's clock."""
        self._sync(trainer)
        self._restart()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Note the step being trained."""
        self._step = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        """Read the clocks; start or stop the profilers around the profiled steps."""
        step, python_from = self._step, self.profile_from - PYTHON_STEPS - 5
        if self.python is not None and python_from <= step < python_from + PYTHON_STEPS:
            self.python_steps.append(step)
        elif self.profile_from <= step < self.profile_from + PROFILED_STEPS:
            self._sync(trainer)  # the profiled steps' device work belongs to them
            self.profiled.append(step)
        else:
            self.wall[step] = time.perf_counter() - self._wall
            self.cpu[step] = time.process_time() - self._cpu
        if self.python is not None and step + 1 == python_from:
            self.python.enable()
        elif self.python is not None and step + 1 == python_from + PYTHON_STEPS:
            self.python.disable()
        elif step + 1 == self.profile_from:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if trainer.strategy.root_device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._sync(trainer)
            self.torch_profile = torch.profiler.profile(activities=activities)
            self.torch_profile.start()
        elif step + 1 == self.profile_from + PROFILED_STEPS and self.torch_profile is not None:
            self.torch_profile.stop()
        self._restart()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Leave validation (and the checkpoints written after it) out of the next step."""
        self._restart()

    def top_ops(self, count: int = TOP_OPS) -> list[dict[str, Any]]:
        """The profiled steps' ops with the most host time of their own, per step."""
        if self.torch_profile is None or not self.profiled:
            return []
        steps = len(self.profiled)
        events = self.torch_profile.key_averages()
        events = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
        return [
            {
                "op": event.key,
                "calls_per_step": event.count / steps,
                "self_cpu_us_per_step": event.self_cpu_time_total / steps,
                "cpu_total_us_per_step": event.cpu_time_total / steps,
                "device_us_per_step": getattr(event, "self_device_time_total", 0.0) / steps,
            }
            for event in events[:count]
        ]

    def top_python(self, count: int = 30) -> str:
        """The Python-profiled steps' functions with the most time, own and inclusive."""
        if self.python is None or not self.python_steps:
            return ""
        out = io.StringIO()
        out.write(f"cProfile of ordinary steps {self.python_steps[0]}-{self.python_steps[-1]}\n")
        stats = pstats.Stats(self.python, stream=out)
        stats.sort_stats("tottime").print_stats(count)
        stats.sort_stats("cumtime").print_stats(count)
        return out.getvalue()


def _kinds(train: dict[str, Any], steps: list[int]) -> dict[str, list[int]]:
    """The timed steps by kind: ordinary, probe, sample (step 0 is none of them: first call)."""
    from blockviz.core.probe_schedule import is_probe_step

    last = train["max_steps"] - 1
    kinds: dict[str, list[int]] = {"ordinary": [], "probe": [], "sample": []}
    for step in steps:
        if step == 0:
            continue
        if step % train["sample_interval"] == 0:
            kinds["sample"].append(step)
        elif is_probe_step(step, train["probe_interval"], last):
            kinds["probe"].append(step)
        else:
            kinds["ordinary"].append(step)
    return kinds


def _summary(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "mean_ms": None, "median_ms": None}
    return {
        "n": len(values),
        "mean_ms": 1e3 * statistics.fmean(values),
        "median_ms": 1e3 * statistics.median(values),
    }


def _hook_times(hooks: SimpleProfiler, steps: int, count: int = 25) -> list[dict[str, Any]]:
    """Lightning's per-step actions (hooks of each callback, the module, the loop) by the
    median time of one call times calls per step, most first."""
    rows = []
    for action, durations in hooks.recorded_durations.items():
        per_step = len(durations) / steps
        if per_step < 0.9:  # not a per-step action (setup, validation, probe-only)
            continue
        median = statistics.median(durations)
        rows.append({"action": action, "per_step": per_step, "median_us": 1e6 * median})
    rows.sort(key=lambda row: row["median_us"] * row["per_step"], reverse=True)
    return rows[:count]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Train once with the clock in the Trainer; the numbers as a dict."""
    from blockviz import cli
    from blockviz.store import RunStore
    from blockviz.training import lit

    if args.threads:
        torch.set_num_threads(args.threads)
    profile_from = max(1, args.steps - 20)
    clock = StepClock(profile_from, args.python)
    fit = L.Trainer.fit

    hooks = SimpleProfiler() if args.hooks else None

    def fit_with_clock(trainer: L.Trainer, *a: Any, **kw: Any) -> Any:
        trainer.callbacks.append(clock)
        if hooks is not None:
            trainer.profiler = hooks
        return fit(trainer, *a, **kw)

    flags = ["--preset", args.preset, "--max_steps", str(args.steps)]
    flags += ["--accelerator", args.accelerator, "--precision", args.precision]
    flags += ["--compile", "true" if args.compile or args.compile_mode else "false"]
    real_mode = lit.compile_mode
    if args.compile_mode:  # another mode than the product's (lit.compile_mode) for the step
        mode = None if args.compile_mode == "default" else args.compile_mode
        lit.compile_mode = lambda device, world_size: mode
    for setting in args.set or []:
        name, _, value = setting.partition("=")
        flags += [f"--{name}", value]
    with tempfile.TemporaryDirectory() as tmp:
        store_path = Path(tmp) / "blockviz.db"
        argv = ["train", *flags, "--store", str(store_path), "--no_progress"]
        started = time.perf_counter()
        L.Trainer.fit = fit_with_clock
        try:
            with contextlib.redirect_stdout(sys.stderr):
                code = cli.main(argv)
        finally:
            L.Trainer.fit = fit
            lit.compile_mode = real_mode
        process_s = time.perf_counter() - started
        if code != 0:
            raise SystemExit(f"blockviz train exited with {code}")
        with RunStore(store_path) as store:
            run = store.get_run(1)
    train, model = run.config["train"], run.config["model"]
    kinds = _kinds(train, sorted(clock.wall))
    tokens = train["batch_size"] * model["block_size"]
    ordinary = [clock.wall[s] for s in kinds["ordinary"]]
    timed = sorted(clock.wall)
    steps_s = sum(clock.wall[s] for s in timed)
    result: dict[str, Any] = {
        "device": run.device,
        "precision": run.precision,
        "compile": bool(train["compile"]),
        "compile_mode": args.compile_mode,
        "machine": platform.node(),
        "torch": torch.__version__,
        "lightning": L.__version__,
        "config": {**model, **{k: train[k] for k in ("batch_size", "max_steps", "log_interval")}},
        "intervals": {k: train[k] for k in ("probe_interval", "sample_interval", "eval_interval")},
        "n_params": run.n_params,
        "steps": {kind: _summary([clock.wall[s] for s in found]) for kind, found in kinds.items()},
        "first_step_ms": 1e3 * clock.wall.get(0, float("nan")),
        "ordinary_cpu_ms": _summary([clock.cpu[s] for s in kinds["ordinary"]])["mean_ms"],
        "tokens_per_sec_ordinary": tokens / statistics.fmean(ordinary) if ordinary else None,
        "tokens_per_sec_training": tokens * len(timed) / steps_s if steps_s else None,
        "final": run.final,
        "process_s": process_s,
        "profiled_steps": clock.profiled,
        "top_ops": clock.top_ops(),
        "top_python": clock.top_python(),
        "hooks": _hook_times(hooks, train["max_steps"]) if hooks is not None else [],
    }
    return result


def report(result: dict[str, Any]) -> str:
    """The numbers as text."""
    lines = [
        f"device {result['device']}, {result['precision']}, compile {result['compile']} "
        f"({result['compile_mode'] or 'the product mode'}), "
        f"torch {result['torch']}, lightning {result['lightning']}, {result['n_params']:,} params",
        "step kind   n     mean ms  median ms",
    ]
    for kind, summary in result["steps"].items():
        if summary["n"]:
            mean, median = summary["mean_ms"], summary["median_ms"]
            lines.append(f"{kind:9s} {summary['n']:3d} {mean:10.3f} {median:10.3f}")
    lines.append(f"first step {result['first_step_ms']:.1f} ms")
    if result["ordinary_cpu_ms"] is not None:
        lines.append(f"ordinary step CPU time {result['ordinary_cpu_ms']:.3f} ms (process_time)")
    for key in ("tokens_per_sec_ordinary", "tokens_per_sec_training"):
        if result[key]:
            lines.append(f"{key} {result[key]:,.0f}")
    lines.append(f"process {result['process_s']:.1f} s")
    if result["top_ops"]:
        lines.append(f"top host ops of ordinary steps {result['profiled_steps']}, per step:")
        lines.append(f"{'self CPU us':>12s} {'total us':>10s} {'device us':>10s} {'calls':>6s}  op")
        for op in result["top_ops"]:
            lines.append(
                f"{op['self_cpu_us_per_step']:12.1f} {op['cpu_total_us_per_step']:10.1f} "
                f"{op['device_us_per_step']:10.1f} {op['calls_per_step']:6.1f}  {op['op']}"
            )
    if result["hooks"]:
        lines.append("Lightning's per-step actions (median of a call):")
        for row in result["hooks"]:
            lines.append(f"{row['median_us']:10.1f} us x {row['per_step']:4.1f}  {row['action']}")
    if result["top_python"]:
        lines.append(result["top_python"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse, measure, print (and write --out)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), default="gpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile the step")
    parser.add_argument(
        "--compile-mode",
        help="compile with this torch.compile mode instead of the product's "
        "(lit.compile_mode: reduce-overhead on one GPU); `default`: torch's default",
    )
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--preset", default="baby-cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument(
        "--set", action="append", metavar="NAME=VALUE", help="a `train` flag, e.g. n_layer=1"
    )
    parser.add_argument("--python", action="store_true", help="also cProfile the profiled steps")
    parser.add_argument(
        "--hooks", action="store_true", help="time Lightning's hooks (its SimpleProfiler)"
    )
    parser.add_argument("--out", type=Path, help="write the numbers as JSON here")
    args = parser.parse_args(argv)
    if args.accelerator == "gpu" and not torch.cuda.is_available():
        parser.error("--accelerator gpu: torch sees no CUDA GPU here (use --accelerator cpu)")
    least = PYTHON_STEPS + PROFILED_STEPS + 40
    if args.steps < least:
        parser.error(f"--steps {args.steps}: at least {least} (the profiles and the timings)")
    result = measure(args)
    print(report(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
