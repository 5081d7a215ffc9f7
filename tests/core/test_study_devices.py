"""Studies default to what the device affords (issue 34): on a GPU more seeds per variant
and bigger replica batches, with a sentence saying why; on a CPU exactly the sizes' own
defaults. The device is faked: `hardware.visible_gpus` is what the torch-free side asks."""

from __future__ import annotations

from pathlib import Path

import pytest

from blockviz import cli
from blockviz.core import hardware, replicas
from blockviz.core.fields import ConfigError
from blockviz.core.studies import builtins, define, sweeps
from blockviz.launch import study_runner
from blockviz.store import RunStore


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """Set how many GPUs this machine shows: `gpus(1)`."""

    def set_count(count: int) -> None:
        monkeypatch.setattr(hardware, "visible_gpus", lambda: count)

    return set_count


@pytest.mark.parametrize("size", define.SIZES)
def test_on_a_cpu_a_builtin_study_keeps_its_sizes_seeds(gpus, size: str) -> None:
    gpus(0)
    assert define.SIZE_SEEDS == {"quick": 2, "standard": 3, "full": 5}
    for key in builtins.STUDY_KEYS:
        study = builtins.builtin(key, size)
        assert study.seeds == tuple(range(1, define.SIZE_SEEDS[size] + 1))
    assert define.seeds_note() is None


@pytest.mark.parametrize("size", define.SIZES)
def test_on_a_gpu_every_builtin_study_defaults_to_more_seeds(gpus, size: str) -> None:
    gpus(1)
    for key in builtins.STUDY_KEYS:
        study = builtins.builtin(key, size)
        assert study.seeds == tuple(range(1, define.GPU_SEEDS + 1))
        assert study.n_runs <= define.MAX_STUDY_RUNS
    assert max(define.SIZE_SEEDS.values()) < define.GPU_SEEDS
    # Seeds asked for are seeds given, on either device.
    assert builtins.builtin("activation", size, 3).seeds == (1, 2, 3)


def test_a_sweeps_default_seeds_follow_the_runs_accelerator(gpus) -> None:
    gpus(0)
    assert sweeps.sweep({"lr": [1e-3, 2e-3]}).seeds == (1,)
    gpus(1)
    assert len(sweeps.sweep({"lr": [1e-3, 2e-3]}).seeds) == define.GPU_SEEDS
    # A sweep pinned to the CPU on a GPU machine keeps the CPU's default.
    assert sweeps.sweep({"lr": [1e-3, 2e-3]}, fixed={"accelerator": "cpu"}).seeds == (1,)
    assert sweeps.sweep({"lr": [1e-3, 2e-3]}, seeds=2).seeds == (1, 2)
    with pytest.raises(ConfigError, match="seeds"):
        sweeps.sweep({"lr": [1e-3, 2e-3]}, seeds=0)


def test_accelerator_gpu_counts_as_a_gpu_and_cpu_never_does(gpus) -> None:
    gpus(0)
    assert define.on_gpu("gpu") and not define.on_gpu("auto") and not define.on_gpu("cpu")
    gpus(2)
    assert define.on_gpu("auto") and not define.on_gpu("cpu") and not define.on_gpu("mps")


def test_the_gpu_note_says_how_many_seeds_and_why(gpus) -> None:
    gpus(1)
    note = define.seeds_note()
    assert f"{define.GPU_SEEDS} seeds per variant" in note
    assert "quick 2, standard 3, full 5" in note
    assert f"up to {replicas.GPU_REPLICAS} at once" in note and "batched model" in note
    assert define.seeds_note("cpu") is None


def test_replicas_auto_is_the_cpu_default_of_before_and_bigger_on_a_gpu(gpus) -> None:
    gpus(0)
    assert replicas.DEFAULT_REPLICAS == "auto"
    assert replicas.parse_replicas(replicas.DEFAULT_REPLICAS) == replicas.CPU_REPLICAS == 8
    gpus(1)
    assert replicas.parse_replicas("AUTO") == replicas.GPU_REPLICAS == 64
    assert replicas.parse_replicas("8") == 8 and replicas.parse_replicas("off") == 1


def _stored(tmp_path: Path, capsys, *args: str) -> tuple[str, int]:
    """`study ARGS --workers 0` in this process: what it printed, and the runs it stored."""
    store = tmp_path / "runs.db"
    code = cli.main(["study", *args, "--workers", "0", "--store", str(store)])
    assert code == 0
    with RunStore(store) as opened:
        runs = len(opened.study_runs(1))
    return capsys.readouterr().out, runs


def test_the_cli_stores_the_devices_default_seeds(gpus, tmp_path: Path, capsys) -> None:
    gpus(0)
    out, runs = _stored(tmp_path / "cpu", capsys, "run", "activation")
    assert runs == 4 * 2 and "8 runs stored" in out
    out, runs = _stored(tmp_path / "cpu-sweep", capsys, "sweep", "--lr", "1e-3,2e-3")
    assert runs == 2
    gpus(1)
    out, runs = _stored(tmp_path / "gpu", capsys, "run", "activation")
    assert runs == 4 * define.GPU_SEEDS
    out, runs = _stored(tmp_path / "gpu-sweep", capsys, "sweep", "--lr", "1e-3,2e-3")
    assert runs == 2 * define.GPU_SEEDS
    out, runs = _stored(tmp_path / "gpu-3", capsys, "run", "activation", "--seeds", "3")
    assert runs == 4 * 3


def test_the_cli_says_why_a_gpu_study_has_more_seeds(
    gpus, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(study_runner, "start_workers", lambda *a, **k: [])
    store = str(tmp_path / "runs.db")
    gpus(0)
    assert cli.main(["study", "run", "activation", "--detach", "--store", store]) == 0
    assert "8 runs (4 variants × 2 seeds)" in capsys.readouterr().out
    gpus(1)
    assert cli.main(["study", "run", "activation", "--detach", "--store", store]) == 0
    out = capsys.readouterr().out
    assert f"(4 variants × {define.GPU_SEEDS} seeds)" in out and define.seeds_note() in out
    # Seeds asked for need no explaining.
    args = ["study", "run", "activation", "--seeds", "2", "--detach", "--store", store]
    assert cli.main(args) == 0
    assert "on a GPU" not in capsys.readouterr().out


@pytest.mark.parametrize(("flag", "sent"), [([], None), (["--replicas", "4"], 4)])
def test_study_launch_leaves_auto_to_the_workers(
    gpus, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, flag, sent
) -> None:
    """A cluster's workers train elsewhere: `auto` is not resolved on the launching machine
    (no GPU here) but sent on as no flag, which each worker resolves where it trains."""
    from types import SimpleNamespace

    from blockviz.launch import cluster

    gpus(0)
    _stored(tmp_path, capsys, "run", "activation")
    seen = []

    def launch_local(store, study_id, count, threads, replicas, *rest):
        seen.append(replicas)
        return SimpleNamespace(job_ids=["1"], command=["-m", "blockviz"], folder=tmp_path)

    monkeypatch.setattr(cluster, "launch_local", launch_local)
    args = ["study", "launch", "1", "--local", "1", *flag, "--store", str(tmp_path / "runs.db")]
    assert cli.main(args) == 0
    assert seen == [sent]
