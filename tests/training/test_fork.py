"""`python -m blockviz fork`: kept checkpoints, exact twins, changed twins, refusals."""

import re
from pathlib import Path

import pytest
import torch

from blockviz import cli
from blockviz.core import config as cfg
from blockviz.core import forks
from blockviz.core.corpora import Corpus
from blockviz.core.spec import EVAL_SCALARS, GRAD_NORM, TRAIN_LOSS, TRAIN_LR, VAL_LOSS
from blockviz.store import RunStore
from blockviz.training.data import CharDataModule
from blockviz.training.lit import lr_at
from tests.fakes import CORPUS

pytestmark = pytest.mark.slow

# Dropout on: the twin must draw the parent's masks, not only see its batches.
PARENT = (
    *("--preset", "tiny", "--max_steps", "30", "--eval_interval", "10", "--ckpt_interval", "5"),
    *("--probe_interval", "5", "--dropout", "0.1", "--log_interval", "1", "--threads", "1"),
)


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> Path:
    """A store with run 1: 30 tiny steps keeping a checkpoint every 5."""
    folder = tmp_path_factory.mktemp("fork")
    corpus = folder / "fox.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    store = folder / "runs.db"
    flags = ("--dataset", str(corpus), "--store", str(store), "--no_progress")
    assert cli.main(["train", *PARENT, *flags]) == 0
    return store


def fork(store: Path, *flags: str) -> int:
    return cli.main(["fork", "1", "--store", str(store), "--threads", "1", "--no_progress", *flags])


def newest(store: Path) -> int:
    with RunStore(store, create=False) as runs:
        return int(runs.runs_frame()["id"].max())


@pytest.mark.parametrize("step", [10, 15])  # an evaluated step and one between evaluations
def test_a_fork_with_no_change_reproduces_its_parent_exactly(parent, step):
    assert fork(parent, "--step", str(step)) == 0
    child = newest(parent)
    with RunStore(parent, create=False) as store:
        run = store.get_run(child)
        assert (run.parent_id, run.fork_step, run.fork_kind, run.status) == (
            1,
            step,
            "fork",
            "completed",
        )
        assert run.config["model"]["final_norm"] is None  # auto stays auto: nothing changed
        for name in (TRAIN_LOSS, VAL_LOSS):
            ours, theirs = store.scalars(child, name), store.scalars(1, name)
            assert ours["step"].tolist() == theirs["step"].tolist()
            assert ours["value"].tolist() == theirs["value"].tolist()  # bit for bit
        ours, theirs = store.layer_stats(child, "component"), store.layer_stats(1, "component")
        assert len(ours) == len(theirs) and ours["value"].tolist() == theirs["value"].tolist()


def test_a_fork_copies_only_the_parents_past(parent, capsys):
    assert fork(parent, "--step", "20", "--max_steps", "25", "--lr", "2e-3") == 0
    child = newest(parent)
    # The name it prints is the one the store keeps, so `show NAME` finds it (it printed
    # 'fork@20' while the store kept 'fork-20').
    printed = re.search(
        rf"^blockviz: run {child} \((.*)\) fork of run 1", capsys.readouterr().out, re.M
    )
    assert printed is not None
    assert cli.main(["show", printed.group(1), "--store", str(parent)]) == 0
    capsys.readouterr()
    assert cli.main(["show", str(child), "--store", str(parent)]) == 0
    forked = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("forked")
    )
    assert "fork of run 1 at step 20 (" in forked
    assert "lr 0.002" in forked and "max_steps 25" in forked
    with RunStore(parent, create=False) as store:
        run = store.get_run(child)
        assert run.fork_info == {"changes": {"max_steps": 25, "lr": 2e-3}}
        assert "fork" in run.name and "lr=0.002" in run.name
        loss = store.scalars(child, TRAIN_LOSS)
        assert loss["step"].tolist() == list(range(25))
        parent_loss = store.scalars(1, TRAIN_LOSS)
        before = parent_loss[parent_loss["step"] < 20]["value"].tolist()
        assert loss[loss["step"] < 20]["value"].tolist() == before
        # The evaluation at step 20 ran before the checkpoint: copied, not redone.
        val = store.scalars(child, VAL_LOSS)
        assert val["step"].tolist() == [10, 20, 25]
        # The fork's lr from step 20 on is the new lr's schedule (max_steps 25 its horizon).
        lr = store.scalars(child, TRAIN_LR).set_index("step")["value"]
        config = cfg.replace(cfg.RunConfig(), lr=2e-3, max_steps=25, warmup_steps=5)
        assert lr[20] == pytest.approx(lr_at(20, config.train, 25))
        grads = store.layer_stats(child, "component", GRAD_NORM)
        assert grads["step"].max() == 24


