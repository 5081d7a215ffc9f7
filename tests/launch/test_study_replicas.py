"""A study batches its runs into replicas by default, and what it concludes does not change:
the same sweep trained with `--replicas off` and by default gives every run the same losses
(on a CPU, to float32 rounding) and the study the same table and verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blockviz.core import replicas
from blockviz.store import RunStore
from tests.fakes import CORPUS
from tests.helpers import study

pytestmark = pytest.mark.slow

SWEEP = [
    *("--preset", "tiny", "--max_steps", "20", "--warmup_steps", "2", "--eval_interval", "10"),
    *("--probe_interval", "10", "--sample_interval", "20", "--accelerator", "cpu"),
    *("--lr", "1e-3,3e-3", "--norm_position", "pre,post", "--seeds", "2"),
    *("--workers", "1", "--threads", "1"),
]


def _sweep(store: Path, corpus: Path, *flags: str) -> dict:
    done = study(store, "sweep", *SWEEP, "--dataset", str(corpus), *flags, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = study(store, "show", "1", "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    return json.loads(shown.stdout)


def test_a_sweep_batches_by_shape_by_default_and_concludes_what_it_does_alone(tmp_path):
    corpus = tmp_path / "fox.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    alone = _sweep(tmp_path / "alone.db", corpus, "--replicas", "off")
    batched = _sweep(tmp_path / "batched.db", corpus)
    with RunStore(tmp_path / "alone.db") as a, RunStore(tmp_path / "batched.db") as b:
        runs_a, runs_b = a.study_runs(1), b.study_runs(1)
        assert runs_a["status"].tolist() == runs_b["status"].tolist() == ["completed"] * 8
        for run_a, run_b in zip(runs_a["id"], runs_b["id"], strict=True):
            fa, fb = a.get_run(int(run_a)).final, b.get_run(int(run_b)).final
            for key in ("val_loss", "train_loss"):
                assert fa[key] == pytest.approx(fb[key], rel=1e-5), key
            assert replicas.read_batch_file(a.run_dir(int(run_a))) is None
        # Pre-LN and Post-LN are two shapes: two batches of four (2 lr × 2 seeds) each.
        batches = {tuple(replicas.read_batch_file(b.run_dir(int(i)))["runs"]) for i in runs_b["id"]}
        assert sorted(len(members) for members in batches) == [4, 4]
    # The per-variant table (but its times) and the learning-rate sensitivity.
    for key in ("variants", "sensitivity"):
        assert _timeless(alone[key]) == _close(_timeless(batched[key])), key
    assert [c["verdict"] for c in alone["claims"]] == [c["verdict"] for c in batched["claims"]]


def _close(value):
    """The value with every float compared to float32 rounding (pytest.approx)."""
    if isinstance(value, dict):
        return {k: _close(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_close(v) for v in value]
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-4, abs=1e-7)
    return value


def _timeless(value):
    """The value without the entries that measure time (they differ run to run)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if "time" not in k}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value
