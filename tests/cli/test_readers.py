"""Commands that read a store (or steer what it holds) never create one: a mistyped
`--store`, or the default store looked for from another folder, is one line naming where
they looked (issue 35: `runs` said "no runs yet" and left an empty store behind)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blockviz import cli
from blockviz.store import RunStore

# Every command that needs the store to hold something already, with what follows it.
READERS = {
    "runs": ["runs"],
    "show": ["show", "1"],
    "export": ["export", "1", "--out", "figures"],
    "stop": ["stop", "1"],
    "study list": ["study", "list"],
    "study show": ["study", "show", "1"],
    "study export": ["study", "export", "1", "--out", "figures"],
    "study stop": ["study", "stop", "1"],
    "study resume": ["study", "resume", "1", "--workers", "0"],
}


def one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    return captured.err


@pytest.mark.parametrize("command", sorted(READERS))
def test_a_mistyped_store_is_named_and_not_created(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = one_error_line([*READERS[command], "--store", "typo/blockviz.db"], capsys)
    assert f"no run store at {tmp_path / 'typo' / 'blockviz.db'} (no such file)" in err, err
    assert "nothing was created" in err and "--store" in err
    assert list(tmp_path.iterdir()) == []


def test_the_default_store_from_another_folder_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BLOCKVIZ_STORE")
    monkeypatch.chdir(tmp_path)
    err = one_error_line(["runs"], capsys)
    assert f"no run store at {tmp_path / 'runs' / 'blockviz.db'}" in err, err
    assert not (tmp_path / "runs").exists()


def test_an_empty_store_says_where_it_has_no_runs(tmp_path, capsys):
    path = tmp_path / "blockviz.db"
    RunStore(path).close()
    assert cli.main(["runs", "--store", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"no runs yet in {path};")


@pytest.mark.parametrize("command", ["runs", "show", "study list", "study show"])
def test_a_database_without_blockviz_tables_is_read_not_set_up(command, pg_url, tmp_path, capsys):
    import psycopg

    url = f"{pg_url}?runs={tmp_path / 'work'}"
    err = one_error_line([*READERS[command], "--store", url], capsys)
    assert "has no blockviz tables" in err and "nothing was created" in err, err
    with psycopg.connect(pg_url) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert tables == (0,)
    assert not Path(tmp_path / "work").exists()


@pytest.mark.parametrize("command", ["runs", "study list", "stop"])
def test_a_server_that_does_not_answer_is_said_at_once(command, tmp_path, monkeypatch, capsys):
    """A store that must exist already waits out a lost server (a worker's does); a
    command a person typed says at once that it cannot reach it."""
    import time

    monkeypatch.chdir(tmp_path)
    began = time.monotonic()
    err = one_error_line([*READERS[command], "--store", "postgresql://me@127.0.0.1:9/x"], capsys)
    assert time.monotonic() - began < 10
    assert "cannot reach the run store postgresql://127.0.0.1:9/x" in err, err
    assert list(tmp_path.iterdir()) == []
