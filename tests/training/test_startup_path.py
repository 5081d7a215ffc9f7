"""What stands between Launch and the first loss point (issue 13, item 18).

The training process imports only what its first step needs, and the first loss it
logs reaches the store at once rather than a flush interval later.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from blockviz.core import startup_trace
from blockviz.store import RunStore
from blockviz.training.logger import StoreLogger

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_training_process_does_not_import_pandas() -> None:
    # pandas (and pyarrow under it) took about a second of a run's start-up; a run writes
    # through the store but never reads a frame.
    code = (
        "import sys, blockviz.training.train; "
        "print(sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_store_frames_still_work_after_lazy_pandas(tmp_path: Path) -> None:
    with RunStore(tmp_path / "s.db") as store:
        run_id = store.create_run("r", "{}", status="running")
        store.log_scalars(run_id, [(0, "train/loss", 2.5), (1, "train/loss", 2.25)])
        store.flush()
        frame = store.scalars(run_id, names="train/loss")
        assert frame["value"].tolist() == [2.5, 2.25]
        assert store.runs_frame()["name"].tolist() == ["r"]


def test_store_logger_flushes_the_first_loss_at_once(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    writer = RunStore(path, flush_seconds=3600)  # only StoreLogger's own cadence flushes
    run_id = writer.create_run("r", "{}", status="running")
    logger = StoreLogger(writer, run_id, flush_every_s=3600)
    with RunStore(path) as reader:
        logger.log_metrics({"train/loss": 3.0}, step=0)
        assert reader.scalars(run_id, names="train/loss")["step"].tolist() == [0]
        logger.log_metrics({"train/loss": 2.9}, step=1)  # within the interval: buffered
        assert reader.scalars(run_id, names="train/loss")["step"].tolist() == [0]
        logger.finalize("success")
        assert reader.scalars(run_id, names="train/loss")["step"].tolist() == [0, 1]
    writer.close()


def test_startup_trace_marks_each_phase_once_and_only_when_asked(
    tmp_path: Path, monkeypatch
) -> None:
    trace = tmp_path / "trace.txt"
    monkeypatch.delenv(startup_trace.ENV, raising=False)
    startup_trace.mark("unasked")
    monkeypatch.setenv(startup_trace.ENV, str(trace))
    monkeypatch.setattr(startup_trace, "_seen", set())
    startup_trace.mark("phase one")
    startup_trace.mark("phase one")
    startup_trace.mark("phase two")
    lines = trace.read_text().splitlines()
    assert [line.rsplit(" ", 1)[0] for line in lines] == ["phase one", "phase two"]
    stamps = [float(line.rsplit(" ", 1)[1]) for line in lines]
    assert stamps == sorted(stamps)