def test_refusals_name_the_problem(parent, capsys):
    assert fork(parent, "--step", "12") == 2
    assert "keeps checkpoints at steps 5, 10, 15, 20, 25, 30" in capsys.readouterr().err
    assert fork(parent, "--step", "10", "--norm_type", "rmsnorm") == 2
    err = capsys.readouterr().err
    assert "--norm_type changes the parameters" in err and "bias" in err
    assert fork(parent, "--step", "10", "--dataset", "shakespeare") == 2
    assert "--dataset cannot change in a fork" in capsys.readouterr().err
    assert fork(parent, "--step", "30") == 2
    assert "not past the fork step 30" in capsys.readouterr().err


def store_flags(folder: Path) -> tuple[Path, tuple[str, ...]]:
    """A store in `folder` and the flags that train on the fox corpus into it."""
    corpus = folder / "fox.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    store = folder / "runs.db"
    return store, (
        "--dataset",
        str(corpus),
        "--store",
        str(store),
        "--no_progress",
        "--threads",
        "1",
    )


def test_post_ln_forks_to_pre_ln_keeping_its_final_norm(tmp_path):
    store, flags = store_flags(tmp_path)
    short = ("--preset", "tiny", "--max_steps", "12", "--ckpt_interval", "5")
    assert cli.main(["train", *short, "--norm_position", "post", *flags]) == 0
    assert cli.main(["fork", "1", "--step", "5", "--norm_position", "pre", *flags[2:]]) == 0
    with RunStore(store, create=False) as runs:
        twin = runs.get_run(2)
        assert twin.config["model"]["norm_position"] == "pre"
        assert twin.config["model"]["final_norm"] is False  # the parent's, not pre's auto
        assert twin.fork_info == {"changes": {"norm_position": "pre"}}
        runs.delete_run(1)
        assert runs.get_run(2).parent_id is None and runs.get_run(2).fork_step == 5
        # The copied history stays with the fork.
        assert len(runs.scalars(2, TRAIN_LOSS)) == 12


def test_kept_checkpoints_thin_out_keeping_the_first():
    every, dropped = forks.thinned([100, 200, 300, 400], 100, 3)
    assert (every, dropped) == (200, [300])
    steps: list[int] = []
    every = 100
    for step in range(100, 2001, 100):  # what KeptCheckpoints does over a default run
        if step % every == 0:
            steps.append(step)
            every, dropped = forks.thinned(steps, every, 8)
            steps = sorted(set(steps) - set(dropped))
    assert steps == [100, 400, 800, 1200, 1600, 2000]
    assert forks.nearest_kept(steps, 1000) == 800 and forks.nearest_kept(steps, 50) is None


def test_a_run_keeps_at_most_ckpt_keep_checkpoints(tmp_path):
    store, flags = store_flags(tmp_path)
    kept = ("--ckpt_interval", "2", "--ckpt_keep", "3", "--max_steps", "16")
    assert cli.main(["train", "--preset", "tiny", *kept, *flags]) == 0
    with RunStore(store, create=False) as runs:
        assert forks.kept_steps(runs.run_dir(1)) == [2, 8, 16]


def test_the_training_stream_goes_on_from_the_restored_step():
    """A resumed run's batch N is batch N of the uninterrupted run, not batch 0 again."""
    config = cfg.preset("tiny")
    data = CharDataModule(config.data, 8, 4, seed=3, corpus=Corpus("fox", "a test", CORPUS))
    data.setup()
    fresh = iter(data.train_dataloader())
    batches = [next(fresh)[0] for _ in range(6)]

    class Restored:
        global_step = 4
        global_rank = 0

    data.trainer = Restored()
    resumed = next(iter(data.train_dataloader()))[0]
    assert torch.equal(resumed, batches[4]) and not torch.equal(resumed, batches[0])


def test_evaluations_are_the_scalars_an_evaluation_records():
    from blockviz.training.lit import val_metrics

    assert set(val_metrics(1.0, [1, 2], [1, 2])) == set(EVAL_SCALARS)


