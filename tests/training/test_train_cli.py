"""`python -m blockviz train / runs / show / stop`: real runs end to end, in subprocesses
where a process is what is tested (concurrent writers, signals, kill -9, DDP, a slot), in
this process where only the run is (no interpreter and torch import to wait for)."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from blockviz import cli
from blockviz.core import forks, hardware, procs
from blockviz.core.spec import FFN_UNIT_STATS, STREAM_STATS, TAP_STATS
from blockviz.store import RunStore
from blockviz.training.model import block_tap_names
from tests import fakes
from tests.helpers import finish, start, train_args, train_command, train_here

ROOT = Path(__file__).resolve().parents[2]
DIVERGING = [  # lr 10 without warm-up, clipping or norms: non-finite at step 1
    *("--lr", "10", "--warmup_steps", "0", "--grad_clip", "0", "--norm_position", "none"),
    *("--n_layer", "6", "--activation", "relu"),
]

pytestmark = pytest.mark.slow


def wait_for_rows(store_path: Path, count: int, timeout: float = 90) -> None:
    """Until the store holds `count` train/loss rows of run 1 (they land every ~second)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store_path.exists():
            with RunStore(store_path) as store:
                runs = store.runs_frame()
                if len(runs) and len(store.scalars(1, names="train/loss")) >= count:
                    return
        time.sleep(0.2)
    raise AssertionError(f"no {count} train/loss rows in {timeout} s")


# ------------------------------------------------------- two tiny runs at the same time


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, corpus):
    """A (fp32, overfitting at lr 3e-3) and B (bf16-mixed) write one store concurrently."""
    store_path = tmp_path_factory.mktemp("two") / "blockviz.db"
    procs = {
        "fp32": start(
            train_command(store_path, corpus, "--max_steps", "30", "--lr", "3e-3", "--threads", "1")
        ),
        "bf16": start(
            train_command(store_path, corpus, "--max_steps", "30", "--precision", "bf16-mixed")
        ),
    }
    results = {name: finish(proc) for name, proc in procs.items()}
    for name, (code, out, err) in results.items():
        assert code == 0, f"{name}: {out}\n{err}"
    store = RunStore(store_path)
    ids = {}
    for name, (_, out, _) in results.items():
        first_line = out.splitlines()[0]
        assert first_line.startswith("blockviz: run ")
        ids[name] = int(first_line.split()[2])
    yield store, ids, results
    store.close()


def test_both_runs_complete_with_their_precision(two_runs):
    store, ids, results = two_runs
    for name, run_id in ids.items():
        run = store.get_run(run_id)
        assert run.status == "completed" and run.step == 30
        assert run.precision == {"fp32": "32-true", "bf16": "bf16-mixed"}[name]
        # fp32 asked for one thread; bf16 took its share of the cores (cores ÷ slots).
        threads = 1 if name == "fp32" else hardware.default_threads()
        assert run.device == f"cpu, {hardware.threads_text(threads)}"
        assert run.final["steps"] == 30 and run.final["val_loss"] > 0
        assert f"run {run_id} " in results[name][1].splitlines()[-1]  # id printed at the end


def test_concurrent_runs_lose_no_rows(two_runs):
    store, ids, _ = two_runs
    for run_id in ids.values():
        frame = store.scalars(run_id)
        counts = frame.groupby("name").size().to_dict()
        for name in ("train/loss", "train/lr", "train/step_time", "train/tokens_per_sec"):
            assert counts[name] == 30, name
        assert sorted(frame[frame.name == "train/loss"].step) == list(range(30))
        assert sorted(frame[frame.name == "val/loss"].step) == [25, 30]
        assert sorted(frame[frame.name == "train/grad_norm"].step) == [0, 10, 20, 29]  # 29: last


