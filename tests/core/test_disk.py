"""A run's disk use and the store's checkpoint warning (issue 35, defect 14): the sizes
counted, the setting read, and the warning worded with the size and how to free space."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blockviz.core import disk


def _write(path: Path, n_bytes: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * n_bytes)


def test_a_folder_counts_every_file_and_checkpoints_only_ckpt_files(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "1"
    _write(run / "config.json", 100)
    _write(run / "checkpoints" / "last.ckpt", 3000)
    _write(run / "checkpoints" / "step-100.ckpt", 2000)
    _write(run / "tensorboard" / "events.out", 50)
    outside = tmp_path / "elsewhere.ckpt"
    _write(outside, 10_000)
    os.symlink(outside, run / "checkpoints" / "linked.ckpt")  # links are not followed
    assert disk.folder_bytes(run) == 5150
    assert disk.checkpoint_bytes(run) == 5000
    assert disk.checkpoint_bytes(tmp_path / "runs") == 5000
    assert disk.folder_bytes(tmp_path / "missing") == 0


@pytest.mark.parametrize(
    ("n_bytes", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (999, "999 B"),
        (312_400, "312 kB"),
        (1_250_000_000, "1.2 GB"),
        (48_900_000, "48.9 MB"),
    ],
)
def test_size_text(n_bytes: int | None, text: str) -> None:
    assert disk.size_text(n_bytes) == text


def test_the_warning_size_comes_from_the_flag_then_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(disk.WARN_ENV, raising=False)
    assert disk.warn_mb() == disk.DEFAULT_WARN_MB
    monkeypatch.setenv(disk.WARN_ENV, "500")
    assert disk.warn_mb() == 500
    assert disk.warn_mb("20") == 20
    with pytest.raises(disk.WarnSizeError, match=r"--ckpt_warn_mb: '1.5' is not allowed"):
        disk.warn_mb("1.5")
    monkeypatch.setenv(disk.WARN_ENV, "lots")
    with pytest.raises(disk.WarnSizeError, match=r"\$BLOCKVIZ_CKPT_WARN_MB: 'lots'"):
        disk.warn_mb()


def test_the_warning_names_the_size_the_limit_and_how_to_free_space() -> None:
    assert disk.over_warning(2_000_000, 2, "runs/") is None  # at the limit: no warning
    assert disk.over_warning(10**12, 0, "runs/") is None  # 0: never
    text = disk.over_warning(2_500_000, 2, "runs/blockviz.db.runs")
    assert text is not None
    assert "2.5 MB in runs/blockviz.db.runs" in text and "2.0 MB" in text
    assert "Delete" in text and "Runs page" in text
