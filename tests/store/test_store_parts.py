"""How the store package hangs together: RunStore composed of parts, its error wording, its
imports."""

from __future__ import annotations

import sqlite3

import pytest

import blockviz.store as store_package
from blockviz.store import RunStore, StoreError, StoreLocked
from blockviz.store.connection import Connection, Part
from blockviz.store.errors import has_sqlite_header, is_busy, store_error
from blockviz.store.liveness import Liveness
from blockviz.store.queue import Queue
from blockviz.store.reads import Reads
from blockviz.store.runs import RunLookup, Runs
from blockviz.store.runstore import Delegated
from blockviz.store.studies import Studies
from blockviz.store.writes import Writes

PARTS = {
    "lookup": RunLookup,
    "runs": Runs,
    "studies": Studies,
    "queue": Queue,
    "liveness": Liveness,
    "writes": Writes,
    "reads": Reads,
}
# Public methods a part offers the other parts only (called with the store's lock held).
FOR_PARTS = {"id_of", "ids", "names", "unique_name", "drop_buffered", "max_logged_step"}
# RunStore's public names before it was composed of parts (seven mixins): all still there.
PUBLIC_BEFORE = (
    "attention",
    "attention_steps",
    "buffered_rows",
    "bulk_load",
    "check_integrity",
    "claim_slot",
    "claim_study_run",
    "close",
    "conn",
    "create_run",
    "create_study",
    "delete_run",
    "file_changed",
    "final_metrics",
    "flush",
    "get_run",
    "get_study",
    "heartbeat",
    "histograms",
    "layer_stats",
    "layer_steps",
    "log_attention",
    "log_histogram",
    "log_layer_stats",
    "log_metrics",
    "log_sample",
    "log_scalars",
    "max_step",
    "open_readable",
    "path",
    "queued_still",
    "readonly",
    "reap_dead",
    "rename_run",
    "requeue_runs",
    "resolve",
    "restore_rows",
    "run_dir",
    "run_statuses",
    "runs_frame",
    "runs_root",
    "samples",
    "scalar_names",
    "scalars",
    "set_notes",
    "set_tags",
    "settle_step",
    "stop_unclaimed",
    "studies_frame",
    "study_active_runs",
    "study_dir",
    "study_runs",
    "take_over",
    "truncate_after",
    "update_run",
    "update_study",
    "workspace",
)


def _public_methods(part: type) -> set[str]:
    return {
        name
        for name, value in vars(part).items()
        if not name.startswith("_") and callable(value) and name not in vars(Part)
    }


def test_run_store_is_composed_of_parts_sharing_one_connection(tmp_path):
    assert RunStore.__mro__ == (RunStore, object)  # no mixins
    with RunStore(tmp_path / "s.db") as opened:
        assert isinstance(opened.db, Connection)
        for attribute, part in PARTS.items():
            assert type(getattr(opened, attribute)) is part
            assert getattr(opened, attribute).db is opened.db


def test_each_run_store_method_is_its_parts_method(tmp_path):
    delegated = {n: d for n, d in vars(RunStore).items() if isinstance(d, Delegated)}
    with RunStore(tmp_path / "s.db") as opened:
        for name, delegate in delegated.items():
            assert getattr(opened, name) == getattr(getattr(opened, delegate.part), name)
            assert RunStore.__dict__[name].__doc__, name
    for attribute, part in PARTS.items():
        offered = _public_methods(part) - FOR_PARTS
        missing = sorted(offered - set(delegated))
        assert missing == [], f"{part.__name__} methods RunStore does not offer: {missing}"
        assert all(delegated[name].part == attribute for name in offered)


def test_the_public_names_from_before_the_parts_still_work(tmp_path):
    with RunStore(tmp_path / "s.db") as opened:
        missing = [name for name in PUBLIC_BEFORE if not hasattr(opened, name)]
    assert missing == []


def test_no_two_parts_define_the_same_method():
    defined: dict[str, str] = {}
    for part in (Connection, *PARTS.values()):
        for name in _public_methods(part):
            assert name not in defined, (name, defined.get(name))
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