def test_a_replay_reruns_the_steps_before_an_event_probing_every_step(parent, capsys):
    flags = ["--store", str(parent), "--threads", "1", "--no_progress"]
    code = cli.main(["replay", "1", "--around", "27", "--after", "2", *flags])
    assert code == 0
    out = capsys.readouterr().out
    child = newest(parent)
    with RunStore(parent, create=False) as store:
        run = store.get_run(child)
        assert (run.fork_kind, run.fork_step, run.parent_id) == ("replay", 25, 1)
        # step 27 of a healthy run is no event: the replay is a window and says so
        assert run.fork_info["event"] == "window" and run.fork_info["event_step"] == 27
        assert f"replay {child}: {run.fork_info['sentence']}" in out
        assert run.fork_info["sentence"].startswith("A replay from step 25 ")
        grads = store.layer_stats(child, "component", GRAD_NORM)
        assert sorted(set(grads["step"][grads["step"] >= 25])) == [25, 26, 27, 28, 29]
        ours, theirs = store.scalars(child, TRAIN_LOSS), store.scalars(1, TRAIN_LOSS)
        assert ours["value"].tolist() == theirs["value"].tolist()  # the same run, again
        assert run.config["train"]["max_steps"] == 30


def test_a_replay_names_what_it_cannot_do(parent, capsys):
    flags = ["--store", str(parent), "--threads", "1", "--no_progress"]
    assert cli.main(["replay", "1", *flags]) == 2
    assert "neither diverged nor spiked; give --around STEP" in capsys.readouterr().err
    assert cli.main(["replay", "1", "--around", "4", *flags]) == 2
    assert "keeps no checkpoint before step 4 (kept: 5, 10" in capsys.readouterr().err
    assert cli.main(["replay", "1", "--around", "725", *flags]) == 2
    assert "got to step 30; give a step it trained" in capsys.readouterr().err


def test_a_resumed_run_is_the_run_it_continues(tmp_path):
    """Resumed at step 15, a run trains batch 15 with the random state of step 15: its
    losses equal an uninterrupted run's (they restarted the data at batch 0 before)."""
    store, flags = store_flags(tmp_path)
    run = ("--preset", "tiny", "--dropout", "0.1", "--lr_schedule", "constant", *flags)
    assert cli.main(["train", *run, "--max_steps", "30"]) == 0
    assert cli.main(["train", *run, "--max_steps", "15"]) == 0
    resume = ("--store", str(store), "--no_progress", "--threads", "1")
    assert cli.main(["train", "--resume", "2", "--max_steps", "30", *resume]) == 0
    with RunStore(store, create=False) as runs:
        straight, resumed = runs.scalars(1, TRAIN_LOSS), runs.scalars(2, TRAIN_LOSS)
        assert resumed["step"].tolist() == list(range(30))
        assert resumed["value"].tolist() == straight["value"].tolist()


@pytest.mark.parametrize("step", [15, 20])  # between two logs and at one
def test_a_fork_carries_the_losses_its_parent_had_not_logged_yet(tmp_path, step):
    """log_interval 4: the parent's log at step 16 averages batches 13-16; the fork, forked
    at 15, must average the same four (it logged batch 15 and 16 alone before)."""
    store, flags = store_flags(tmp_path)
    run = ("--preset", "tiny", "--max_steps", "30", "--ckpt_interval", "5", "--dropout", "0.1")
    assert cli.main(["train", *run, "--log_interval", "4", *flags]) == 0
    assert cli.main(["fork", "1", "--step", str(step), *flags[2:]]) == 0
    with RunStore(store, create=False) as runs:
        ours, theirs = runs.scalars(2, TRAIN_LOSS), runs.scalars(1, TRAIN_LOSS)
        assert ours["step"].tolist() == theirs["step"].tolist()
        assert ours["value"].tolist() == theirs["value"].tolist()
        assert runs.get_run(2).final["train_loss"] == runs.get_run(1).final["train_loss"]


def test_refused_before_anything_is_recorded_tied_weights_and_ddp_parents(tmp_path, capsys):
    store, flags = store_flags(tmp_path)
    run = ("--preset", "tiny", "--max_steps", "12", "--ckpt_interval", "5")
    assert cli.main(["train", *run, *flags]) == 0
    # Tied embeddings list the same shapes but make one parameter of two.
    assert cli.main(["fork", "1", "--step", "5", "--tie_weights", "true", *flags[2:]]) == 2
    assert "another set of parameters (tied or untied weights)" in capsys.readouterr().err
    with RunStore(store, create=False) as runs:
        config = runs.run_dir(1) / "config.json"
        ddp = cfg.RunConfig.from_json(config.read_text(encoding="utf-8"))
        config.write_text(cfg.replace(ddp, devices=2).to_json(), encoding="utf-8")
    assert cli.main(["fork", "1", "--step", "5", *flags[2:]]) == 2
    assert "trained in 2 processes (DDP)" in capsys.readouterr().err
    with RunStore(store, create=False) as runs:
        assert len(runs.runs_frame()) == 1  # no run was created for either
