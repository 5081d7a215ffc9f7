"""Replicas end to end: `train --seeds`, batches of runs that differ in their optimiser,
divergence inside a batch, and the one-line errors. Each replica must equal its solo run.

Training is in-process (the tiny preset on a small corpus, a dozen steps): the batch and
the solo runs share one store, and their rows are compared step by step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from blockviz import cli
from blockviz.core import config as cfg
from blockviz.core import replicas
from blockviz.core.plans import Member, Plan
from blockviz.core.requests import Session
from blockviz.store import RunStore
from blockviz.training.train import train

pytestmark = pytest.mark.slow

# A replica against its solo run: float32 rounding only, the same formulas in another order
# (measured: at most ~1e-6 over these runs).
LOSS_TOL = 2e-5
CADENCE = [
    *("--max_steps", "12", "--warmup_steps", "3", "--eval_interval", "4", "--eval_iters", "2"),
    *("--sample_interval", "6", "--accelerator", "cpu", "--no_progress"),
]


def _train(store: Path, corpus: Path, *flags: str) -> int:
    base = ["train", "--preset", "tiny", "--dataset", str(corpus), "--store", str(store)]
    return cli.main([*base, *CADENCE, *flags])


def _series(store: RunStore, run_id: int, name: str) -> dict[int, float]:
    frame = store.scalars(run_id, names=name)
    return dict(zip(frame["step"], frame["value"], strict=True))


def _assert_equal_runs(store: RunStore, replica: int, solo: int) -> None:
    """Same steps, statuses and learning rates; losses within LOSS_TOL, every per-layer
    statistic (gradient, parameter and update norms, the taps' activation statistics, the
    heads') within 1e-3 of the solo run's and every histogram its histogram (a replica is
    its solo run to float32 rounding on a CPU: the same formulas in another order);
    samples at the same steps."""
    for name in ("train/loss", "val/loss", "train/lr", "train/grad_norm", "probe/log_z"):
        ours, theirs = _series(store, replica, name), _series(store, solo, name)
        assert ours.keys() == theirs.keys() and ours, name
        if name == "train/lr":
            assert ours == theirs
        elif name in ("train/loss", "val/loss"):
            worst = max(abs(ours[s] - theirs[s]) for s in ours)
            assert worst < LOSS_TOL, (name, worst)
    keys = ["step", "layer", "kind", "component", "stat"]
    stats = [store.layer_stats(i).sort_values(keys).reset_index(drop=True) for i in (replica, solo)]
    assert stats[0][keys].equals(stats[1][keys])
    assert set(stats[0]["kind"]) >= {"param", "component", "tap"}  # activations compared too
    ours, theirs = (frame["value"].to_numpy() for frame in stats)
    same = (ours == theirs) | (np.isnan(ours) & np.isnan(theirs))  # a zero norm's ratio
    close = abs(ours - theirs) <= 1e-3 * abs(theirs) + 1e-6  # 1e-6: a mean near 0
    assert (same | close).all(), stats[0][~(same | close)]
    _assert_equal_histograms(store, replica, solo)
    a, b = store.get_run(replica), store.get_run(solo)
    assert (a.status, a.step) == (b.status, b.step)
    samples = [store.samples(i) for i in (replica, solo)]
    assert samples[0]["step"].tolist() == samples[1]["step"].tolist()


def _assert_equal_histograms(store: RunStore, replica: int, solo: int) -> None:
    """The same histograms at the same steps, layers and taps; rounding may move a value
    that lies on a bin's edge (measured: none moved over these runs)."""
    keys = ["step", "layer", "tap", "bin", "lo", "hi"]
    ours, theirs = (
        store.histograms(i).sort_values(keys).reset_index(drop=True) for i in (replica, solo)
    )
    assert ours[keys].equals(theirs[keys])
    moved = (
        (ours["count"] - theirs["count"]).abs().groupby([ours["step"], ours["layer"], ours["tap"]])
    )
    assert len(ours) and moved.sum().max() <= 2


# Probes every 2 steps ("on") or only at step 0 and the last step ("off"); architectures
# that exercise every code path the vmapped step takes.
CONFIGS = {
    "pre-ln, probes on": ["--probe_interval", "2"],
    "post-ln rmsnorm swiglu tied qk-norm softcap, probes off": [
        *("--norm_position", "post", "--norm_type", "rmsnorm", "--activation", "swiglu"),
        *("--tie_weights", "true", "--qk_norm", "true", "--logit_softcap", "30"),
        *("--probe_interval", "1000"),
    ],
    "no residual, attention only, z-loss": [
        *("--residual", "false", "--ffn", "false", "--z_loss", "1e-3", "--probe_interval", "3"),
    ],
}


@pytest.mark.parametrize("flags", list(CONFIGS.values()), ids=list(CONFIGS))
def test_train_seeds_equals_one_solo_run_per_seed(tmp_path, corpus, flags, capsys):
    store_path = tmp_path / "s.db"
    assert _train(store_path, corpus, *flags, "--seeds", "0,1", "--name", "batch") == 0
    out = capsys.readouterr().out
    assert "2 replicas of one batch" in out
    for seed in (0, 1):
        assert _train(store_path, corpus, *flags, "--seed", str(seed)) == 0
    with RunStore(store_path) as store:
        names = [store.get_run(i).name for i in (1, 2)]
        assert names == ["batch-s0", "batch-s1"]
        for replica, solo in ((1, 3), (2, 4)):
            _assert_equal_runs(store, replica, solo)
        # Seeds are different runs: different data, different weights.
        assert _series(store, 1, "train/loss") != _series(store, 2, "train/loss")


def _train_batch(store: Path, configs: list[cfg.RunConfig], names: list[str]) -> int:
    """The batch of new runs `train --seeds` would train, of these configs."""
    plan = Plan(tuple(Member(c, n) for c, n in zip(configs, names, strict=True)))
    return train(plan, Session(str(store)), create=True).exit_code


def _tiny(corpus: Path, **overrides) -> cfg.RunConfig:
    base = cfg.replace(cfg.preset("tiny"), dataset=str(corpus), accelerator="cpu")
    cadence = {"max_steps": 12, "eval_interval": 4, "eval_iters": 2, "sample_interval": 6}
    return cfg.replace(base, **{**cadence, "probe_interval": 3, **overrides}).validate()


def _solo(store: Path, config: cfg.RunConfig, folder: Path) -> None:
    path = folder / f"config-{config.train.seed}-{config.train.lr}.json"
    path.write_text(config.to_json(), encoding="utf-8")
    assert cli.main(["train", "--config", str(path), "--store", str(store), "--no_progress"]) == 0


def test_replicas_that_differ_in_their_optimiser_equal_their_solo_runs(tmp_path, corpus):
    configs = [
        _tiny(corpus, seed=3, lr=3e-3, weight_decay=0.0, grad_clip=0.05),  # clipping bites
        _tiny(corpus, seed=3, lr=1e-3, beta1=0.8, beta2=0.95, warmup_steps=0, grad_clip=0.0),
        _tiny(corpus, seed=4, lr=2e-3, lr_schedule="linear", min_lr=1e-5, init="gpt2"),
        _tiny(corpus, seed=5, z_loss=1e-2, weight_decay=0.3, init="xavier"),
    ]
    assert len({replicas.batch_key(c) for c in configs}) == 1
    store = tmp_path / "s.db"
    names = [f"r{i}" for i in range(len(configs))]
    assert _train_batch(store, configs, names) == 0
    for config in configs:
        _solo(store, config, tmp_path)
    with RunStore(store) as db:
        for index in range(len(configs)):
            _assert_equal_runs(db, index + 1, index + 1 + len(configs))
        # Each replica ran its own schedule: the logged lr is its solo run's.
        assert _series(db, 2, "train/lr") == pytest.approx(_series(db, 6, "train/lr"))
        assert _series(db, 1, "train/lr") != _series(db, 2, "train/lr")


def test_a_replica_that_diverges_is_marked_and_the_others_go_on_as_solo(tmp_path, corpus):
    shape = {"norm_position": "none", "n_layer": 6, "activation": "relu", "warmup_steps": 0}
    wild = _tiny(corpus, lr=10.0, grad_clip=0.0, **shape)
    calm = [_tiny(corpus, seed=seed, **shape) for seed in (1, 2)]
    store = tmp_path / "s.db"
    assert _train_batch(store, [calm[0], wild, calm[1]], ["a", "wild", "b"]) == 0
    _solo(store, wild, tmp_path)
    for config in calm:
        _solo(store, config, tmp_path)
    with RunStore(store) as db:
        diverged, alone = db.get_run(2), db.get_run(4)
        assert diverged.status == alone.status == "diverged"
        assert diverged.diverged_step == alone.diverged_step
        assert max(_series(db, 2, "train/loss")) == max(_series(db, 4, "train/loss"))
        # Nothing after the divergence was recorded for it; the other two finished.
        assert max(_series(db, 2, "train/loss")) == diverged.diverged_step
        _assert_equal_runs(db, 1, 5)
        _assert_equal_runs(db, 3, 6)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--seeds", "0,x"], "--seeds: 'x' is not a seed"),
        (["--seeds", "0,1", "--seed", "3"], "--seeds and --seed"),
        (["--seeds", "0,1", "--resume", "1"], "--seeds cannot be combined with --resume"),
        (["--seeds", "0,1", "--replicas", "0"], "--replicas: 0 replicas is not allowed"),
    ],
)
def test_bad_seed_and_replica_flags_are_one_line(tmp_path, corpus, capsys, flags, words):
    assert _train(tmp_path / "s.db", corpus, *flags) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert not (tmp_path / "s.db").exists()


