"""How the store package hangs together: its parts, its error wording, its imports."""

from __future__ import annotations

import sqlite3

import pytest

import blockviz.store as store_package
from blockviz.store import RunStore, StoreError, StoreLocked
from blockviz.store.connection import _Connection
from blockviz.store.errors import has_sqlite_header, is_busy, store_error
from blockviz.store.liveness import _Liveness
from blockviz.store.queue import _Queue
from blockviz.store.reads import _Reads
from blockviz.store.runs import _Runs
from blockviz.store.writes import _Writes

PARTS = (_Connection, _Runs, _Queue, _Liveness, _Writes, _Reads)


@pytest.mark.parametrize("part", PARTS, ids=lambda part: part.__name__)
def test_what_a_part_takes_from_the_others_exists_on_a_run_store(part, tmp_path):
    """Each part declares the names it uses from the rest; a rename elsewhere fails here."""
    with RunStore(tmp_path / "s.db") as opened:
        missing = [name for name in part.__annotations__ if not hasattr(opened, name)]
    assert missing == []


def test_no_two_parts_define_the_same_method():
    defined: dict[str, str] = {}
    for part in PARTS:
        for name, value in vars(part).items():
            if callable(value) or isinstance(value, property | staticmethod):
                assert name not in defined or name.startswith("__"), (name, defined.get(name))
                defined[name] = part.__name__


def test_every_exported_name_is_importable():
    assert sorted(store_package.__all__) == sorted(set(store_package.__all__))
    for name in store_package.__all__:
        assert getattr(store_package, name) is not None


@pytest.mark.parametrize(
    ("message", "kind", "wording"),
    [
        ("database is locked", StoreLocked, "stayed locked by another process for 2.5 s"),
        ("database or disk is full", StoreError, "is its disk full?"),
        ("attempt to write a readonly database", StoreError, "is read-only here"),
        ("Cannot operate on a closed database.", StoreError, "is closed"),
        ("database disk image is malformed", StoreError, "is corrupt"),
        ("no such table: runs", StoreError, "cannot use the run store"),
    ],
)
def test_sqlite_errors_become_store_errors_that_name_the_file(tmp_path, message, kind, wording):
    path = tmp_path / "s.db"
    path.write_bytes(b"SQLite format 3\x00" + bytes(100))
    error = store_error(sqlite3.OperationalError(message), path, 2.5)
    assert type(error) is kind
    assert str(path) in str(error) and wording in str(error)


def test_a_file_that_is_not_sqlite_is_named_as_such(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    assert not has_sqlite_header(path) and not has_sqlite_header(tmp_path / "missing")
    error = store_error(sqlite3.DatabaseError("file is not a database"), path, 1.0, opening=True)
    assert "not an SQLite file" in str(error)
    opening = store_error(sqlite3.OperationalError("no such table: x"), path, 1.0, opening=True)
    assert "cannot open the run store" in str(opening)


def test_busy_and_locked_count_as_busy():
    assert is_busy(sqlite3.OperationalError("database is locked"))
    assert is_busy(sqlite3.OperationalError("database table is busy"))
    assert not is_busy(sqlite3.OperationalError("disk I/O error"))