def test_probes_recorded_every_layer_component_and_tap(two_runs):
    store, ids, _ = two_runs
    run_id = ids["fp32"]
    config = store.get_run(run_id).config
    n_layer = config["model"]["n_layer"]
    grads = store.layer_stats(run_id, kind="component", stat="grad_norm")
    at_zero = grads[grads.step == 0]
    components = set(zip(at_zero.layer, at_zero.component, strict=True))
    for layer in range(n_layer):
        assert {(layer, c) for c in ("attn", "ffn", "norm", "block")} <= components
    assert {(-1, "embed"), (n_layer, "head")} <= components
    assert sorted(grads.step.unique()) == [0, 10, 20, 29]  # every 10 steps and the last
    updates = store.layer_stats(run_id, kind="component", stat="update_ratio")
    assert len(updates) == len(grads) and (updates.value > 0).all()
    taps = store.layer_stats(run_id, kind="tap", step=20)
    from blockviz.core.config import RunConfig

    tap_names = block_tap_names(RunConfig.from_dict(config).model)
    # every tap's statistics, plus the stream's at resid_post and the units' at ffn_hidden
    extras = len(STREAM_STATS) + len(FFN_UNIT_STATS)
    assert len(taps) == n_layer * (len(tap_names) * len(TAP_STATS) + extras)
    assert set(taps.component) == set(tap_names)
    assert not store.histograms(run_id, layer=n_layer - 1, tap="ffn_hidden").empty
    assert store.attention_steps(run_id) == [0, 25, 30]
    assert sorted(store.samples(run_id).step) == [0, 25, 30]


def test_loss_goes_down_when_overfitting(two_runs):
    store, ids, _ = two_runs
    loss = store.scalars(ids["fp32"], names="train/loss").sort_values("step").value.to_numpy()
    assert loss[-5:].mean() < loss[:5].mean() - 0.5
    val = store.scalars(ids["fp32"], names="val/loss").sort_values("step").value.to_numpy()
    assert val[-1] < loss[0]


def test_run_folder_holds_config_vocab_log_and_safe_checkpoints(two_runs):
    store, ids, _ = two_runs
    run_dir = store.run_dir(ids["fp32"])
    assert json.loads((run_dir / "config.json").read_text())["train"]["max_steps"] == 30
    assert json.loads((run_dir / "vocab.json").read_text())["chars"]
    assert (run_dir / "train.log").exists()
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 30
    best = torch.load(run_dir / "checkpoints" / "best.ckpt", weights_only=True)
    assert best["global_step"] in (25, 30)


