"""The SQLite run store: round trips, buffering, concurrency, lifecycle, downsampling."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from blockviz import store as st
from blockviz.core import config as cfg
from blockviz.core import procs
from blockviz.store import RunStore, StoreError, liveness
from tests import fakes
from tests.helpers import other_connection, spawn
from tests.real_runs import RealRuns, copy_run

CONFIG_JSON = cfg.RunConfig().to_json()


@pytest.fixture
def store(store_url: str) -> RunStore:
    """A fresh store that flushes only when told to (so tests control visibility); once
    an SQLite file, once a PostgreSQL database."""
    with RunStore(store_url, flush_seconds=None) as opened:
        yield opened


@pytest.fixture
def file_store(tmp_path: Path) -> RunStore:
    """`store` as an SQLite file only: for what only a file has (pragmas, WAL, locks)."""
    with RunStore(tmp_path / "ws" / "blockviz.db", flush_seconds=None) as opened:
        yield opened


def new_run(store: RunStore, name: str = "run", **fields) -> int:
    return store.create_run(name, CONFIG_JSON, **fields)


# -- opening -------------------------------------------------------------------------


def test_default_path_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("BLOCKVIZ_STORE", str(tmp_path / "x" / "s.db"))
    assert st.default_store_path() == tmp_path / "x" / "s.db"
    with RunStore() as opened:
        assert opened.path == tmp_path / "x" / "s.db"
        assert opened.workspace == tmp_path / "x"
    monkeypatch.delenv("BLOCKVIZ_STORE")
    assert st.default_store_path() == Path("runs") / "blockviz.db"


def test_new_store_uses_wal_and_records_schema_version(file_store):
    store = file_store
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    version = store.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert int(version[0]) == st.SCHEMA_VERSION


def test_reopening_keeps_runs(tmp_path):
    path = tmp_path / "s.db"
    with RunStore(path) as first:
        run_id = new_run(first, "kept")
    with RunStore(path, readonly=True) as again:
        assert again.get_run(run_id).name == "kept"


def _newer_schema(path: Path) -> None:
    RunStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")


def _not_sqlite(path: Path) -> None:
    path.write_text("this is a text file, not a database\n" * 50)


def _foreign_sqlite(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE people (name TEXT)")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_newer_schema, "newer blockviz"),
        (_not_sqlite, "not a blockviz run store"),
        (_foreign_sqlite, "not a blockviz run store"),
    ],
)
def test_bad_files_give_a_clear_store_error(tmp_path, make, message):
    path = tmp_path / "bad.db"
    make(path)
    with pytest.raises(StoreError, match=message) as info:
        RunStore(path)
    assert str(path) in str(info.value)


def test_readonly_missing_store_and_unwritable_folder(tmp_path):
    with pytest.raises(StoreError, match="no run store at"):
        RunStore(tmp_path / "missing.db", readonly=True)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot create the run store folder"):
        RunStore(blocker / "sub" / "s.db")
    with pytest.raises(StoreError, match="is a directory"):
        RunStore(tmp_path)


def test_closed_store_raises_store_error(tmp_path):
    opened = RunStore(tmp_path / "s.db")
    opened.close()
    opened.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        opened.runs_frame()


# -- runs ----------------------------------------------------------------------------


def test_run_round_trip_parses_json_columns(store):
    run_id = store.create_run(
        "pre-ln",
        CONFIG_JSON,
        device="cpu",
        precision="32-true",
        n_params=1234,
        dataset={"name": "pydocs", "sha": "abc"},
    )
    store.update_run(run_id, final={"val_loss": 1.5}, status="completed", step=2000)
    run = store.get_run(run_id)
    assert run.config == json.loads(CONFIG_JSON)
    assert run.dataset == {"name": "pydocs", "sha": "abc"}
    assert run.final == {"val_loss": 1.5}
    assert run.max_steps == cfg.RunConfig().train.max_steps  # taken from the config
    assert (run.status, run.step, run.n_params) == ("completed", 2000, 1234)
    assert run.created == pytest.approx(time.time(), abs=60)
    assert store.get_run("pre-ln").id == run_id


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("pre-ln lr=1e-3", "pre-ln lr=1e-3"),
        ("../../etc/passwd", "etc-passwd"),
        ("a/b\\c", "a-b-c"),
        ("  spaced\t\nout  ", "spaced out"),
        ("", "run"),
        ("///", "run"),
        ("x" * 200, "x" * 80),
        ("résumé+gelu", "résumé+gelu"),
    ],
)
def test_names_are_sanitized(store, given, expected):
    run_id = new_run(store, given)
    assert store.get_run(run_id).name == expected
    assert store.run_dir(run_id) == store.runs_root / str(run_id)


def test_taken_names_get_a_numeric_suffix(store):
    ids = [new_run(store, "same") for _ in range(3)]
    assert [store.get_run(i).name for i in ids] == ["same", "same-2", "same-3"]
    long_ids = [new_run(store, "y" * 90) for _ in range(2)]
    second = store.get_run(long_ids[1]).name
    assert second.endswith("-2") and len(second) == 80


def test_rename_and_resolve(store):
    first, second = new_run(store, "a"), new_run(store, "b")
    assert store.rename_run(first, "a/new") == "a-new"
    assert store.resolve("a-new") == first
    assert store.resolve(str(second)) == second
    assert store.resolve(second) == second
    with pytest.raises(StoreError, match="already taken"):
        store.rename_run(second, "a-new")
    with pytest.raises(StoreError, match="no run named 'nope'"):
        store.resolve("nope")
    for digits in ("9" * 20, "9" * 4301):  # past SQLite's integers, past int()'s limit
        with pytest.raises(StoreError, match="no run named '999"):
            store.resolve(digits)
    with pytest.raises(StoreError, match="no run with id 99"):
        store.get_run(99)


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"colour": "red"}, "'colour' cannot be set"), ({"status": "paused"}, "not one of")],
)
def test_update_run_rejects_unknown_fields_and_statuses(store, fields, message):
    run_id = new_run(store)
    with pytest.raises(StoreError, match=message):
        store.update_run(run_id, **fields)


def test_run_dir_needs_an_integer_id(store):
    for bad in ("1", "../x", 1.5, True, 0):
        with pytest.raises(StoreError):
            store.run_dir(bad)


def test_delete_refuses_a_live_run_then_removes_rows_and_folder(store):
    me = procs.identity_of()
    run_id = new_run(store, "../../victim", status="running", pid=me.pid, pid_started=me.started)
    store.log_scalars(run_id, [(0, "train/loss", 1.0)])
    store.log_sample(run_id, 0, "p", "t")
    store.flush()
    folder = store.run_dir(run_id)
    (folder / "checkpoints").mkdir(parents=True)
    outside = store.workspace.parent / "victim"
    outside.mkdir()
    with pytest.raises(StoreError, match="stop it before deleting"):
        store.delete_run(run_id)
    store.update_run(run_id, status="stopped")
    store.delete_run(run_id)
    assert not folder.exists() and outside.exists()
    assert store.runs_frame().empty
    for table in ("scalars", "samples"):
        assert store.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0


def test_delete_does_not_follow_a_symlinked_run_dir(store, tmp_path):
    run_id = new_run(store, status="failed")
    target = tmp_path / "precious"
    target.mkdir()
    (target / "data.txt").write_text("keep me")
    store.runs_root.mkdir(parents=True)
    store.run_dir(run_id).symlink_to(target)
    store.delete_run(run_id)
    assert (target / "data.txt").read_text() == "keep me"
    assert not store.run_dir(run_id).exists()


def test_logging_to_a_deleted_run_is_a_store_error(store):
    keep, gone = new_run(store, "keep", status="completed"), new_run(store, "gone")
    store.log_scalars(keep, [(0, "train/loss", 1.0)])
    store.log_scalars(gone, [(0, "train/loss", 1.0)])
    with other_connection(store) as execute:  # deleted behind this store's back
        execute("DELETE FROM runs WHERE id = ?", (gone,))
    with pytest.raises(StoreError, match=f"run\\(s\\) {gone}"):
        store.flush()
    store.flush()  # the other run's rows were kept and now land
    assert len(store.scalars(keep)) == 1


# -- metrics: round trips ------------------------------------------------------------


def test_scalars_round_trip_and_order(store):
    a, b = new_run(store, "a"), new_run(store, "b")
    rows = [(step, name, step * 0.5) for step in (2, 0, 1) for name in ("train/loss", "val/loss")]
    store.log_scalars(b, rows)
    store.log_metrics(a, 3, {"train/lr": np.float32(0.25), "train/loss": np.float64(2.0)})
    store.flush()
    frame = store.scalars([a, b])
    assert list(frame.columns) == list(st.SCALARS_FRAME)
    assert frame[["run_id", "name", "step"]].values.tolist() == [
        [a, "train/loss", 3],
        [a, "train/lr", 3],
        *[[b, name, step] for name in ("train/loss", "val/loss") for step in (0, 1, 2)],
    ]
    assert set(frame.loc[frame.run_id == b, "run"]) == {"b"}
    assert frame.loc[(frame.run_id == a) & (frame.name == "train/lr"), "value"].item() == 0.25
    assert store.scalar_names([a, b]) == ["train/loss", "train/lr", "val/loss"]
    assert store.scalars(b, names="val/loss")["name"].unique().tolist() == ["val/loss"]
    assert (store.max_step(a), store.max_step(b)) == (3, 2)
    assert store.max_step(new_run(store, "empty")) is None


def test_writing_a_step_again_replaces_it(store):
    run_id = new_run(store)
    store.log_scalars(run_id, [(5, "train/loss", 3.0)])
    store.flush()
    store.log_scalars(run_id, [(5, "train/loss", 2.0)])  # a resumed run repeats step 5
    store.flush()
    assert store.scalars(run_id)["value"].tolist() == [2.0]


def test_layer_stats_round_trip_and_filters(store):
    run_id = new_run(store)
    rows = [
        (step, layer, "component", comp, stat, step + layer / 10)
        for step in (0, 10)
        for layer in (-1, 0, 1, 2)
        for comp in ("attn", "ffn")
        for stat in ("grad_norm", "param_norm")
    ]
    rows += [(0, 0, "tap", "resid_post", "rms", 1.5), (0, 0, "head", "0", "attn_entropy", 2.0)]
    store.log_layer_stats(run_id, rows)
    store.flush()
    everything = store.layer_stats(run_id)
    assert len(everything) == len(rows)
    assert list(everything.columns) == list(st.LAYER_STATS_FRAME)
    at_init = store.layer_stats(run_id, kind="component", stat="grad_norm", step=0)
    assert sorted(set(at_init["layer"])) == [-1, 0, 1, 2]
    assert set(at_init["step"]) == {0} and set(at_init["stat"]) == {"grad_norm"}
    assert len(store.layer_stats(run_id, kind="component", component="ffn", layer=2)) == 4
    assert store.layer_stats(run_id, kind="head")["component"].tolist() == ["0"]
    assert store.layer_steps(run_id) == [0, 10]
    assert store.layer_steps(run_id, kind="tap") == [0]
    assert store.layer_steps(run_id, kind="tap", stat="grad_norm") == []
    store.log_layer_stats(run_id, [(20, 0, "component", "attn", "param_norm", 1.0)])
    store.flush()
    assert store.layer_steps(run_id, "component", "param_norm") == [0, 10, 20]
    assert store.layer_steps(run_id, "component", "grad_norm") == [0, 10]


def test_histograms_round_trip_one_row_per_bin(store):
    run_id = new_run(store)
    store.log_histogram(run_id, 10, 1, "resid_post", -2.0, 2.0, [1, 2, 3, 4])
    store.log_histogram(run_id, 20, 1, "resid_post", -2.0, 2.0, np.array([0, 5, 5, 0]))
    store.log_histogram(run_id, 10, 0, "ffn_hidden", 0.0, 1.0, [7, 8])
    store.flush()
    frame = store.histograms(run_id, layer=1, tap="resid_post")
    assert list(frame.columns) == list(st.HISTOGRAMS_FRAME)
    first = frame[frame.step == 10]
    assert first["count"].tolist() == [1, 2, 3, 4]
    assert first["lo"].tolist() == [-2.0, -1.0, 0.0, 1.0]
    assert first["hi"].tolist() == [-1.0, 0.0, 1.0, 2.0]
    assert len(store.histograms(run_id)) == 10
    assert store.histograms(run_id, after_step=10)["step"].unique().tolist() == [20]


def test_samples_newest_first(store):
    run_id = new_run(store)
    for step in (0, 200, 100):
        store.log_sample(run_id, step, "\n", f"text at {step}")
    store.flush()
    frame = store.samples(run_id)
    assert list(frame.columns) == list(st.SAMPLES_FRAME)
    assert frame["step"].tolist() == [200, 100, 0]
    assert frame["text"].iloc[0] == "text at 200"
    assert len(store.samples(run_id, limit=2)) == 2


def test_attention_round_trip_latest_step_by_default(store):
    run_id = new_run(store)
    tokens = list("abc")
    weights = [[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.2, 0.3, 0.5]]
    for step in (0, 50):
        for head in (0, 1):
            store.log_attention(run_id, step, 0, head, tokens, weights)
    store.flush()
    assert store.attention_steps(run_id) == [0, 50]
    frame = store.attention(run_id)
    assert list(frame.columns) == list(st.ATTENTION_FRAME)
    assert set(frame["step"]) == {50} and len(frame) == 2 * 9
    head0 = frame[frame["head"] == 0]
    pivot = head0.pivot(index="query", columns="key", values="weight").to_numpy()
    np.testing.assert_allclose(pivot, weights, atol=1e-4)
    row = head0[(head0["query"] == 2) & (head0["key"] == 1)].iloc[0]
    assert (row["query_char"], row["key_char"]) == ("c", "b")
    assert set(store.attention(run_id, step=0, head=1)["head"]) == {1}


# -- buffering and transactions ------------------------------------------------------


LOG_CALLS = {
    "scalars": lambda s, r: s.log_scalars(r, [(1, "train/loss", 2.0)]),
    "layer_stats": lambda s, r: s.log_layer_stats(r, [(0, 0, "component", "attn", "grad_norm", 1)]),
    "histograms": lambda s, r: s.log_histogram(r, 0, 0, "resid_post", -1, 1, [1, 2]),
    "samples": lambda s, r: s.log_sample(r, 0, "p", "text"),
    "attention": lambda s, r: s.log_attention(r, 0, 0, 0, ["a"], [[1.0]]),
}


@pytest.mark.parametrize("table", list(LOG_CALLS))
def test_buffered_rows_are_invisible_until_flush(store, table):
    run_id = new_run(store)
    LOG_CALLS[table](store, run_id)
    with other_connection(store) as execute:
        count = f"SELECT COUNT(*) FROM {table}"
        assert execute(count).fetchone()[0] == 0
        store.flush()
        assert execute(count).fetchone()[0] == 1


def test_one_transaction_per_flush(file_store, monkeypatch):
    store = file_store
    monkeypatch.setattr(liveness, "HEARTBEAT_WRITE_S", 3600.0)
    run_id = new_run(store)
    store.heartbeat(run_id, 0)  # a run's first beat is written at once
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    for log in LOG_CALLS.values():
        log(store, run_id)
    store.heartbeat(run_id, 1)  # held for the flush
    assert statements == []  # nothing touched the file before the flush
    store.flush()
    store.conn.set_trace_callback(None)
    assert sum(s.startswith("BEGIN") for s in statements) == 1
    assert sum(s.startswith("COMMIT") for s in statements) == 1
    assert sum(s.startswith("INSERT") for s in statements) == len(LOG_CALLS)
    assert store.get_run(run_id).step == 1


def test_auto_flush_by_row_count_and_by_age(tmp_path):
    with RunStore(tmp_path / "s.db", flush_rows=100, flush_seconds=None) as by_rows:
        run_id = new_run(by_rows)
        by_rows.log_scalars(run_id, [(s, "train/loss", 1.0) for s in range(99)])
        assert by_rows.conn.execute("SELECT COUNT(*) FROM scalars").fetchone()[0] == 0
        by_rows.log_scalars(run_id, [(99, "train/loss", 1.0)])
        assert by_rows.conn.execute("SELECT COUNT(*) FROM scalars").fetchone()[0] == 100
    with RunStore(tmp_path / "t.db", flush_seconds=0.0) as by_age:
        run_id = new_run(by_age)
        by_age.log_scalars(run_id, [(0, "train/loss", 1.0)])
        assert by_age.conn.execute("SELECT COUNT(*) FROM scalars").fetchone()[0] == 1


def test_heartbeat_is_written_at_once_then_throttled(store, monkeypatch):
    monkeypatch.setattr(liveness, "HEARTBEAT_WRITE_S", 3600.0)
    run_id = new_run(store)
    store.heartbeat(run_id, 7)
    run = store.get_run(run_id)
    assert run.step == 7 and run.heartbeat == pytest.approx(time.time(), abs=5)
    store.heartbeat(run_id, 8)  # within a second of the last write: held
    assert store.get_run(run_id).step == 7
    store.flush()
    assert store.get_run(run_id).step == 8


def test_a_heartbeat_held_through_an_outage_never_moves_the_step_back(store, monkeypatch):
    """A beat held while the server was down, flushed after the run recorded its last
    step, once set a finished run back (`completed 290/300`)."""
    monkeypatch.setattr(liveness, "HEARTBEAT_WRITE_S", 3600.0)
    run_id = new_run(store)
    store.heartbeat(run_id, 280)
    store.heartbeat(run_id, 290)  # held (the outage: not written)
    store.update_run(run_id, step=300, status="completed")  # the end, written after it
    store.flush()
    assert store.get_run(run_id).step == 300
    store.truncate_after(run_id, 100)  # a resume's own rewind still moves it back
    assert store.get_run(run_id).step == 100


def test_non_finite_values_survive(store):
    run_id = new_run(store)
    store.log_scalars(run_id, [(0, "train/loss", 2.0), (1, "train/loss", math.inf)])
    store.log_scalars(run_id, [(1, "train/grad_norm", math.nan), (2, "x", -math.inf)])
    store.log_layer_stats(run_id, [(1, 0, "component", "attn", "grad_norm", math.nan)])
    store.flush()
    values = store.scalars(run_id).set_index(["name", "step"])["value"]
    assert values[("train/loss", 1)] == math.inf
    assert math.isnan(values[("train/grad_norm", 1)])
    assert values[("x", 2)] == -math.inf
    assert math.isnan(store.layer_stats(run_id)["value"].item())
    assert store.runs_frame()["train_loss"].item() == math.inf
    assert store.final_metrics(run_id)["train_loss"].item() == math.inf


# -- reads: incremental, empty, summaries ----------------------------------------------


def test_incremental_reads_return_only_later_steps(store):
    run_id = new_run(store)
    store.log_scalars(run_id, [(s, "train/loss", float(s)) for s in range(10)])
    store.log_layer_stats(run_id, [(s, 0, "tap", "attn_out", "rms", 1.0) for s in range(0, 10, 2)])
    store.flush()
    assert store.scalars(run_id, after_step=6)["step"].tolist() == [7, 8, 9]
    assert store.layer_stats(run_id, after_step=4)["step"].tolist() == [6, 8]
    assert store.scalars(run_id, after_step=9).empty


EMPTY_READS = {
    "runs_frame": (lambda s, r: s.runs_frame(), st.RUNS_FRAME),
    "scalars": (lambda s, r: s.scalars(r, max_points=10), st.SCALARS_FRAME),
    "scalars_none": (lambda s, r: s.scalars([]), st.SCALARS_FRAME),
    "layer_stats": (lambda s, r: s.layer_stats(r, kind="tap", max_points=5), st.LAYER_STATS_FRAME),
    "histograms": (lambda s, r: s.histograms(r), st.HISTOGRAMS_FRAME),
    "samples": (lambda s, r: s.samples(r), st.SAMPLES_FRAME),
    "attention": (lambda s, r: s.attention(r), st.ATTENTION_FRAME),
    "final_metrics": (lambda s, r: s.final_metrics([]), st.FINAL_METRICS_FRAME),
}


@pytest.mark.parametrize("read", list(EMPTY_READS))
def test_empty_reads_have_the_contract_columns_and_dtypes(tmp_path, read):
    with RunStore(tmp_path / "s.db") as empty:
        run_id = new_run(empty) if read != "runs_frame" else None
        call, schema = EMPTY_READS[read]
        frame = call(empty, run_id)
        assert frame.empty
        assert list(frame.columns) == list(schema)
        assert {c: str(t) for c, t in frame.dtypes.items()} == {
            c: str(pd.Series(dtype=t).dtype) for c, t in schema.items()
        }


def test_full_frames_keep_the_same_dtypes(tmp_path, real_runs: RealRuns):
    with RunStore(tmp_path / "s.db") as full:
        ids = [copy_run(full, real_runs.path, run_id) for run_id in real_runs.ids.values()]
        ids += fakes.populate(full, n_runs=4, n_steps=60, n_layer=2, probe_every=10)
        frames = {
            "runs_frame": (full.runs_frame(), st.RUNS_FRAME),
            "scalars": (full.scalars(ids), st.SCALARS_FRAME),
            "layer_stats": (full.layer_stats(ids), st.LAYER_STATS_FRAME),
            "histograms": (full.histograms(ids[0]), st.HISTOGRAMS_FRAME),
            "attention": (full.attention(ids[0]), st.ATTENTION_FRAME),
            "final_metrics": (full.final_metrics(ids), st.FINAL_METRICS_FRAME),
        }
        for name, (frame, schema) in frames.items():
            assert not frame.empty, name
            assert list(frame.columns) == list(schema), name
            expected = {c: str(pd.Series(dtype=t).dtype) for c, t in schema.items()}
            assert {c: str(t) for c, t in frame.dtypes.items()} == expected, name


def test_runs_frame_and_final_metrics_summarise_runs(store):
    done = new_run(store, "done", status="completed", n_params=500)
    store.log_scalars(done, [(s, "train/loss", 3.0 - s) for s in range(3)])
    store.log_scalars(done, [(0, "val/loss", 2.9), (2, "val/loss", 1.2), (2, "val/ppl", 3.3)])
    store.log_scalars(done, [(s, "train/tokens_per_sec", 100.0 * (s + 1)) for s in range(3)])
    store.update_run(done, started=1000.0, ended=1060.0, step=3)
    fresh = new_run(store, "fresh")
    store.flush()
    runs = store.runs_frame().set_index("name")
    assert runs.loc["done", "train_loss"] == 1.0 and runs.loc["done", "val_loss"] == 1.2
    assert pd.isna(runs.loc["fresh", "val_loss"])
    final = store.final_metrics([fresh, done])
    assert final["run"].tolist() == ["fresh", "done"]  # in the order asked for
    row = final.set_index("run").loc["done"]
    assert (row["val_loss"], row["val_ppl"], row["steps"]) == (1.2, 3.3, 3)
    assert (row["time_s"], row["tokens_per_sec"], row["n_params"]) == (60.0, 200.0, 500)
    store.update_run(done, final={"val_loss": 1.1, "tokens_per_sec": 999.0})
    row = store.final_metrics(done).iloc[0]
    assert (row["val_loss"], row["tokens_per_sec"]) == (1.1, 999.0)  # the final JSON wins


def test_run_statuses_name_every_run_as_runs_frame_does(store):
    done = new_run(store, "done", status="completed")
    queued = new_run(store, "queued")
    assert store.run_statuses() == {done: "completed", queued: "queued"}
    frame = store.runs_frame()
    assert store.run_statuses() == dict(zip(frame["id"], frame["status"], strict=True))
    store.delete_run(done)
    assert store.run_statuses() == {queued: "queued"}


# -- downsampling ---------------------------------------------------------------------


def test_downsampling_keeps_spikes_nans_infs_and_the_last_point(store):
    n_points, max_points = 100_000, 200
    rng = np.random.default_rng(0)
    values = (1 + 0.01 * rng.standard_normal(n_points)).tolist()
    values[31_337], values[50_000], values[77_777] = 1e6, math.nan, math.inf
    values[12_345] = -50.0
    values[31_338] = math.nan  # shares the spike's bucket: both must stay
    run_id = new_run(store)
    store.log_scalars(run_id, zip(range(n_points), ["train/loss"] * n_points, values, strict=True))
    store.log_scalars(run_id, [(s, "val/loss", 1.0) for s in range(0, n_points, 1000)])
    store.flush()
    frame = store.scalars(run_id, max_points=max_points)
    loss = frame[frame.name == "train/loss"]
    by_step = dict(zip(loss.step, loss.value, strict=True))
    assert by_step[31_337] == 1e6 and by_step[77_777] == math.inf and by_step[12_345] == -50
    assert math.isnan(by_step[50_000]) and math.isnan(by_step[31_338])
    assert loss["step"].max() == n_points - 1  # the last point
    assert loss["step"].is_monotonic_increasing
    assert len(loss) <= 2 * max_points + 1 + 2  # +1 for each bucket holding a NaN
    assert len(frame[frame.name == "val/loss"]) == 100  # short series come back whole


def test_downsampling_constant_series_is_bounded(store):
    run_id = new_run(store)
    store.log_scalars(run_id, [(s, "train/lr", 1e-3) for s in range(5000)])
    store.flush()
    assert len(store.scalars(run_id, max_points=50)) <= 2 * 50 + 1


def test_downsampling_layer_stats_per_series_and_incrementally(store):
    run_id = new_run(store)
    rows = [
        (step, layer, "component", "attn", "grad_norm", 1.0 + (step == 777) * 100)
        for step in range(2000)
        for layer in range(3)
    ]
    store.log_layer_stats(run_id, rows)
    store.flush()
    frame = store.layer_stats(run_id, kind="component", max_points=20)
    per_layer = frame.groupby("layer").size()
    assert list(per_layer.index) == [0, 1, 2] and per_layer.max() <= 41
    assert set(frame.loc[frame.value > 50, "step"]) == {777}
    later = store.layer_stats(run_id, after_step=1500, max_points=20)
    assert later["step"].min() > 1500 and later["step"].max() == 1999


@pytest.mark.parametrize("seed", range(4))
def test_downsample_mask_matches_the_bucket_rule(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 400, size=6)
    steps = np.concatenate([np.sort(rng.choice(2000, n, replace=False)) for n in lengths])
    values = rng.standard_normal(len(steps)).round(1)  # rounding makes ties
    values[rng.random(len(steps)) < 0.05] = np.nan
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    max_points = 20
    keep = st.downsample_mask(starts, steps, values, max_points)
    for start, length in zip(starts, lengths, strict=True):
        rows = range(start, start + length)
        if length <= 2 * max_points + 1:
            assert keep[rows].all()
            continue
        assert keep[start + length - 1]  # the series' last point
        first, span = steps[start], steps[start + length - 1] - steps[start] + 1
        buckets: dict[int, list[int]] = {}
        for row in rows:
            buckets.setdefault((steps[row] - first) * max_points // span, []).append(row)
        for members in buckets.values():
            kept = [row for row in members if keep[row]]
            finite = [values[row] for row in members if not np.isnan(values[row])]
            kept_finite = [values[row] for row in kept if not np.isnan(values[row])]
            if finite:
                assert min(kept_finite) == min(finite) and max(kept_finite) == max(finite)
            assert any(np.isnan(values[r]) for r in kept) == any(
                np.isnan(values[r]) for r in members
            )
            assert len(kept) <= 3 + (members[-1] == start + length - 1)


def test_badly_shaped_rows_are_a_store_error(store):
    run_id = new_run(store)
    with pytest.raises(StoreError, match="3-tuples"):
        store.log_scalars(run_id, [(0, "train/loss")])
    with pytest.raises(StoreError, match="6-tuples"):
        store.log_layer_stats(run_id, [(0, 0, "tap", "attn_out", "rms", "high")])
    store.log_scalars(run_id, iter([(0, "train/loss", None)]))  # generators and None are fine
    store.flush()
    assert math.isnan(store.scalars(run_id)["value"].item())


# -- concurrency ---------------------------------------------------------------------


def _write_rows(path: str, run_id: int, n_rows: int, start: multiprocessing.Event) -> None:
    start.wait(30)
    with RunStore(path, flush_rows=500) as writer:
        for step in range(n_rows):
            writer.log_scalars(run_id, [(step, "train/loss", float(step))])


def _claim(path: str, run_id: int, start: multiprocessing.Event, results) -> None:
    with RunStore(path) as claimer:
        start.wait(30)
        results.put((run_id, claimer.claim_slot(run_id, 2, pid=os.getpid())))


def test_two_processes_write_concurrently_without_losing_rows(store):
    ids = [new_run(store, "w1"), new_run(store, "w2")]
    start = multiprocessing.get_context("spawn").Event()
    procs = spawn(_write_rows, [(store.location.text, run_id, 5000, start) for run_id in ids])
    start.set()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    counts = store.scalars(ids).groupby("run_id").size()
    assert counts.to_dict() == {ids[0]: 5000, ids[1]: 5000}


@pytest.mark.slow
def test_claim_slot_admits_exactly_max_running_under_a_race(store):
    ids = [new_run(store, f"q{i}") for i in range(4)]
    context = multiprocessing.get_context("spawn")
    start, results = context.Event(), context.Queue()
    procs = spawn(_claim, [(store.location.text, run_id, start, results) for run_id in ids])
    start.set()
    outcomes = dict(results.get(timeout=120) for _ in ids)
    for proc in procs:
        proc.join(60)
    assert sum(outcomes.values()) == 2
    statuses = store.runs_frame().set_index("id")["status"]
    assert sorted(statuses[statuses == "running"].index) == sorted(
        run_id for run_id, ok in outcomes.items() if ok
    )


def test_claim_slot_without_a_limit_and_for_a_rerun(store):
    running = new_run(store, "r", status="running", pid=os.getpid(), heartbeat=time.time())
    assert store.claim_slot(new_run(store, "a"), 0)
    assert not store.claim_slot(new_run(store, "b"), 2)
    assert store.claim_slot(running, 2)  # a run never waits for itself


def test_a_batch_of_replicas_holds_one_slot_and_none_against_itself(store):
    # Three running replicas of one live process: one slot, so one more process fits in 2.
    me, now = os.getpid(), time.time()
    batch = [new_run(store, f"r{i}", status="running", pid=me, heartbeat=now) for i in range(3)]
    other = new_run(store, "other")
    assert store.claim_slot(other, 2, pid=me + 1)
    assert not store.claim_slot(new_run(store, "third"), 2, pid=me + 2)
    # The batch's own queued member is not kept waiting by its own running replicas.
    store.update_run(other, status="stopped")
    store.update_run(batch[2], status="queued")
    assert store.claim_slot(batch[2], 1, pid=me)


def test_reader_is_not_blocked_by_an_open_write_transaction(file_store):
    store = file_store
    run_id = new_run(store)
    store.log_scalars(run_id, [(0, "train/loss", 1.0)])
    store.flush()
    writer = sqlite3.connect(store.path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO scalars VALUES (?, 1, 'train/loss', 0.5)", (run_id,))
    started = time.monotonic()
    with RunStore(store.path, readonly=True) as reader:
        assert reader.scalars(run_id)["step"].tolist() == [0]  # sees the committed state
    assert time.monotonic() - started < 5  # WAL: no waiting for the writer's lock
    writer.execute("COMMIT")
    writer.close()
    assert store.scalars(run_id)["step"].tolist() == [0, 1]


def test_threads_can_share_one_store(store):
    run_id = new_run(store)
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for step in range(50):
                store.log_scalars(run_id, [(offset * 1000 + step, "train/loss", 1.0)])
                store.scalars(run_id, max_points=10)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.flush()
    assert not errors and len(store.scalars(run_id)) == 200


# -- lifecycle -----------------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_reap_dead_fails_only_gone_and_stale_runs(store):
    stale = time.time() - 120
    dead_pid = _dead_pid()
    gone = new_run(store, "gone", status="running", pid=dead_pid, heartbeat=stale)
    me = procs.identity_of()
    alive = new_run(
        store, "alive", status="running", pid=me.pid, pid_started=me.started, heartbeat=stale
    )
    fresh = new_run(store, "fresh", status="running", pid=dead_pid, heartbeat=time.time())
    queued = new_run(store, "queued", status="queued", pid=dead_pid, heartbeat=stale)
    finished = new_run(store, "done", status="completed", pid=dead_pid, heartbeat=stale)
    assert sorted(store.reap_dead(stale_after=30)) == sorted([gone, queued])
    statuses = store.runs_frame().set_index("id")["status"]
    assert statuses[gone] == "failed" and statuses[queued] == "failed"
    assert statuses[alive] == "running" and statuses[fresh] == "running"
    assert statuses[finished] == "completed"
    run = store.get_run(gone)
    assert f"process {dead_pid} exited without reporting" in run.error
    assert run.ended == pytest.approx(time.time(), abs=60)
    assert store.reap_dead(stale_after=30) == []


def test_is_alive_checks_the_process_identity_not_just_the_pid():
    me = procs.identity_of()
    assert procs.is_alive(me.pid, me.started)
    assert not procs.is_alive(_dead_pid(), None)
    assert not procs.is_alive(None, None) and not procs.is_alive(0, None)
    assert not procs.is_alive(-1, None)
    # The same pid with another start time is another process (a reused pid).
    assert not procs.is_alive(me.pid, me.started - 100)


@pytest.mark.parametrize("bare", ["2", " 17 ", "007"])
def test_a_bare_number_is_refused_as_a_name_so_ids_stay_unambiguous(store, bare):
    run_id = new_run(store, "named")
    with pytest.raises(StoreError, match="bare number"):
        store.rename_run(run_id, bare)  # before: `show 2` then meant run id 2, not this run
    with pytest.raises(StoreError, match="bare number"):
        store.create_run(bare, CONFIG_JSON)
    assert store.rename_run(run_id, "²") == "²"  # not an id: `show ²` finds it by name
    assert store.resolve("²") == run_id
