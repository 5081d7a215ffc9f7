"""The host work of a solo training step (issue 34): what an ordinary step reads back from
the device, the losses read one logged step late (as on a GPU), a compiled step that
compiles once, and the benchmark that measures it all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.overrides import TorchFunctionMode

from blockviz.core.probe_schedule import is_probe_step
from blockviz.store import RunStore
from blockviz.training import callbacks
from blockviz.training.callbacks import training_monitor
from blockviz.training.lifecycle import StopRequest
from blockviz.training.lit import LitCharModel, compile_mode
from blockviz.training.logger import RunLifecycle, StoreLogger
from blockviz.training.probes import BlockProbe
from blockviz.training.sinks import StoreSink
from blockviz.training.trainer import make_trainer, quiet_lightning
from tests import helpers

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[2]
TRAIN_SCALARS = ["train/loss", "train/lr"]


class HostReads(TorchFunctionMode):
    """Records the tensor methods that copy values to the host (a sync on an accelerator),
    but for reads of the tensors in `host_only` (the optimizer's step counts, which live on
    the host on a GPU too)."""

    READS = frozenset({"tolist", "item", "cpu", "numpy", "__float__", "__int__", "__bool__"})

    def __init__(self, host_only: set[int]) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.host_only = host_only

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.READS and not (args and id(args[0]) in self.host_only):
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


class StepReads(Callback):
    """Each training step's host reads, from its first hook (first in line) to its last
    (`Last`, appended after the Trainer's own callbacks)."""

    def __init__(self) -> None:
        self.reads: dict[int, list[str]] = {}
        self._mode: HostReads | None = None
        self._step = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step
        steps = [state.get("step") for state in trainer.optimizers[0].state.values()]
        self._mode = HostReads({id(step) for step in steps if step is not None})
        self._mode.__enter__()

    def close(self) -> None:
        """The step's last hook has run (`Last` calls this)."""
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self.reads[self._step] = self._mode.reads
            self._mode = None


class StepNumber(Callback):
    """Keeps `reads._step` current without reading anything."""

    def __init__(self, reads: StepReads) -> None:
        self.step_reads = reads

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step_reads._step = trainer.global_step


class Last(Callback):
    """Ends StepReads' window after every other callback."""

    def __init__(self, reads: StepReads) -> None:
        self.step_reads = reads

    def on_train_batch_end(self, *args) -> None:
        self.step_reads.close()


def product_fit(tmp_path, defer: bool | None, extra=(), module=LitCharModel, **overrides):
    """A tiny fit with a run's own callbacks (probe, store logger, lifecycle, monitor,
    checkpoints) writing a store; the store, the run id, the trainer and the step reads."""
    quiet_lightning()
    config = helpers.tiny_config(**overrides)
    dm, config = helpers.tiny_datamodule(config)
    store = RunStore(tmp_path / "runs.db")
    run_id = store.create_run("solo", config.to_json(), status="running")
    train = config.train
    probe = BlockProbe(
        [[StoreSink(store, run_id)]],
        probe_interval=train.probe_interval,
        sample_interval=train.sample_interval,
        sample_chars=8,
    )
    lifecycle = RunLifecycle(StopRequest(), (), store, [run_id])
    reads = StepReads()
    torch.manual_seed(train.seed)
    lit = module(config.to_dict(), dm.vocab.to_json())
    trainer = make_trainer(
        config, [reads, *extra, lifecycle, probe], StoreLogger(store, run_id), run_dir=tmp_path
    )
    trainer.callbacks.append(Last(reads))
    training_monitor(trainer).defer = defer
    trainer.fit(lit, datamodule=dm)
    store.flush()
    return store, run_id, trainer, reads


def scalars(store: RunStore, run_id: int, names: list[str]) -> list[tuple[int, str, float]]:
    frame = store.scalars(run_id, names=names)
    return sorted(zip(frame.step, frame.name, frame.value, strict=True))


class AutomaticCharModel(LitCharModel):
    """The step as Lightning's automatic optimization ran it before the module stepped
    itself: training_step returns the loss, Lightning runs backward, the probes' hook,
    clipping (torch's `clip_grad_norm_`), the update (AdamW's per-tensor loop, as a CPU
    ran it) and the schedule."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.automatic_optimization = True

    def training_step(self, batch, batch_idx):
        loss, outputs = self.objective(batch)
        return {**outputs, "loss": loss}

    def on_before_optimizer_step(self, optimizer) -> None:
        """Lightning clips after this hook itself."""

    def configure_gradient_clipping(self, optimizer, *args, **kwargs) -> None:
        """torch's clip_grad_norm_, through Lightning's precision plugin."""
        if self.config.train.grad_clip:
            self.clip_gradients(optimizer, self.config.train.grad_clip, "norm")

    def configure_optimizers(self):
        setup = super().configure_optimizers()
        optimizer = setup["optimizer"]
        for group in optimizer.param_groups:
            group["foreach"] = False  # the per-tensor loop a CPU ran
        return {**setup, "lr_scheduler": {"scheduler": setup["lr_scheduler"], "interval": "step"}}


# Scalars that are clocks, not numerics.
CLOCKS = {"train/step_time", "train/tokens_per_sec", "train/elapsed_s"}


def recorded(store: RunStore, run_id: int) -> tuple[list, list, list]:
    """Every scalar but the clocks, every per-layer row and every text sample of a run."""
    frame = store.scalars(run_id)
    rows = sorted(
        (step, name, value)
        for step, name, value in zip(frame.step, frame.name, frame.value, strict=True)
        if name not in CLOCKS
    )
    layers = store.layer_stats(run_id)
    columns = [c for c in layers.columns if c != "run_id"]
    # NaN (a ratio of a zero norm) never equals itself: compared as text
    layer_rows = sorted(
        tuple("nan" if v != v else v for v in row) for row in layers[columns].to_numpy().tolist()
    )
    return rows, layer_rows, store.samples(run_id).text.tolist()


@pytest.mark.parametrize(
    "overrides",
    [
        {"grad_clip": 0.05, "dropout": 0.1},  # clipping every step, dropout's masks drawn
        {"grad_clip": 0.0, "z_loss": 1e-3, "lr_schedule": "cosine", "warmup_steps": 3},
    ],
)
def test_the_module_steps_itself_exactly_as_lightnings_automatic_loop_did(tmp_path, overrides):
    # Issue 34: the one-call step (manual optimization) records every loss and statistic
    # of the automatic loop it replaced, bit for bit, probe steps and evaluations included.
    overrides = {"max_steps": 12, "eval_interval": 5, "probe_interval": 4, **overrides}
    new, new_id, trainer, _ = product_fit(tmp_path / "new", defer=None, **overrides)
    old, old_id, _, _ = product_fit(
        tmp_path / "old", defer=None, module=AutomaticCharModel, **overrides
    )
    assert trainer.global_step == 12
    rows, layers, samples = recorded(new, new_id)
    assert {name for _, name, _ in rows} >= {"train/loss", "train/lr", "val/loss"}
    assert layers and samples
    assert (rows, layers, samples) == recorded(old, old_id)


class Steps(Callback):
    """The steps a fit trains."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.steps.append(trainer.global_step)


def test_a_checkpoint_of_the_automatic_loop_resumes_at_its_step(tmp_path):
    # Checkpoints written before the module stepped itself count their steps under
    # Lightning's automatic optimization: a resume (or a fork) from one goes on from there.
    product_fit(tmp_path, defer=None, module=AutomaticCharModel, max_steps=6, eval_interval=3)
    config = helpers.tiny_config(max_steps=10, eval_interval=3)
    dm, config = helpers.tiny_datamodule(config)
    steps = Steps()
    trainer = make_trainer(config, [steps], None, run_dir=tmp_path / "resumed")
    lit = LitCharModel(config.to_dict(), dm.vocab.to_json())
    trainer.fit(lit, datamodule=dm, ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    assert steps.steps == [6, 7, 8, 9]
    assert trainer.global_step == 10


@pytest.mark.parametrize("log_interval", [1, 3])
def test_losses_read_a_logged_step_late_record_what_read_at_once_do(tmp_path, log_interval):
    overrides = {"max_steps": 8, "eval_interval": 3, "log_interval": log_interval}
    at_once, run_a, *_ = product_fit(tmp_path / "a", defer=False, **overrides)
    late, run_b, trainer, _ = product_fit(tmp_path / "b", defer=True, **overrides)
    expected = scalars(at_once, run_a, TRAIN_SCALARS)
    assert expected and scalars(late, run_b, TRAIN_SCALARS) == expected
    assert scalars(late, run_b, ["train/step_time"])[0][0] == 0
    steps = [step for step, name, _ in expected if name == "train/loss"]
    assert steps[-1] == 7  # the last step is logged, at once
    assert training_monitor(trainer)._in_flight is None


def test_an_ordinary_step_reads_nothing_back_but_the_logged_step_before(tmp_path, monkeypatch):
    """With losses read late (a GPU's way), an ordinary step's one host read is the losses
    of the step before, whose copy finished while this step's work was queued."""
    read_windows: list[tuple[int, int]] = []  # (the step reading, how many losses)
    real = callbacks.read_host
    clock = StepReads()  # only for its step number

    def counted(values, ready):
        read_windows.append((clock._step, values.numel()))
        return real(values, ready)

    monkeypatch.setattr(callbacks, "read_host", counted)
    overrides = {"max_steps": 12, "eval_interval": 100, "ckpt_interval": 0}
    overrides |= {"probe_interval": 5, "sample_interval": 100}
    _, _, _, reads = product_fit(tmp_path, defer=True, extra=[StepNumber(clock)], **overrides)
    probes = {s for s in range(12) if is_probe_step(s, 5, 11)}
    assert probes == {0, 5, 10, 11}
    for step, found in reads.reads.items():
        if step in probes:
            continue
        # the previous step's window (step 0's at step 1, ...), and nothing else
        assert found == ["tolist"], (step, found)
    # each step's loss is read at the step after it (the last at once): never the losses
    # of the step just queued
    assert read_windows == [(step + 1, 1) for step in range(11)] + [(11, 1)]


def test_an_ordinary_step_reads_the_losses_at_once_on_a_cpu(tmp_path):
    store, run_id, trainer, reads = product_fit(
        tmp_path, defer=None, max_steps=4, eval_interval=100, probe_interval=100
    )
    assert training_monitor(trainer).defer is None  # auto: at once on a CPU
    assert [step for step, name, _ in scalars(store, run_id, ["train/loss"])] == [0, 1, 2, 3]
    assert reads.reads[1] == ["tolist"] and reads.reads[2] == ["tolist"]


class RowsAtCheckpoint(Callback):
    """The train/loss steps the store logger has taken when each checkpoint is written."""

    def __init__(self, store: RunStore, run_id: int) -> None:
        self.store, self.run_id = store, run_id
        self.seen: dict[int, list[int]] = {}

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.store.flush()
        frame = self.store.scalars(self.run_id, names=["train/loss"])
        self.seen[trainer.global_step] = sorted(set(frame.step.tolist()))


def test_a_checkpoint_holds_every_loss_in_flight(tmp_path):
    """Kept checkpoints between evaluations: the losses in flight reach the store first, so
    a resume from the checkpoint neither loses nor repeats a row."""
    quiet_lightning()
    config = helpers.tiny_config(max_steps=6, eval_interval=100, ckpt_interval=2)
    dm, config = helpers.tiny_datamodule(config)
    store = RunStore(tmp_path / "runs.db")
    run_id = store.create_run("solo", config.to_json(), status="running")
    spy = RowsAtCheckpoint(store, run_id)
    torch.manual_seed(config.train.seed)
    lit = LitCharModel(config.to_dict(), dm.vocab.to_json())
    trainer = make_trainer(config, [spy], StoreLogger(store, run_id), run_dir=tmp_path)
    training_monitor(trainer).defer = True
    trainer.fit(lit, datamodule=dm)
    # step-N.ckpt holds the state after N updates: the losses of steps 0 .. N-1
    assert spy.seen[2] == [0, 1] and spy.seen[4] == [0, 1, 2, 3]
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert state["callbacks"]["TrainingMonitor"]["pending"] == []


# ------------------------------------------------------------------------ --compile


def test_a_compiled_step_compiles_once_whatever_the_probes_do(tmp_path, monkeypatch):
    """Probe steps hook the eager model's taps and switch it to eval and back: the compiled
    step must not recompile for them (nor for any ordinary step): one graph for training,
    one for validation, however many steps."""
    compiled: list[int] = []
    modes: list[str | None] = []
    real_compile = torch.compile

    def counting_backend(graph_module, example_inputs):
        compiled.append(len(example_inputs))
        return graph_module.forward

    def compile_counted(model, mode=None):
        modes.append(mode)
        return real_compile(model, backend=counting_backend)

    monkeypatch.setattr(torch, "compile", compile_counted)
    torch._dynamo.reset()
    counts = []
    try:
        for max_steps in (4, 10):
            compiled.clear()
            product_fit(
                tmp_path / str(max_steps),
                defer=None,
                compile=True,
                max_steps=max_steps,
                eval_interval=3,
                probe_interval=2,
            )
            counts.append(len(compiled))
            torch._dynamo.reset()
    finally:
        torch._dynamo.reset()
    assert counts[0] == counts[1] <= 2
    assert modes == [None, None]  # torch's default mode on a CPU, one compile a fit


def test_one_gpu_compiles_the_step_into_cuda_graphs_and_nothing_else_does():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert compile_mode(cuda, world_size=1) == "reduce-overhead"
    assert compile_mode(cuda, world_size=2) is None  # DDP keeps the plain compiled step
    assert compile_mode(cpu, world_size=1) is None


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")
def test_a_compiled_solo_run_trains_through_inductor(tmp_path):
    """`--compile true` end to end on the CPU with torch's default backend: it trains,
    probes and checkpoints, and its losses are those of the eager step to float rounding."""
    torch._dynamo.reset()
    try:
        overrides = {"max_steps": 4, "eval_interval": 2, "probe_interval": 2}
        eager, run_e, *_ = product_fit(tmp_path / "eager", defer=None, **overrides)
        fast, run_c, trainer, _ = product_fit(
            tmp_path / "compiled", defer=None, compile=True, **overrides
        )
    finally:
        torch._dynamo.reset()
    assert trainer.lightning_module.compiled is not None
    # the compiled wrapper is no submodule: a checkpoint's keys are the eager model's
    state = torch.load(tmp_path / "compiled" / "checkpoints" / "last.ckpt", weights_only=False)
    assert not any("_orig_mod" in key for key in state["state_dict"])
    expected = scalars(eager, run_e, ["train/loss"])
    got = scalars(fast, run_c, ["train/loss"])
    assert [row[0] for row in got] == [row[0] for row in expected] == [0, 1, 2, 3]
    assert [row[2] for row in got] == pytest.approx([row[2] for row in expected], rel=1e-4)
    assert fast.layer_steps(run_c, "tap") == [0, 2, 3]


# ------------------------------------------------------------------- the benchmark


@pytest.mark.slow
def test_the_solo_step_benchmark_runs_at_toy_size_on_a_cpu(tmp_path):
    out = tmp_path / "solo.json"
    toy = ["n_layer=1", "d_model=16", "block_size=16", "batch_size=4", "warmup_steps=5"]
    toy += ["eval_interval=40", "eval_iters=2", "probe_interval=20", "sample_interval=60"]
    command = [sys.executable, str(ROOT / "benchmarks" / "solo_step.py"), "--accelerator"]
    command += ["cpu", "--threads", "1", "--steps", "70", "--python", "--hooks"]
    command += [arg for setting in toy for arg in ("--set", setting)]
    done = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    steps = result["steps"]
    # probe steps 20 and 69 timed; 40 falls among the steps under cProfile (25-44)
    assert steps["ordinary"]["n"] > 20 and steps["probe"]["n"] == 2
    assert steps["ordinary"]["mean_ms"] > 0 and result["tokens_per_sec_ordinary"] > 0
    assert len(result["top_ops"]) == 10 and result["hooks"] and "cProfile" in result["top_python"]
    assert "ordinary" in done.stdout and "top host ops" in done.stdout