def test_seeds_of_a_config_that_cannot_batch_train_one_after_another(tmp_path, corpus, capsys):
    store = tmp_path / "s.db"
    assert _train(store, corpus, "--dropout", "0.1", "--seeds", "0,1", "--max_steps", "4") == 0
    assert "train one after another: dropout > 0" in capsys.readouterr().out
    with RunStore(store) as db:
        assert [db.get_run(i).status for i in (1, 2)] == ["completed", "completed"]
        assert replicas.read_batch_file(db.run_dir(1)) is None


def test_replicas_on_the_ops_task_score_answers_as_their_solo_runs(tmp_path, corpus):
    store_path = tmp_path / "s.db"
    flags = ["--dataset", "ops", "--ops_examples", "400", "--probe_interval", "6"]
    assert _train(store_path, corpus, *flags, "--seeds", "0,1") == 0
    for seed in (0, 1):
        assert _train(store_path, corpus, *flags, "--seed", str(seed)) == 0
    with RunStore(store_path) as store:
        for replica, solo in ((1, 3), (2, 4)):
            _assert_equal_runs(store, replica, solo)
            for name in ("val/answer_acc", "val/answer_baseline"):
                ours = _series(store, replica, name)
                assert ours and ours == _series(store, solo, name), name


def test_each_replica_writes_its_own_logger_files(tmp_path, corpus):
    store_path = tmp_path / "s.db"
    assert _train(store_path, corpus, "--logger", "csv", "--seeds", "3,4") == 0
    with RunStore(store_path) as store:
        for run_id in (1, 2):
            (metrics,) = (store.run_dir(run_id) / "csv").glob("version_*/metrics.csv")
            header, *rows = metrics.read_text(encoding="utf-8").splitlines()
            assert "train/loss" in header and "val/loss" in header and rows
            column = header.split(",").index("train/loss")
            logged = [float(r.split(",")[column]) for r in rows if r.split(",")[column]]
            assert logged == list(_series(store, run_id, "train/loss").values())