def test_runs_and_show_commands(two_runs, capsys):
    store, ids, _ = two_runs
    assert cli.main(["runs", "--store", str(store.path)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["id", "name", "status"]
    assert table.count("completed") == 2 and "30/30" in table
    assert cli.main(["runs", "--store", str(store.path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["id"] for row in rows} == set(ids.values())
    assert cli.main(["show", str(ids["bf16"]), "--store", str(store.path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["precision"] == "bf16-mixed" and shown["last_sample"]["step"] == 30
    assert shown["final_metrics"]["val_loss"] == pytest.approx(shown["final"]["val_loss"])
    assert cli.main(["show", str(ids["fp32"]), "--store", str(store.path)]) == 0
    text = capsys.readouterr().out
    assert "completed" in text and "last sample (step 30" in text
    assert "cpu, 1 thread, precision 32-true" in text
    host = store.get_run(ids["fp32"])
    assert f"host         {procs.this_host()}, process {host.pid}" in text
    assert "from the evaluation seed" in next(ln for ln in text.splitlines() if "val loss on" in ln)
    assert cli.main(["stop", str(ids["fp32"]), "--store", str(store.path)]) == 0
    assert "already completed" in capsys.readouterr().out


def test_show_says_which_train_loss_and_which_throughput(tmp_path, capsys):
    path = tmp_path / "blockviz.db"
    with RunStore(path) as store:
        (run_id,) = fakes.populate(store, n_runs=1, n_steps=40, n_layer=1, statuses=["completed"])
    assert cli.main(["show", str(run_id), "--store", str(path)]) == 0
    metrics = next(line for line in capsys.readouterr().out.splitlines() if "metrics" in line)
    # The labels of Compare's table, not the bare keys: these two are easy to misread.
    assert "train loss (mean of last 50 steps) = " in metrics
    assert "mean tokens/s over training = " in metrics
    assert "train_loss" not in metrics and "tokens_per_sec" not in metrics


def test_a_run_with_every_instability_fix_trains_and_says_so(tmp_path, corpus, capsys):
    store_path = tmp_path / "blockviz.db"
    fixes = ("--qk_norm", "true", "--logit_softcap", "30", "--z_loss", "1e-4")
    flags = ("--max_steps", "5", "--accelerator", "cpu", *fixes)
    code, _out, err = train_here(train_args(store_path, corpus, *flags), capsys)
    assert code == 0, err
    with RunStore(store_path) as store:
        run = store.get_run(1)
        assert run.status == "completed" and run.step == 5
        assert {"qknorm", "softcap30", "zloss0.0001"} <= set(run.name.split("-"))
        model, train = run.config["model"], run.config["train"]
        assert (model["qk_norm"], model["logit_softcap"], train["z_loss"]) == (True, 30.0, 1e-4)
        loss = store.scalars(1, names="train/loss")
        assert len(loss) == 5 and loss.value.between(0, 10).all()  # cross-entropies
        # the probes file q_norm / k_norm under attn with the rest of attention
        grads = store.layer_stats(1, kind="component", stat="grad_norm", step=0)
        assert {(0, "attn"), (1, "attn")} <= set(zip(grads.layer, grads.component, strict=True))
    assert cli.main(["show", "1", "--store", str(store_path)]) == 0
    shown = capsys.readouterr().out
    assert "qk-norm (layernorm)" in shown and "logit soft-cap 30" in shown
    assert "z-loss 0.0001" in shown


# -------------------------------------------------------------- endings of a run


def test_divergence_is_a_result_not_a_crash(tmp_path, corpus, capsys):
    store_path = tmp_path / "blockviz.db"
    code, out, err = train_here(train_args(store_path, corpus, *DIVERGING), capsys)
    assert code == 0, err
    assert "diverged at step 1" in out
    with RunStore(store_path) as store:
        run = store.get_run(1)
        assert run.status == "diverged" and run.diverged_step == 1
        loss = store.scalars(1, names="train/loss").set_index("step").value
        assert list(loss.index) == [0, 1]
        assert not torch.isfinite(torch.tensor(loss[1]))  # the bad value is recorded
        assert store.layer_stats(1, kind="component").step.unique().tolist() == [0]
    # `show` says where and how, in the Live page's words (views.run_facts), and as JSON.
    assert cli.main(["show", "1", "--store", str(store_path)]) == 0
    shown = capsys.readouterr().out
    assert "This run diverged at step 1." in shown and "train/loss = " in shown
    assert cli.main(["show", "1", "--store", str(store_path), "--json"]) == 0
    divergence = json.loads(capsys.readouterr().out)["divergence"]
    assert divergence["step"] == 1 and divergence["nonfinite_step"] == 1


def test_a_divergence_on_a_sample_step_is_still_diverged(tmp_path, corpus, capsys):
    """Sampling from the blown-up model must not turn the result into a crash (failed)."""
    store_path = tmp_path / "blockviz.db"
    command = train_args(store_path, corpus, *DIVERGING, "--sample_interval", "1")
    code, _out, err = train_here(command, capsys)
    assert code == 0, err
    with RunStore(store_path) as store:
        run = store.get_run(1)
        assert (run.status, run.diverged_step, run.error) == ("diverged", 1, None)
        assert store.samples(1)["step"].tolist() == [0]  # nothing sampled from non-finite logits


def test_sigterm_stops_with_a_checkpoint_and_resume_continues_from_it(tmp_path, corpus):
    store_path = tmp_path / "blockviz.db"
    proc = start(train_command(store_path, corpus, "--max_steps", "5000"))
    wait_for_rows(store_path, 5)
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    assert code == 0, err
    with RunStore(store_path) as store:
        run = store.get_run(1)
        stopped_at = run.step
        assert run.status == "stopped" and stopped_at >= 5
        assert run.final["time_s"] > 0
        # Pretend the first session trained for 1000 s: the resumed run must count it.
        store.update_run(1, final={**run.final, "time_s": 1000.0})
        # ... and that it was recorded before the evaluation set (no record of its windows):
        # resumed, it must keep scoring on the windows its training seed draws.
        assert run.dataset["evaluation"]["scheme"] == "eval-seed"
        store.update_run(1, dataset={k: v for k, v in run.dataset.items() if k != "evaluation"})
        assert f"stopped at step {stopped_at}" in out
        checkpoint = store.run_dir(1) / "checkpoints" / "last.ckpt"
        assert torch.load(checkpoint, weights_only=True)["global_step"] == stopped_at
        assert store.scalars(1, names="train/loss").step.max() == stopped_at - 1

    target = stopped_at + 12
    resume = [
        sys.executable,
        *("-m", "blockviz", "train", "--resume", "1", "--store", str(store_path)),
        *("--max_steps", str(target), "--no_progress"),
    ]
    code, out, err = finish(start(resume))
    assert code == 0, err
    assert f"resuming from step {stopped_at}" in out
    with RunStore(store_path) as store:
        run = store.get_run(1)
        assert run.status == "completed" and run.step == target
        steps = sorted(store.scalars(1, names="train/loss").step)
        assert steps == list(range(target))  # continued, not restarted or duplicated
        # Time adds up over both sessions; started..ended spans them (the pause left out).
        assert 1000.0 < run.final["time_s"] < 1000.0 + 300
        assert run.ended - run.started >= 1000.0
        assert run.dataset["evaluation"]["scheme"] == "training-seed"
        assert run.dataset["evaluation"]["seed"] == 1337 + 1_000_003


def test_kill_9_is_seen_as_failed(tmp_path, corpus):
    store_path = tmp_path / "blockviz.db"
    proc = start(train_command(store_path, corpus, "--max_steps", "5000"))
    wait_for_rows(store_path, 3)
    proc.kill()
    proc.wait(timeout=30)
    time.sleep(1.0)
    with RunStore(store_path) as store:
        assert store.get_run(1).status == "running"  # nobody told the store
        assert store.reap_dead(stale_after=0.5) == [1]
        run = store.get_run(1)
        assert run.status == "failed" and str(proc.pid) in run.error


def test_a_queued_run_waits_for_a_slot_and_ctrl_c_stops_it_cleanly(tmp_path, corpus):
    store_path = tmp_path / "blockviz.db"
    with RunStore(store_path) as store:  # a running run owned by this (alive) process
        store.create_run("blocker", "{}", status="running", pid=os.getpid())
    proc = start(train_command(store_path, corpus, "--max_running", "1"))
    deadline = time.monotonic() + 90
    with RunStore(store_path) as store:
        while time.monotonic() < deadline:
            runs = store.runs_frame()
            if len(runs) == 2 and runs.status.iloc[1] == "queued" and runs.pid.iloc[1] == proc.pid:
                break
            time.sleep(0.2)
        time.sleep(1.5)  # a few polls of the slot later, still waiting
        assert store.get_run(2).status == "queued"
    proc.send_signal(signal.SIGINT)  # Ctrl-C takes the same path as SIGTERM
    code, _, err = finish(proc)
    assert code == 0, err
    with RunStore(store_path) as store:
        assert store.get_run(2).status == "stopped"
        assert store.scalars(2).empty


def test_stop_marks_a_queued_run_without_a_process_stopped(tmp_path, capsys):
    store_path = tmp_path / "blockviz.db"
    with RunStore(store_path) as store:
        store.create_run("waiting", "{}", status="queued")
    assert cli.main(["stop", "waiting", "--store", str(store_path)]) == 0
    assert "marked stopped" in capsys.readouterr().out
    with RunStore(store_path) as store:
        assert store.get_run(1).status == "stopped"


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--n_layer", "0"], "n_layer"),
        (["--lr", "fast"], "lr"),
        (["--precision", "64-true"], "precision"),
        (["--dataset", "/no/such/file.txt"], "/no/such/file.txt"),
        (["--resume", "nope"], "nope"),
        (["--max_running", "-1"], "--max_running"),
        (["--bogus_flag", "1"], "--bogus_flag"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_creates_no_run(tmp_path, capsys, flags, named):
    store_path = tmp_path / "blockviz.db"
    if flags[0] == "--resume":
        RunStore(store_path).close()  # a store to look the run up in
    assert exit_code(["train", "--store", str(store_path), *flags]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and named in err
    if flags[0] == "--resume":  # the store is opened to look the run up, and stays empty
        with RunStore(store_path) as store:
            assert store.runs_frame().empty
    else:  # nothing is created, not even the store file
        assert not store_path.exists()


@pytest.mark.parametrize("flag", ["--resume", "--run_id"])
def test_a_run_in_a_missing_store_is_one_line_and_creates_no_store(tmp_path, capsys, flag):
    """A study worker's runs (--run_id) re-created a store deleted under them, empty."""
    store_path = tmp_path / "gone" / "blockviz.db"
    assert exit_code(["train", "--store", str(store_path), flag, "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"blockviz train: error: no run store at {store_path} (no such file)")
    assert not store_path.parent.exists()


def exit_code(argv: list[str]) -> int:
    """cli.main's status, also when argparse exits on its own."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code)


def test_a_precreated_run_with_bad_data_is_marked_failed(tmp_path, capsys):
    store_path = tmp_path / "blockviz.db"
    with RunStore(store_path) as store:
        run_id = store.create_run("from-the-dashboard", "{}", status="queued")
    argv = ["train", "--store", str(store_path), "--run_id", str(run_id)]
    assert cli.main([*argv, "--dataset", "/no/such/file.txt"]) == 2
    assert "/no/such/file.txt" in capsys.readouterr().err
    with RunStore(store_path) as store:
        run = store.get_run(run_id)
        assert run.status == "failed" and "/no/such/file.txt" in run.error


# ------------------------------------------------------------------ DDP on CPU


def test_ddp_on_two_cpu_processes_writes_once_from_rank_zero(tmp_path, corpus):
    store_path = tmp_path / "blockviz.db"
    flags = ["--max_steps", "10", "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp"]
    # Kept checkpoints every step, at most 2: they thin from step 3 on, and every rank must
    # thin alike (rank 1 once kept saving on the first spacing and waited forever).
    flags += ["--ckpt_interval", "1", "--ckpt_keep", "2"]
    code, out, err = finish(start(train_command(store_path, corpus, *flags)), timeout=120)
    assert code == 0, err
    with RunStore(store_path) as store:
        runs = store.runs_frame()
        assert len(runs) == 1 and runs.status[0] == "completed"
        assert runs.device[0].startswith("2x cpu (ddp), ")
        assert len(store.scalars(1, names="train/loss")) == 10
    assert sorted(p.name for p in store.runs_root.iterdir() if p.is_dir()) == ["1"]
    assert out.count("blockviz: run 1") == 2  # start and end lines, from rank 0 only
    assert forks.kept_steps(store_path.parent / "blockviz.db.runs" / "1") == [1, 8]


def test_the_end_of_run_line_uses_the_labels_every_view_uses(two_runs):
    _, _, outputs = two_runs
    code, out, _ = outputs["fp32"]
    assert code == 0
    line = next(line for line in out.splitlines() if " completed: " in line)
    assert "train loss (mean of last 50 steps) = " in line
    assert "mean tokens/s over training = " in line and "tokens_per_sec" not in line


# ------------------------------------------------------------------ a stop before the start


def test_a_run_stopped_before_its_process_registered_stays_stopped(
    tmp_path, corpus, capsys, monkeypatch
):
    # The dashboard's Stop marks a queued run stopped when it cannot signal the process;
    # one that landed while the process loaded its data used to be overwritten with
    # 'queued', and the run trained.
    from blockviz.training import train

    store_path = tmp_path / "blockviz.db"
    with RunStore(store_path) as store:
        run_id = store.create_run("replaced", "{}", status="queued")
    real_load = train.load_datamodule

    def load_then_get_stopped(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        with RunStore(store_path) as other:  # the dashboard's Stop, meanwhile
            other.update_run(run_id, status="stopped", ended=time.time())
        return loaded

    monkeypatch.setattr(train, "load_datamodule", load_then_get_stopped)
    argv = ["train", "--store", str(store_path), "--run_id", str(run_id), "--dataset", str(corpus)]
    assert cli.main([*argv, "--preset", "tiny", "--max_steps", "5", "--no_progress"]) == 0
    assert "stopped before it started" in capsys.readouterr().out
    with RunStore(store_path) as store:
        assert store.get_run(run_id).status == "stopped"
        assert store.scalars(run_id).empty


def test_a_run_stopped_while_it_waits_for_a_slot_is_never_claimed(tmp_path):
    from blockviz.training.lifecycle import StopRequest
    from blockviz.training.registration import wait_for_slot

    with RunStore(tmp_path / "blockviz.db") as store:
        busy = store.create_run("busy", "{}", status="queued")
        assert store.claim_slot(busy, 1, pid=os.getpid())
        waiting = store.create_run("waiting", "{}", status="queued")
        assert not store.claim_slot(waiting, 1) and store.queued_still(waiting)
        store.update_run(waiting, status="stopped")
        store.update_run(busy, status="completed")  # a slot frees: still not claimed
        assert not store.claim_slot(waiting, 1)
        assert not store.queued_still(waiting)
        started = time.monotonic()
        assert wait_for_slot(store, waiting, 1, StopRequest()) is False
        assert time.monotonic() - started < 5
        assert store.get_run(waiting).status == "stopped"
