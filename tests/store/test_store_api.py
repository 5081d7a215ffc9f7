"""The typed store API: rows read back as records, and the one write transaction.

A store's rows are written here as raw SQL of the schema (as every earlier version wrote
them), so the records are checked against the file, not against the code that reads it.
"""

from __future__ import annotations

import ast
import json
import sqlite3
import threading
import time
from dataclasses import FrozenInstanceError, fields, replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from blockviz.cli.runs import fork_line
from blockviz.core.config import RunConfig
from blockviz.core.findings.replay import replay_result
from blockviz.store import (
    FinalMetrics,
    ForkInfo,
    RunRecord,
    RunStore,
    StoredConfig,
    StoreError,
    StoreLocked,
    StudyRecord,
    writes,
)
from blockviz.store.schema import JSON_COLUMNS, RUN_COLUMNS
from blockviz.store.studies import STUDY_COLUMNS

CONFIG = {"data": {"dataset": "pydocs"}, "model": {"n_layer": 2}, "train": {"max_steps": 40}}
# Every column of a run, as the store writes it: JSON columns as text.
FULL_RUN: dict[str, Any] = {
    "id": 7,
    "name": "pre-ln lr=1e-3",
    "created": 1700000000.5,
    "started": 1700000001.25,
    "ended": 1700000090.0,
    "status": "diverged",
    "config": json.dumps(CONFIG, sort_keys=True),
    "dataset": json.dumps({"name": "pydocs", "sha256": "ab12", "unigram_nats": 3.1}),
    "device": "cpu, 1 thread",
    "precision": "32-true",
    "n_params": 123456,
    "pid": 4242,
    "heartbeat": 1700000089.75,
    "step": 31,
    "max_steps": 40,
    "diverged_step": 30,
    "final": json.dumps({"val_loss": 2.5, "time_s": 88.5}),
    "error": "loss is inf at step 30",
    "pid_started": 1699999999.0,
    "tags": json.dumps(["post-ln", "sweep"]),
    "notes": "line 1\nline 2",
    "study_id": 3,
    "variant": "post",
    "seed": 2,
    "host": "node-7",
    "boot_id": "0b5e-boot",
    "stop_requested": 1700000050.0,
    "parent_id": 3,
    "fork_step": 400,
    "fork_kind": "replay",
    "fork_info": '{"event": "loss spike", "event_step": 412}',
    "lost": 2,
}
STUDY_ROW: dict[str, Any] = {
    "id": 3,
    "name": "norm position",
    "key": "norm-position",
    "size": "quick",
    "status": "running",
    "created": 1700000000.0,
    "ended": None,
    "spec": json.dumps({"key": "norm-position", "variants": ["pre", "post"]}),
    "error": None,
    "workers": json.dumps([[4242, 1699999999.0], [4243, None]]),
}


def _insert(path: Path, table: str, row: dict[str, Any]) -> None:
    with sqlite3.connect(path) as conn:
        columns = ", ".join(row)
        conn.execute(
            f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(row))})",
            list(row.values()),
        )
    conn.close()


