"""Export never writes outside --out: symlinked folders, symlinks at file names, `..`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from blockviz import cli
from blockviz.store import RunStore
from blockviz.views.export.outfolder import ExportError, OutFolder
from tests.real_runs import RealRuns, copy_run


@pytest.fixture
def run_name(real_runs: RealRuns) -> Iterator[str]:
    """One completed real run with a config, in the default store; its name."""
    store = RunStore()
    run_id = copy_run(store, real_runs.path, real_runs.ids["pre"])
    name = store.get_run(run_id).name
    store.close()
    yield name


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside --out holding one file that must never change."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "victim.csv").write_text("keep me\n")
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under a folder (links not followed) with its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


def export_cli(
    run: str, out: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    code = cli.main(["export", run, "--out", str(out), "--format", fmt])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("folder", "fmt"), [("charts", "csv"), ("charts", "html"), ("configs", "all")]
)
def test_a_symlinked_subfolder_is_refused_and_nothing_lands_outside(
    run_name: str,
    tmp_path: Path,
    outside: Path,
    folder: str,
    fmt: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / folder).symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    code, err = export_cli(run_name, out, fmt, capsys)
    assert code == 2
    assert len(err.splitlines()) == 1 and str(out / folder) in err and "symlink" in err
    assert snapshot(outside) == before
    assert (out / folder).is_symlink()  # left as it was


def test_a_symlink_at_a_file_name_is_refused_and_its_target_unchanged(
    run_name: str, tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    (out / "charts").mkdir(parents=True)
    trap = out / "charts" / "loss.csv"
    trap.symlink_to(outside / "victim.csv")
    before = snapshot(outside)
    code, err = export_cli(run_name, out, "csv", capsys)
    assert code == 2
    assert len(err.splitlines()) == 1 and str(trap) in err
    assert snapshot(outside) == before
    assert trap.is_symlink()


def test_a_hard_link_at_a_file_name_is_replaced_not_written_through(
    run_name: str, tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.link(outside / "victim.csv", out / "scalars.csv")
    before = snapshot(outside)
    code, _ = export_cli(run_name, out, "csv", capsys)
    assert code == 0
    assert snapshot(outside) == before
    assert (out / "scalars.csv").read_text().startswith("run,step,name,value")


def test_a_folder_swapped_for_a_symlink_after_opening_is_not_followed(
    tmp_path: Path, outside: Path
) -> None:
    out = tmp_path / "out"
    before = snapshot(outside)
    with OutFolder(out) as folder:
        folder.folder("charts")
        (out / "charts").rename(out / "charts-moved")
        (out / "charts").symlink_to(outside, target_is_directory=True)
        written = folder.write("charts/loss.csv", "step,value\n")
    assert snapshot(outside) == before
    # The write went into the folder that was checked, wherever it now is.
    assert (out / "charts-moved" / "loss.csv").read_text() == "step,value\n"
    assert written == out.resolve() / "charts" / "loss.csv"


@pytest.mark.parametrize(
    "relative", ["../escape.csv", "charts/../../escape.csv", "..", "charts/", "/abs.csv", "a\\b"]
)
def test_out_folder_refuses_names_that_leave_it(tmp_path: Path, relative: str) -> None:
    out = tmp_path / "out"
    with OutFolder(out) as folder, pytest.raises(ExportError):
        folder.write(relative, "x")
    assert not (tmp_path / "escape.csv").exists()
    assert snapshot(out) == {}


def test_out_folder_leaves_no_temporary_files(tmp_path: Path) -> None:
    with OutFolder(tmp_path / "out") as folder:
        folder.write("charts/a.csv", "1")
        folder.write("charts/a.csv", "2")  # a second export replaces the file
        folder.write("b.csv", b"3")
    assert snapshot(tmp_path / "out") == {"charts/a.csv": b"2", "b.csv": b"3"}