def test_a_member_trained_again_alone_leaves_its_batch_and_the_batch_cannot_resume(
    tmp_path, corpus, capsys
):
    # The batch file stayed behind: a later Resume sent the run back to the old batch's
    # checkpoint and took over its other member.
    store_path = tmp_path / "s.db"
    assert _train(store_path, corpus, "--seeds", "0,1", "--max_steps", "4") == 0
    with RunStore(store_path) as store:
        store.update_run(2, status="queued", pid=None)
        config = store.run_dir(2) / "config.json"
    assert cli.main(["train", "--config", str(config), "--run_id", "2", "--store",
                     str(store_path), "--no_progress"]) == 0  # fmt: skip
    with RunStore(store_path) as store:
        assert replicas.read_batch_file(store.run_dir(2)) is None
        store.update_run(1, status="stopped")
    capsys.readouterr()
    assert cli.main(["train", "--resume", "1", "--store", str(store_path)]) == 2
    err = capsys.readouterr().err
    assert "run 2 has trained in another batch (or alone) since" in err and "Traceback" not in err


def test_sixty_four_seeds_train_at_toy_size_on_a_cpu(tmp_path, corpus):
    # The command a GPU runs as one batch of 64 (`--replicas auto`), here in batches of 8.
    store_path = tmp_path / "s.db"
    flags = ["--seeds", "0-63", "--max_steps", "2", "--warmup_steps", "1", "--eval_interval", "2"]
    assert _train(store_path, corpus, *flags, "--d_model", "8", "--n_layer", "1") == 0
    with RunStore(store_path) as store:
        statuses = store.run_statuses()
        assert len(statuses) == 64 and set(statuses.values()) == {"completed"}
        sizes = {len(replicas.read_batch_file(store.run_dir(i))["runs"]) for i in statuses}
        assert sizes == {8}