def _legacy_get_run(path: Path, run_id: int) -> dict[str, Any]:
    """What `get_run` returned before records: every column, JSON columns decoded."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    row = dict(conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone())
    conn.close()
    run = dict.fromkeys(RUN_COLUMNS)
    run.update({c: row[c] for c in RUN_COLUMNS})
    for column in JSON_COLUMNS:
        run[column] = None if run[column] is None else json.loads(run[column])
    return run


@pytest.fixture
def written(tmp_path: Path) -> Path:
    """A store holding a study, one run with every column set and one with the fewest."""
    path = tmp_path / "runs.db"
    RunStore(path).close()  # the schema, and nothing else
    _insert(path, "studies", STUDY_ROW)
    _insert(path, "runs", FULL_RUN)
    _insert(path, "runs", {"id": 8, "name": "bare"})
    return path


def test_a_run_record_has_a_field_per_runs_column_in_order():
    assert tuple(f.name for f in fields(RunRecord)) == RUN_COLUMNS
    assert tuple(f.name for f in fields(StudyRecord)) == STUDY_COLUMNS


def test_a_stored_run_reads_as_a_record_of_its_columns(written: Path):
    with RunStore(written) as store:
        run = store.get_run(7)
        assert store.get_run("pre-ln lr=1e-3") == run
    assert isinstance(run, RunRecord)
    for column in RUN_COLUMNS:
        if column not in JSON_COLUMNS:
            assert getattr(run, column) == FULL_RUN[column], column
    assert run.config == CONFIG
    assert run.dataset == {"name": "pydocs", "sha256": "ab12", "unigram_nats": 3.1}
    assert run.final == {"val_loss": 2.5, "time_s": 88.5}
    assert run.tags == ("post-ln", "sweep")
    assert run.fork_info == {"event": "loss spike", "event_step": 412}


def test_a_run_with_only_its_name_reads_as_nones(written: Path):
    with RunStore(written) as store:
        bare = store.get_run(8)
    assert bare == RunRecord(id=8, name="bare")
    assert all(getattr(bare, c) is None for c in RUN_COLUMNS if c not in ("id", "name"))


def test_to_dict_is_what_get_run_returned_before(written: Path):
    with RunStore(written) as store:
        records = {run_id: store.get_run(run_id) for run_id in (7, 8)}
    for run_id, record in records.items():
        legacy = _legacy_get_run(written, run_id)
        assert record.to_dict() == legacy
        assert list(record.to_dict()) == list(legacy)  # `show --json` keeps its key order
        assert json.dumps(record.to_dict()) == json.dumps(legacy)


def test_a_json_column_that_is_not_an_object_reads_as_none(written: Path):
    with sqlite3.connect(written) as conn:
        conn.execute("UPDATE runs SET config = '{not json', final = '[1, 2]' WHERE id = 7")
    conn.close()
    with RunStore(written) as store:
        run = store.get_run(7)
    assert (run.config, run.final) == (None, None)


def test_a_record_is_frozen_and_changed_by_replace(written: Path):
    with RunStore(written) as store:
        run = store.get_run(7)
    with pytest.raises(FrozenInstanceError):
        run.status = "running"  # type: ignore[misc]
    shown = replace(run, status="running")
    assert (shown.status, run.status, shown.name) == ("running", "diverged", run.name)


def test_a_stored_study_reads_as_a_record(written: Path):
    with RunStore(written) as store:
        study = store.get_study(3)
    assert isinstance(study, StudyRecord)
    assert (study.id, study.name, study.key, study.size, study.status) == (
        3,
        "norm position",
        "norm-position",
        "quick",
        "running",
    )
    assert study.spec == {"key": "norm-position", "variants": ["pre", "post"]}
    assert study.workers == ((4242, 1699999999.0), (4243, None))
    assert study.to_dict()["workers"] == [[4242, 1699999999.0], [4243, None]]
    assert study.to_dict()["spec"] == study.spec


# -- transaction() ----------------------------------------------------------------------


def _notes(path: Path, run_id: int) -> str | None:
    """The run's notes as another connection sees them (committed state only)."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT notes FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
    finally:
        conn.close()


def test_a_transaction_commits_when_its_block_ends(written: Path):
    with RunStore(written) as store:
        with store.db.transaction() as conn:
            conn.execute("UPDATE runs SET notes = 'kept' WHERE id = 8")
            assert conn.in_transaction and _notes(written, 8) is None
        assert not store.conn.in_transaction
        assert _notes(written, 8) == "kept"


def test_a_transaction_rolls_back_when_its_block_raises(written: Path):
    with RunStore(written) as store:
        with pytest.raises(ValueError, match="boom"), store.db.transaction() as conn:
            conn.execute("UPDATE runs SET notes = 'lost' WHERE id = 8")
            raise ValueError("boom")
        assert not store.conn.in_transaction
        assert _notes(written, 8) is None
        with store.db.transaction() as conn:  # the store is usable afterwards
            conn.execute("UPDATE runs SET notes = 'later' WHERE id = 8")
    assert _notes(written, 8) == "later"


def test_a_transaction_inside_a_transaction_is_refused(written: Path):
    with RunStore(written) as store:
        with pytest.raises(RuntimeError, match="already open"), store.db.transaction() as conn:
            conn.execute("UPDATE runs SET notes = 'outer' WHERE id = 8")
            with store.db.transaction():
                pass
        assert not store.conn.in_transaction
        assert _notes(written, 8) is None  # the outer one was rolled back


def test_a_write_that_fails_halfway_leaves_nothing(written: Path):
    with RunStore(written) as store:
        with pytest.raises(StoreError, match="already taken"):
            store.rename_run(8, "pre-ln lr=1e-3")
        assert not store.conn.in_transaction
        assert store.get_run(8).name == "bare"


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def test_a_locked_store_fails_the_begin_with_nothing_to_roll_back(written: Path):
    holder = _hold_write_lock(written)
    try:
        with RunStore(written, busy_timeout_s=0.2) as store:
            locked = pytest.raises(sqlite3.OperationalError, match="locked")
            with locked, store.db.transaction():
                pytest.fail("the block ran without the lock")
            assert not store.conn.in_transaction
            with pytest.raises(StoreLocked):
                store.update_run(8, notes="x")  # a public method words it
            holder.execute("ROLLBACK")
            store.update_run(8, notes="x")
    finally:
        holder.close()
    assert _notes(written, 8) == "x"


def test_the_busy_timeout_comes_from_the_environment_unless_the_opener_gives_one(
    written: Path, monkeypatch
):
    with RunStore(written) as store:
        assert store.db.busy_timeout_s == 30.0  # the default
    monkeypatch.setenv("BLOCKVIZ_BUSY_TIMEOUT_S", "0.2")
    with RunStore(written, busy_timeout_s=5.0) as store:
        assert store.db.busy_timeout_s == 5.0  # a page's own timeout wins
    holder = _hold_write_lock(written)
    try:
        with RunStore(written) as store:
            started = time.monotonic()
            with pytest.raises(StoreLocked, match=r"locked by another process for 0\.2 s"):
                store.update_run(8, notes="x")
            assert time.monotonic() - started < 5  # not the 30 s default
    finally:
        holder.close()


