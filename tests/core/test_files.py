"""The one atomic-write mechanism: whole files or nothing, no temporary left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blockviz.core.files import atomic_file, atomic_write


def test_atomic_write_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    target.write_text("old")
    atomic_write(target, "new text")
    assert target.read_text() == "new text"
    atomic_write(target, b"\x00bytes")
    assert target.read_bytes() == b"\x00bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_an_error_inside_the_block_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "data.txt"
    target.write_text("kept")
    with pytest.raises(RuntimeError), atomic_file(target) as handle:
        handle.write(b"half of it")
        raise RuntimeError("interrupted")
    assert target.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.txt"]


def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "chart.svg").symlink_to(outside)
    atomic_write(folder / "chart.svg", "<svg/>")
    assert outside.read_text() == "untouched"
    assert not (folder / "chart.svg").is_symlink()
    assert (folder / "chart.svg").read_text() == "<svg/>"


def test_dir_fd_writes_a_bare_name_inside_that_folder(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        atomic_write("loss.csv", "step,value\n", dir_fd=fd)
    finally:
        os.close(fd)
    assert (tmp_path / "loss.csv").read_text() == "step,value\n"
    assert [p.name for p in tmp_path.iterdir()] == ["loss.csv"]
