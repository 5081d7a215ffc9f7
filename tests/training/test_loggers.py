"""What reaches Lightning loggers: the TrainingMonitor's train metrics and `--logger` runs."""

import csv
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from lightning import Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger

from blockviz import cli
from blockviz.store import RunStore
from blockviz.training.callbacks import TrainingDiverged, training_monitor
from blockviz.training.lit import LitCharModel, lr_at
from blockviz.training.trainer import make_trainer, quiet_lightning, run_loggers
from tests.helpers import FOX_TEXT, tiny_config, tiny_datamodule

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[2]


class RecordingLogger(Logger):
    """Keeps every `log_metrics` call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append((step, dict(metrics)))

    def series(self, name: str) -> dict[int, float]:
        return {step: metrics[name] for step, metrics in self.calls if name in metrics}


class LossSpy(Callback):
    """The loss of every step as training_step returned it."""

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses[trainer.global_step - 1] = outputs["loss"].item()


@dataclass
class Fitted:
    """A tiny fit's trainer, what its logger received, its per-step losses, how it ended."""

    trainer: Trainer
    logger: RecordingLogger
    losses: dict[int, float]
    error: TrainingDiverged | None


def fit(tmp_path, lit_cls=LitCharModel, callbacks=(), **overrides) -> Fitted:
    """A tiny in-process fit with a recording logger."""
    quiet_lightning()
    config = tiny_config(**overrides)
    dm, config = tiny_datamodule(config)
    lit = lit_cls(config.to_dict(), dm.vocab.to_json())
    logger, spy = RecordingLogger(), LossSpy()
    trainer = make_trainer(config, [spy, *callbacks], logger, run_dir=tmp_path)
    try:
        trainer.fit(lit, datamodule=dm)
    except TrainingDiverged as exc:
        return Fitted(trainer, logger, spy.losses, exc)
    return Fitted(trainer, logger, spy.losses, None)


# ------------------------------------------------------------------- the monitor


def test_train_metrics_are_logged_every_log_interval_with_their_values(tmp_path):
    fitted = fit(tmp_path, max_steps=5, log_interval=2, eval_interval=100)
    logger, losses = fitted.logger, fitted.losses
    config = tiny_config(max_steps=5)
    loss = logger.series("train/loss")
    # each record averages the steps since the last one; the last step always records
    assert loss == pytest.approx(
        {0: losses[0], 2: (losses[1] + losses[2]) / 2, 4: (losses[3] + losses[4]) / 2}
    )
    assert logger.series("train/lr") == pytest.approx({s: lr_at(s, config.train) for s in loss})
    tokens = config.train.batch_size * config.model.block_size
    step_time = logger.series("train/step_time")
    assert logger.series("train/tokens_per_sec") == pytest.approx(
        {s: tokens / t for s, t in step_time.items()}
    )
    monitor = training_monitor(fitted.trainer)
    assert monitor.tokens_seen == 5 * tokens
    assert monitor.recent_train_loss() == pytest.approx(sum(losses.values()) / 5)
    assert monitor.tokens_per_sec() == pytest.approx(monitor.tokens_seen / monitor.train_time_s)
    assert monitor.wall_time_s() >= monitor.train_time_s > 0