@pytest.mark.parametrize("value", ["soon", "0", "-3", "inf", "nan"])
def test_a_busy_timeout_that_is_no_positive_number_is_refused_by_name(
    tmp_path: Path, monkeypatch, value: str
):
    monkeypatch.setenv("BLOCKVIZ_BUSY_TIMEOUT_S", value)
    with pytest.raises(StoreError) as refused:
        RunStore(tmp_path / "runs.db")
    assert str(refused.value) == (
        f"BLOCKVIZ_BUSY_TIMEOUT_S={value!r} is not allowed; it must be a positive number of "
        "seconds (unset: 30)"
    )
    assert not (tmp_path / "runs.db").exists()


def test_a_deferring_writer_keeps_its_rows_while_locked_and_writes_them_after(written: Path):
    with RunStore(written, busy_timeout_s=0.2, defer_when_busy=True, flush_seconds=None) as store:
        holder = _hold_write_lock(written)
        try:
            store.log_scalars(8, [(step, "train/loss", 1.0) for step in range(5)])
            assert store.flush() is False  # locked: kept, not raised
            assert store.flush() is False  # retried, still locked
            assert not store.conn.in_transaction
            assert len(store.buffered_rows(8)["scalars"]) == 5
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.flush() is True
        assert store.scalars(8)["step"].tolist() == [0, 1, 2, 3, 4]
        assert store.buffered_rows(8) == {}


def test_a_deferring_writer_past_its_row_limit_waits_for_the_lock(written: Path, monkeypatch):
    monkeypatch.setattr(writes, "MAX_DEFERRED_ROWS", 3)
    with RunStore(written, busy_timeout_s=0.2, defer_when_busy=True, flush_seconds=None) as store:
        holder = _hold_write_lock(written)
        release = threading.Timer(1.0, lambda: (holder.execute("ROLLBACK"), holder.close()))
        store.log_scalars(8, [(step, "train/loss", 1.0) for step in range(2)])
        started = time.monotonic()
        release.start()
        try:
            store.log_scalars(8, [(step, "train/loss", 1.0) for step in range(2, 4)])
            assert store.flush() is True  # more than 3 rows held: it retried until written
        finally:
            release.join()
        assert time.monotonic() - started >= 0.9
        assert store.scalars(8)["step"].tolist() == [0, 1, 2, 3]


# ---------------------------------------------------------------------------- typed JSON columns


def _dict_keys_returned(path: Path, function: str) -> set[str]:
    """The keys of the dict literal(s) `function` in the module at `path` returns."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    return {
        key.value
        for ret in ast.walk(node)
        if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict)
        for key in ret.value.keys
        if isinstance(key, ast.Constant)
    }


def test_the_typed_json_columns_name_every_key_their_writers_write():
    root = Path(__file__).resolve().parents[2] / "blockviz" / "training"
    written = _dict_keys_returned(root / "final_metrics.py", "final_metrics")
    assert written == set(FinalMetrics.__annotations__)
    assert _dict_keys_returned(root / "final_metrics.py", "recorded_training") <= written
    # A replay's result (here one that could not judge: no probes before it) and a fork's.
    empty = pd.DataFrame(columns=["step", "name", "value"])
    result = replay_result(empty, empty, empty, 40, 50, "loss spike", 2)
    assert set(result) == {"event", "event_step", "start", "break", "sentence"}
    assert {*result, "changes"} == set(ForkInfo.__annotations__)
    assert set(StoredConfig.__annotations__) == set(RunConfig().to_dict())  # its sections


def test_an_old_stores_fork_info_reads_whole_and_the_readers_use_it(tmp_path: Path):
    """A replay row as an earlier version wrote it (a key this version does not name
    included) reads back whole, byte-identical as JSON, and `show` says what it found."""
    stored = (
        '{"event": "loss spike", "event_step": 412, "sentence": "grad norm broke first", '
        '"old_key": [1, 2]}'
    )
    path = tmp_path / "runs.db"
    RunStore(path).close()
    _insert(path, "runs", {"id": 1, "name": "parent"})
    _insert(
        path, "runs", {**FULL_RUN, "id": 2, "name": "replay", "parent_id": 1, "fork_info": stored}
    )
    _insert(
        path,
        "runs",
        {
            "id": 3,
            "name": "fork",
            "parent_id": 1,
            "fork_step": 5,
            "fork_kind": "fork",
            "fork_info": '{"changes": {"lr": 0.003}}',
            "final": '{"val_loss": 2.0}',
        },
    )
    with RunStore(path) as store:
        replay, fork = store.get_run(2), store.get_run(3)
    assert json.dumps(replay.fork_info) == stored
    assert fork_line(replay) == "replay of run 1 from step 400: grad norm broke first"
    assert fork_line(fork) == "fork of run 1 at step 5 (lr 0.003)"
    assert fork.final == {"val_loss": 2.0}