def _checkpoint_of(store: RunStore, run_id: int) -> Path:
    from blockviz.launch import runner

    return runner.checkpoint_path(store, run_id)


def test_a_batch_killed_after_its_final_checkpoint_is_finished_by_resume(tmp_path, corpus, capsys):
    # Every step trained and the final checkpoint written, then a kill -9 before any status
    # was recorded: the members stayed 'running' / 'failed' for good ("already at step 12").
    store_path = tmp_path / "s.db"
    assert _train(store_path, corpus, "--seeds", "0,1") == 0
    with RunStore(store_path) as store:
        before = [store.get_run(i).final for i in (1, 2)]
        import torch

        step = torch.load(_checkpoint_of(store, 1), weights_only=True)["global_step"]
        assert step == 12
        for run_id, status in ((1, "running"), (2, "failed")):
            store.truncate_after(run_id, 11)  # the end's evaluation and sample not logged
            store.update_run(run_id, status=status, step=12, final=None, pid=None, error="killed")
    capsys.readouterr()
    assert cli.main(["train", "--resume", "2", "--store", str(store_path), "--no_progress"]) == 0
    assert "finishing" in capsys.readouterr().out
    with RunStore(store_path) as store:
        for run_id, earlier in zip((1, 2), before, strict=True):
            run = store.get_run(run_id)
            assert (run.status, run.step, run.error) == ("completed", 12, None)
            assert _series(store, run_id, "val/loss").keys() == {4, 8, 12}
            assert list(_series(store, run_id, "train/loss")) == list(range(12))
            assert store.samples(run_id)["step"].tolist().count(12) == 1
            for key in ("val_loss", "train_loss"):
                assert run.final[key] == pytest.approx(earlier[key], rel=1e-5), key
            assert run.final["steps"] == 12


