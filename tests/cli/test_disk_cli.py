"""`runs` and `show` say what a run costs on disk, and `runs` warns when the store's
checkpoints pass the warning size (issue 35, defect 14)."""

from __future__ import annotations

import json
from pathlib import Path

from blockviz import cli
from blockviz.core import disk
from blockviz.store import RunStore, default_store_path
from tests import fakes


def _store_with_checkpoints() -> tuple[Path, list[int]]:
    """Two fake runs, the first with 3 MB of checkpoints and a small config."""
    path = default_store_path()
    with RunStore(path) as store:
        ids = fakes.populate(store, n_runs=2, n_steps=10, n_layer=1, statuses=("completed",))
        folder = store.run_dir(ids[0])
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"x" * 2_000_000)
    (folder / "checkpoints" / "step-100.ckpt").write_bytes(b"x" * 1_000_000)
    (folder / "config.json").write_bytes(b"x" * 1000)
    return path, ids


def test_show_prints_the_runs_disk_and_its_checkpoints(capsys) -> None:
    path, ids = _store_with_checkpoints()
    assert cli.main(["show", str(ids[0]), "--store", str(path)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("disk"))
    assert "3.0 MB (checkpoints 3.0 MB) in " in line and line.endswith(f"{ids[0]}")
    assert cli.main(["show", str(ids[0]), "--store", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["disk_bytes"] == 3_001_000 and shown["ckpt_bytes"] == 3_000_000


def test_runs_lists_each_runs_disk_and_warns_past_the_size(capsys, monkeypatch) -> None:
    path, ids = _store_with_checkpoints()
    monkeypatch.delenv(disk.WARN_ENV, raising=False)
    assert cli.main(["runs", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[-1] == "disk"
    row = next(ln for ln in out.splitlines() if ln.startswith(f"{ids[0]} "))
    assert row.endswith("3.0 MB")
    assert "warning" not in out  # 3 MB is far below the default
    assert cli.main(["runs", "--store", str(path), "--ckpt_warn_mb", "2"]) == 0
    warning = capsys.readouterr().out.strip().splitlines()[-1]
    assert warning.startswith("warning: Checkpoints take 3.0 MB in ")
    assert "past the 2.0 MB" in warning and "Delete" in warning
    monkeypatch.setenv(disk.WARN_ENV, "1")  # the setting without the flag
    assert cli.main(["runs", "--store", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert {row["id"]: row["disk_bytes"] for row in rows}[ids[0]] == 3_001_000
    assert "past the 1.0 MB" in captured.err


def test_a_bad_warning_size_is_one_line_and_exit_2(capsys) -> None:
    path, _ = _store_with_checkpoints()
    assert cli.main(["runs", "--store", str(path), "--ckpt_warn_mb", "lots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--ckpt_warn_mb: 'lots' is not allowed" in err
