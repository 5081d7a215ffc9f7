"""One run on several nodes (docs/multi-node.md), simulated on one machine: two
`python -m blockviz train` processes on 127.0.0.1, node 0 and node 1, one rank each,
joined by Lightning's DDP over gloo. Only global rank 0 records the run. Also: a rank > 0
resumes on rank 0's lr schedule."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from blockviz import cli
from blockviz.core import config as cfg
from blockviz.store import RunStore
from blockviz.training import train as train_cli
from blockviz.training.fit import Outcome
from blockviz.training.lifecycle import global_rank_from_env
from blockviz.training.registration import ENV_LEGACY_EVAL, ENV_RUN_DIR
from blockviz.views.charts.xaxis import tokens_per_step
from tests.fakes import CORPUS
from tests.helpers import ROOT, tiny_config

STEPS = 20
# The tiny preset (batch 8 x 32 characters), 20 steps, evaluated at 10 and 20.
RUN_FLAGS = (
    *("--preset", "tiny", "--max_steps", str(STEPS), "--threads", "1", "--no_progress"),
    *("--eval_interval", "10", "--probe_interval", "10", "--sample_interval", "20"),
    *("--accelerator", "cpu", "--strategy", "ddp"),
)
TWO_NODES = ("--devices", "1", "--num_nodes", "2")
# Normal runs take about 5 s; past this, a rank that never joined keeps the other waiting.
TIMEOUT_S = 180
# How the ranks start. Lightning's documented variables alone: it launches each node's
# ranks itself. With LOCAL_RANK too: every process is started by hand, Lightning starts none.
# How each node's rank starts: Lightning launches it from MASTER_ADDR / NODE_RANK /
# WORLD_SIZE (setting LOCAL_RANK as well, every rank started by hand, also worked when
# checked; one way is tested, to keep the suite's time).
LAUNCHES = {"lightning-launches": {}}
# What the test process may carry that would tell a rank who it is, or where a run is.
RANK_VARS = (
    *("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "RANK"),
    *("LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "JSM_NAMESPACE_RANK"),
    *(ENV_RUN_DIR, ENV_LEGACY_EVAL),
)
CLUSTER_PREFIXES = ("SLURM_", "JSM_", "LSB_", "OMPI_", "PMI_", "TORCHELASTIC_")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without rank or cluster variables, plus `extra`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in RANK_VARS and not key.startswith(CLUSTER_PREFIXES)
    }
    path = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    return {**env, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def run_together(commands: list[tuple[list[str], Path, dict[str, str]]], logs: Path) -> list[dict]:
    """Start every (command, cwd, env) at once and wait for all, TIMEOUT_S in all; each
    one's exit code, stdout and stderr. Whatever is still running at the end is killed
    with its process group, so no rank outlives the test."""
    procs, results = [], []
    try:
        for index, (command, cwd, env) in enumerate(commands):
            out = (logs / f"{index}.out").open("w")
            err = (logs / f"{index}.err").open("w")
            with out, err:  # the child holds its own copies
                procs.append(
                    subprocess.Popen(
                        command, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True
                    )
                )
        deadline = time.monotonic() + TIMEOUT_S
        for index, proc in enumerate(procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"process {index} ran past {TIMEOUT_S} s: {commands[index][0]}")
            results.append(
                {
                    "code": proc.returncode,
                    "out": (logs / f"{index}.out").read_text(),
                    "err": (logs / f"{index}.err").read_text(),
                }
            )
    finally:
        for proc in procs:
            # The group of a session this test started: its id stays taken while any
            # member (a rank Lightning started) lives, so it can name nobody else's.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return results


def train_command(corpus: Path, store: Path, *flags: str) -> list[str]:
    return [
        *(sys.executable, "-m", "blockviz", "train", *RUN_FLAGS),
        *("--dataset", str(corpus), "--store", str(store), *flags),
    ]


def series(store: RunStore, run_id: int, name: str) -> dict[int, float]:
    rows = store.scalars(run_id, names=name)
    return dict(zip(rows["step"].tolist(), rows["value"].tolist(), strict=True))


@pytest.fixture(scope="module")
def one_node_two_ranks(tmp_path_factory, corpus) -> dict[str, dict[int, float]]:
    """The same run on one node with two ranks (Lightning starts the second): the loss
    series two nodes of one rank each must reproduce."""
    folder = tmp_path_factory.mktemp("one-node")
    store_path = folder / "blockviz.db"
    command = train_command(corpus, store_path, "--devices", "2", "--num_nodes", "1")
    [result] = run_together([(command, folder, clean_env())], folder)
    assert result["code"] == 0, result["out"] + result["err"]
    with RunStore(store_path, readonly=True) as store:
        return {name: series(store, 1, name) for name in ("train/loss", "val/loss")}


@pytest.mark.slow
@pytest.mark.parametrize("launch", LAUNCHES)
def test_two_nodes_train_one_run_that_rank_zero_records(
    tmp_path, corpus, one_node_two_ranks, launch
):
    store_path = tmp_path / "store" / "blockviz.db"
    store_path.parent.mkdir()
    port = str(free_port())
    nodes = []
    for node in (0, 1):
        cwd = tmp_path / f"node{node}"  # each "machine" works in a folder of its own
        cwd.mkdir()
        env = clean_env(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            NODE_RANK=str(node),
            WORLD_SIZE="2",
            **LAUNCHES[launch],
        )
        nodes.append((train_command(corpus, store_path, *TWO_NODES), cwd, env))
    started = time.perf_counter()
    rank0, rank1 = run_together(nodes, tmp_path)
    seconds = time.perf_counter() - started
    assert rank0["code"] == 0, rank0["out"] + rank0["err"]
    assert rank1["code"] == 0, rank1["out"] + rank1["err"]
    print(f"two nodes, {STEPS} steps: {seconds:.1f} s")

    # Rank 0 announced the run's start and end; rank 1 said nothing and wrote nothing,
    # and neither wrote into the folder it ran in.
    said = [line for line in rank0["out"].splitlines() if line.startswith("blockviz: run ")]
    assert len(said) == 2 and ") started; store " in said[0] and ") completed: " in said[1]
    assert "blockviz: run" not in rank1["out"] + rank1["err"]
    assert list((tmp_path / "node0").iterdir()) == list((tmp_path / "node1").iterdir()) == []

    with RunStore(store_path, readonly=True) as store:
        runs = store.runs_frame()
        assert len(runs) == 1  # rank 1 registered no run of its own
        run = store.get_run(int(runs.id[0]))
        assert sorted(p.name for p in store.runs_root.iterdir()) == [str(run.id)]
        train_log = (store.run_dir(run.id) / "train.log").read_text(encoding="utf-8")
        loss = series(store, run.id, "train/loss")
        val = series(store, run.id, "val/loss")
        rate = series(store, run.id, "train/tokens_per_sec")
        step_time = series(store, run.id, "train/step_time")

    assert run.status == "completed" and run.step == STEPS and run.error is None
    train = run.config["train"]
    assert (train["num_nodes"], train["devices"], train["strategy"]) == (2, 1, "ddp")
    # Lightning's own account: one process group of two ranks over gloo, rank 0 first.
    assert run.device.startswith("2x cpu (ddp), ")
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in train_log
    assert "distributed_backend=gloo" in train_log
    assert "All distributed processes registered. Starting with 2 processes" in train_log

    # Every step once, from rank 0 alone.
    assert sorted(loss) == list(range(STEPS))
    assert sorted(rate) == sorted(step_time) == list(range(STEPS))
    assert sorted(val) == [10, 20]

    # Tokens: batch x context x devices x nodes per step, as the tokens axis counts them.
    per_step = train["batch_size"] * run.config["model"]["block_size"] * 1 * 2
    assert tokens_per_step(run.config) == per_step == 512
    for step in range(STEPS):
        assert rate[step] * step_time[step] == pytest.approx(per_step, rel=1e-9)
    assert run.final["tokens_per_sec"] == pytest.approx(
        per_step * STEPS / sum(step_time.values()), rel=1e-9
    )

    # The two ranks trained together: every update averaged both ranks' gradients, so the
    # losses are those of one node with two ranks, not those of rank 0 alone.
    assert loss == pytest.approx(one_node_two_ranks["train/loss"], rel=1e-6)
    assert val == pytest.approx(one_node_two_ranks["val/loss"], rel=1e-6)


def test_a_rank_after_zero_resumes_on_the_lr_schedule_of_rank_zero(tmp_path, monkeypatch):
    # A resume with a larger --max_steps keeps the run's first lr horizon (plan_resume).
    # The other ranks built theirs from the new max_steps: their lr decayed more slowly
    # than rank 0's, and DDP, which averages gradients and not updates, let the copies of
    # the model drift apart.
    corpus = tmp_path / "fox.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    first = tiny_config(dataset=str(corpus), max_steps=20)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    # What rank 0 leaves for the ranks it starts: the run's config with the new max_steps
    # and the first session's checkpoint (the hyperparameters LitCharModel saved).
    (run_dir / "config.json").write_text(cfg.replace(first, max_steps=30).to_json())
    hparams = {"run_config": first.to_dict(), "vocab_json": None, "schedule_steps": None}
    torch.save(
        {"global_step": 20, "hyper_parameters": hparams}, run_dir / "checkpoints" / "last.ckpt"
    )
    for name in RANK_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")  # as Lightning's launcher starts rank 1
    monkeypatch.setenv(ENV_RUN_DIR, str(run_dir))
    monkeypatch.setenv(ENV_LEGACY_EVAL, "0")
    plans = []

    def fit(plan, *args, **kwargs):
        plans.append(plan)
        return Outcome("completed", 30), None, None

    monkeypatch.setattr(train_cli, "fit", fit)
    threads = torch.get_num_threads()
    try:
        argv = ["train", "--resume", "1", "--max_steps", "30", "--threads", "1"]
        code = cli.main([*argv, "--store", str(tmp_path / "never-opened.db")])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    [plan] = plans
    assert plan.checkpoint == run_dir / "checkpoints" / "last.ckpt"
    assert plan.config.train.max_steps == 30
    assert plan.schedule_steps == 20
    assert not (tmp_path / "never-opened.db").exists()


@pytest.mark.parametrize(
    ("env", "rank_zero"),
    [
        ({}, True),  # a person's command on one machine
        ({"NODE_RANK": "0", "WORLD_SIZE": "2"}, True),  # node 0; Lightning launches
        ({"NODE_RANK": "1", "WORLD_SIZE": "2"}, False),  # node 1; Lightning launches
        ({"NODE_RANK": "1", "LOCAL_RANK": "0"}, False),  # node 1, started by hand
        ({"LOCAL_RANK": "1"}, False),  # a rank Lightning's launcher started
        ({"RANK": "1", "LOCAL_RANK": "0"}, False),  # torchrun's first process on node 1
        ({"SLURM_PROCID": "0"}, True),  # srun's tasks
        ({"SLURM_PROCID": "3", "SLURM_LOCALID": "0"}, False),
    ],
)
def test_only_global_rank_zero_records_the_run(monkeypatch, env, rank_zero):
    for name in RANK_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (global_rank_from_env() == 0) == rank_zero