def test_deleting_any_member_of_a_batch_leaves_the_others_resumable(tmp_path, corpus):
    # The batch's checkpoint lived in its first member's folder: deleting that run took it.
    store_path = tmp_path / "s.db"
    assert _train(store_path, corpus, "--seeds", "0,1,2", "--max_steps", "8") == 0
    with RunStore(store_path) as store:
        checkpoint = _checkpoint_of(store, 2)
        for run_id in (1, 2, 3):
            store.update_run(run_id, status="stopped")  # as a stop at the last step leaves it
        store.delete_run(1)
        assert checkpoint.is_file()
    argv = ["train", "--resume", "3", "--max_steps", "12", "--store", str(store_path)]
    assert cli.main([*argv, "--no_progress"]) == 0
    with RunStore(store_path) as store:
        assert [(store.get_run(i).status, store.get_run(i).step) for i in (2, 3)] == [
            ("completed", 12),
            ("completed", 12),
        ]
        assert list(_series(store, 3, "train/loss")) == list(range(12))
        store.delete_run(3)
        assert checkpoint.is_file()  # run 2 still holds it
        store.delete_run(2)
        assert not checkpoint.exists() and not checkpoint.parent.parent.exists()


def test_a_resumed_batch_carries_each_replicas_recent_losses_as_a_solo_run_does(
    tmp_path, corpus, capsys
):
    # The batch's checkpoint holds its monitor's state, every replica's: the final
    # train_loss of the resumed session averages the last steps of both sessions.
    store_path = tmp_path / "s.db"
    assert _train(store_path, corpus, "--seeds", "0,1", "--max_steps", "8") == 0
    capsys.readouterr()
    argv = ["train", "--resume", "2", "--max_steps", "12", "--store", str(store_path)]
    assert cli.main(argv) == 0  # with its progress line
    with RunStore(store_path) as store:
        for run_id in (1, 2):
            losses = _series(store, run_id, "train/loss")
            assert list(losses) == list(range(12))
            final = store.get_run(run_id).final["train_loss"]
            assert final == pytest.approx(sum(losses.values()) / 12, rel=1e-6)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("step 12/12 | losses ") and len(last.split(" | ")[1].split()) == 3


def test_a_batch_whose_checkpoint_is_in_its_first_members_folder_still_resumes(tmp_path, corpus):
    # Batches trained before the batch folder kept their checkpoint in the first member's.
    import json
    import shutil

    store_path = tmp_path / "s.db"
    assert _train(store_path, corpus, "--seeds", "0,1", "--max_steps", "8") == 0
    with RunStore(store_path) as store:
        checkpoint = _checkpoint_of(store, 1)
        old = store.run_dir(1) / "checkpoints"
        if checkpoint.parent != old:
            shutil.rmtree(old, ignore_errors=True)
            shutil.move(checkpoint.parent, old)
        for index, run_id in enumerate((1, 2)):
            data = {"runs": [1, 2], "index": index, "leader": 1}
            (store.run_dir(run_id) / replicas.BATCH_FILE).write_text(json.dumps(data))
            store.update_run(run_id, status="stopped")
        assert _checkpoint_of(store, 2) == old / "last.ckpt"
    argv = ["train", "--resume", "2", "--max_steps", "12", "--store", str(store_path)]
    assert cli.main([*argv, "--no_progress"]) == 0
    with RunStore(store_path) as store:
        assert [store.get_run(i).status for i in (1, 2)] == ["completed", "completed"]
        assert list(_series(store, 1, "train/loss")) == list(range(12))


@pytest.mark.parametrize("log_interval", ["1", "3"])
def test_a_batch_that_reads_its_losses_a_logged_step_late_records_the_same_rows(
    tmp_path, corpus, monkeypatch, log_interval
):
    # What a GPU does (the copy to the host overlaps the next steps), forced on the CPU.
    from blockviz.training.callbacks import TrainingMonitor

    flags = ["--seeds", "0,1", "--log_interval", log_interval, "--probe_interval", "5"]
    assert _train(tmp_path / "now.db", corpus, *flags) == 0
    monkeypatch.setattr(TrainingMonitor, "defer", True)
    assert _train(tmp_path / "late.db", corpus, *flags) == 0
    with RunStore(tmp_path / "now.db") as now, RunStore(tmp_path / "late.db") as late:
        for run_id in (1, 2):
            for name in ("train/loss", "train/lr", "val/loss"):
                assert _series(now, run_id, name) == _series(late, run_id, name), name
            assert now.get_run(run_id).status == late.get_run(run_id).status == "completed"