class ObjectiveSpy(Callback):
    """The cross-entropy and the whole objective (with z-loss) of every step."""

    def __init__(self) -> None:
        self.ce: dict[int, float] = {}
        self.objective: dict[int, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step - 1
        self.ce[step], self.objective[step] = outputs["ce"].item(), outputs["loss"].item()


def test_with_z_loss_train_loss_is_the_cross_entropy_not_the_objective(tmp_path):
    spy = ObjectiveSpy()
    fitted = fit(tmp_path, callbacks=[spy], max_steps=4, eval_interval=100, z_loss=0.1)
    assert fitted.error is None
    logged = fitted.logger.series("train/loss")
    assert logged == pytest.approx(spy.ce)
    assert all(spy.objective[s] > spy.ce[s] + 0.01 for s in logged)  # the term was there
    assert training_monitor(fitted.trainer).recent_train_loss() == pytest.approx(
        sum(spy.ce.values()) / 4
    )


class DivergesAtStep3(LitCharModel):
    """A model whose loss turns NaN at step 3 (and stays so: NaN gradients)."""

    def objective(self, batch):
        loss, outputs = super().objective(batch)
        if self.global_step == 3:
            loss = loss * math.nan
        return loss, {**outputs, "loss": loss.detach()}


def test_a_non_finite_loss_stops_the_run_at_its_step(tmp_path):
    fitted = fit(tmp_path, DivergesAtStep3, max_steps=6, log_interval=2, eval_interval=100)
    assert fitted.error is not None and fitted.error.step == 3
    loss = fitted.logger.series("train/loss")
    assert sorted(loss) == [0, 2, 3] and math.isnan(loss[3])
    assert sorted(fitted.logger.series("train/step_time")) == [0, 2]  # none for the bad window
    losses = fitted.losses
    monitor = training_monitor(fitted.trainer)
    assert monitor.recent_train_loss() == pytest.approx((losses[0] + losses[1] + losses[2]) / 3)


class SlowCheckpoints(Callback):
    """Half a second per checkpoint written at step 3 (last.ckpt, then best.ckpt)."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if trainer.global_step == 3:
            time.sleep(0.5)


def test_validation_and_its_checkpoints_are_left_out_of_the_throughput_clock(tmp_path):
    fitted = fit(tmp_path, callbacks=[SlowCheckpoints()], max_steps=6, eval_interval=3)
    # best.ckpt is written after every other callback's on_validation_end: still excluded
    assert fitted.logger.series("train/step_time")[3] < 0.5
    monitor = training_monitor(fitted.trainer)
    assert monitor.wall_time_s() - monitor.train_time_s >= 1.0
    assert sorted(fitted.logger.series("val/loss")) == [3, 6]  # the module's, same loggers


# ------------------------------------------------------------- --logger, unit


def test_run_loggers_write_into_the_run_folder(tmp_path):
    train = tiny_config(logger="csv").train
    (logger,) = run_loggers(train, tmp_path, resume_step=None)
    assert Path(logger.log_dir) == tmp_path / "csv" / "version_0"
    assert run_loggers(tiny_config().train, tmp_path, resume_step=None) == []


def test_a_resumed_tensorboard_session_hides_what_came_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train = tiny_config(logger="tensorboard").train
    (first,) = run_loggers(train, tmp_path, resume_step=None)
    for step in range(8):  # killed at step 7, its checkpoint at step 5
        first.log_metrics({"train/loss": float(step)}, step)
    first.finalize("success")
    (second,) = run_loggers(train, tmp_path, resume_step=5)
    for step in range(6, 9):
        second.log_metrics({"train/loss": 100.0 + step}, step)
    second.finalize("success")
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    loss = {event.step: event.value for event in events.Scalars("train/loss")}
    assert loss == {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 106, 7: 107, 8: 108}


def test_tensorboard_without_its_package_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    hidden = ("tensorboard", "tensorboardX")
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in hidden else real(name, *a)
    )
    corpus = tmp_path / "fox.txt"
    corpus.write_text(FOX_TEXT, encoding="utf-8")
    flags = ["--preset", "tiny", "--dataset", str(corpus), "--store", str(tmp_path / "s.db")]
    code = cli.main(["train", *flags, "--logger", "tensorboard", "--no_progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        "blockviz train: error: --logger tensorboard needs the tensorboard package, which is "
        "not installed: pip install tensorboard"
    ]


# ------------------------------------------------------------- --logger, real runs


def train(store: Path, *flags: str) -> str:
    """`python -m blockviz train --store STORE FLAGS`; its stdout (exit status checked)."""
    command = [sys.executable, "-m", "blockviz", "train", "--no_progress", "--store", str(store)]
    command += flags
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def tiny(corpus: Path) -> list[str]:
    """Flags of a new tiny run on `corpus`."""
    return ["--preset", "tiny", "--dataset", str(corpus)]


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "fox.txt"
    path.write_text(FOX_TEXT, encoding="utf-8")
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def column(rows: list[dict[str, str]], name: str) -> dict[int, float]:
    return {int(row["step"]): float(row[name]) for row in rows if row.get(name)}


@pytest.mark.slow
def test_csv_logger_gets_the_stores_scalars_and_layer_stats_per_session(tmp_path, corpus):
    store_path = tmp_path / "blockviz.db"
    train(store_path, *tiny(corpus), "--max_steps", "20", "--logger", "csv")
    with RunStore(store_path) as store:
        run_dir = store.run_dir(1)
        first = read_csv(run_dir / "csv" / "version_0" / "metrics.csv")
        for name in ("train/loss", "train/lr", "val/loss", "train/grad_norm"):
            stored = store.scalars(1, names=name).set_index("step").value.to_dict()
            assert column(first, name) == stored, name  # the very same numbers
        grads = store.layer_stats(1, kind="component", stat="grad_norm")
        attn1 = grads.query("layer == 1 and component == 'attn'").set_index("step").value
        assert column(first, "grad_norm/block1/attn") == attn1.to_dict()
        rms = store.layer_stats(1, kind="tap", stat="rms").query("layer == 0")
        post = rms[rms.component == "resid_post"].set_index("step").value
        assert column(first, "act_rms/block0/resid_post") == post.to_dict()
    # a resumed session writes its own file and leaves the first one as it was
    train(store_path, "--resume", "1", "--max_steps", "30")
    with RunStore(store_path) as store:
        run_dir = store.run_dir(1)
    assert read_csv(run_dir / "csv" / "version_0" / "metrics.csv") == first
    second = read_csv(run_dir / "csv" / "version_1" / "metrics.csv")
    assert sorted(column(second, "train/loss")) == list(range(20, 30))


@pytest.mark.slow
def test_tensorboard_run_reads_back_with_tensorboards_reader(tmp_path, corpus):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store_path = tmp_path / "blockviz.db"
    train(store_path, *tiny(corpus), "--max_steps", "20", "--logger", "tensorboard")
    with RunStore(store_path) as store:
        folder = store.run_dir(1) / "tensorboard"
        stored = store.scalars(1, names="train/loss").set_index("step").value.to_dict()
        n_layer = store.get_run(1).config["model"]["n_layer"]
    events = EventAccumulator(str(folder), size_guidance={"histograms": 0, "tensors": 0})
    events.Reload()
    loss = {event.step: event.value for event in events.Scalars("train/loss")}
    assert loss == pytest.approx(stored, rel=1e-6)  # TensorBoard keeps float32
    assert [event.step for event in events.Scalars("val/loss")] == [20]
    tags = events.Tags()
    for layer in range(n_layer):
        assert f"grad_norm/block{layer}/attn" in tags["scalars"]
        assert f"act_rms/block{layer}/resid_post" in tags["scalars"]
    hist = events.Histograms("act_hist/block0/resid_post")
    assert [h.step for h in hist] == [0, 10, 19] and hist[0].histogram_value.num > 0  # 19: last
    assert [t.step for t in events.Tensors("sample/text_summary")] == [0, 20]
