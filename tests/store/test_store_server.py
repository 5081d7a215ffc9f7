"""A store for many machines: URLs, the PostgreSQL backend, hosts, stops through the store.

The tests that take `store_url` run once on an SQLite file and once on a PostgreSQL
database (tests/pgserver.py starts a throwaway server); the rest are about what only a
URL or a server has.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blockviz.core import procs
from blockviz.store import RunStore, StoreError, StoreUnreachable, parse_location
from blockviz.store.schema import SCHEMA_VERSION
from tests.helpers import other_connection, spawn

CONFIG = '{"train": {"max_steps": 10}}'


# -- locations ----------------------------------------------------------------------


def test_a_path_and_sqlite_urls_are_files(tmp_path):
    plain = parse_location(str(tmp_path / "a.db"))
    assert (plain.path, plain.is_server) == (tmp_path / "a.db", False)
    assert parse_location(f"sqlite://{tmp_path}/b.db").path == tmp_path / "b.db"
    assert parse_location(tmp_path / "c.db").workspace == tmp_path


def test_a_postgresql_url_names_its_server_and_its_run_folder(tmp_path):
    found = parse_location(f"postgresql://me:secret@db.lan:6543/lab?runs={tmp_path}/shared")
    assert found.is_server and found.path is None
    assert found.workspace == tmp_path / "shared"
    assert found.url == "postgresql://me:secret@db.lan:6543/lab"  # blockviz's own part off
    assert "secret" not in found.where and found.where == "postgresql://db.lan:6543/lab"
    # Another process given `text` opens the same store with the same run folder; the
    # password reaches it through PGPASSWORD, not through `text`.
    again = parse_location(found.text)
    assert "secret" not in found.text and found.password == "secret"
    assert (again.url, again.workspace) == ("postgresql://me@db.lan:6543/lab", found.workspace)
    default = parse_location("postgres://me@db.lan/lab")
    assert default.workspace == Path("runs").absolute() / "lab"


@pytest.mark.parametrize(
    "url", ["mysql://me@db.lan/lab", "http://example.org/x", "s3://bucket/blockviz.db"]
)
def test_an_unsupported_url_scheme_is_refused_and_creates_nothing(tmp_path, url):
    scheme = url.split(":")[0]
    with pytest.raises(StoreError, match=f"unsupported run store URL scheme '{scheme}'"):
        RunStore(url)
    done = subprocess.run(
        [sys.executable, "-m", "blockviz", "runs", "--store", url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "unsupported run store URL scheme" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no folder named after the scheme, no file


def test_a_refused_connection_is_one_line_that_names_the_server(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "blockviz", "runs", "--store", "postgresql://me:pw@127.0.0.1:9/x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("blockviz runs: error: cannot reach the run store")
    assert "postgresql://127.0.0.1:9/x" in done.stderr and "pw" not in done.stderr
    assert "Traceback" not in done.stderr and list(tmp_path.iterdir()) == []


def test_a_missing_driver_is_one_line_naming_the_fix(tmp_path):
    script = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from blockviz.store import RunStore, StoreError\n"
        "try:\n    RunStore('postgresql://me@127.0.0.1:9/x')\n"
        "except StoreError as exc:\n    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "the PostgreSQL driver psycopg is not installed" in done.stdout
    assert "pip install 'psycopg[binary]" in done.stdout


# -- the schema on a server -----------------------------------------------------------


def test_a_server_store_upgrades_from_version_4(pg_url, tmp_path):
    url = f"{pg_url}?runs={tmp_path}"
    with RunStore(url) as store:
        old = store.create_run("old", CONFIG)
        with other_connection(store) as execute:
            for column in ("host", "boot_id", "stop_requested", "lost"):
                execute(f"ALTER TABLE runs DROP COLUMN {column}")
            execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    with RunStore(url) as store:
        assert (store.get_run(old).host, store.get_run(old).lost) == (None, None)
        assert store.request_stop(old)
        with other_connection(store) as execute:
            (version,) = execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert int(version) == SCHEMA_VERSION == 7


def test_a_newer_or_foreign_database_is_refused(pg_url, tmp_path):
    url = f"{pg_url}?runs={tmp_path}"
    with RunStore(url) as store, other_connection(store) as execute:
        execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match=r"newer blockviz \(schema version 99"):
        RunStore(url)


def test_a_database_of_something_else_is_not_taken_over(pg_url, tmp_path):
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id int)")
    with pytest.raises(StoreError, match="is a database but not a blockviz run store"):
        RunStore(f"{pg_url}?runs={tmp_path}")


# -- many workers, many hosts -------------------------------------------------------


def _claim_all(location: str, worker: int, study_id: int, start, results) -> None:
    with RunStore(location, create=False) as store:
        start.wait(30)
        mine = []
        while True:
            got = store.claim_study_run(study_id, 1000 + worker, None)
            if got is None:
                break
            mine.append(got)
        results.put((worker, mine))


@pytest.mark.slow
def test_four_workers_claim_forty_runs_each_exactly_once(pg_url, tmp_path):
    # On a server, where workers claim at once (SQLite lets one writer in at a time:
    # tests/store/test_store.py races its slots).
    with RunStore(f"{pg_url}?runs={tmp_path}") as store:
        runs = [{"variant": "v", "seed": i, "config": CONFIG, "max_steps": 10} for i in range(40)]
        study_id, run_ids = store.create_study("many", "sweep", "quick", {}, runs)
        context = multiprocessing.get_context("spawn")
        start, results = context.Event(), context.Queue()
        args = [(store.location.text, w, study_id, start, results) for w in range(4)]
        children = spawn(_claim_all, args)
        start.set()
        claims = dict(results.get(timeout=120) for _ in children)
        for child in children:
            child.join(60)
            assert child.exitcode == 0
        claimed = [run_id for mine in claims.values() for run_id in mine]
        assert sorted(claimed) == run_ids  # every run once, none twice
        pids = {run_id: store.get_run(run_id).pid for run_id in run_ids}
        for worker, mine in claims.items():
            assert all(pids[run_id] == 1000 + worker for run_id in mine)


def test_another_hosts_run_is_judged_by_its_heartbeat_alone(store_url, monkeypatch):
    monkeypatch.setenv("BLOCKVIZ_HOST", "host-b")
    with RunStore(store_url) as store:
        dead_pid = 2**22 + 4321  # no such process here
        now = time.time()
        b_fresh = store.create_run("b fresh", CONFIG, status="running", pid=dead_pid)
        b_stale = store.create_run("b stale", CONFIG, status="running", pid=os.getpid())
        monkeypatch.setenv("BLOCKVIZ_HOST", "host-a")
        a_dead = store.create_run("a dead", CONFIG, status="running", pid=dead_pid)
        store.update_run(b_fresh, heartbeat=now - 5)
        store.update_run(b_stale, heartbeat=now - 50)  # its pid is alive here: not asked
        store.update_run(a_dead, heartbeat=now - 5)
        assert store.get_run(b_fresh).host == "host-b" and store.get_run(a_dead).host == "host-a"
        # This host's dead process is failed as soon as its beat is older than stale_after;
        # host B's pid means nothing here, so B's runs wait for their beat to go stale.
        assert store.reap_dead(stale_after=1.0, remote_stale_after=30.0) == [b_stale, a_dead]
        failed = store.get_run(b_stale)
        assert failed.status == "failed" and "no heartbeat from host host-b" in failed.error
        assert store.get_run(b_fresh).status == "running"
        monkeypatch.setenv("BLOCKVIZ_REMOTE_STALE_S", "3")
        assert store.reap_dead() == []  # 5 s < the 30 s a run of this host waits
        assert store.reap_dead(stale_after=1.0) == [b_fresh]


def test_a_run_of_this_host_before_a_restart_is_judged_by_its_heartbeat(store_url):
    with RunStore(store_url) as store:
        alive_pid = os.getpid()
        run_id = store.create_run("old boot", CONFIG, status="running", pid=alive_pid)
        store.update_run(run_id, boot_id="an-earlier-boot", heartbeat=time.time() - 200)
        assert procs.boot_id()  # Linux says which boot this is
        assert store.reap_dead() == [run_id]  # its pid, alive in this boot, is not its own


def test_a_stop_asked_through_the_store_reaches_the_runs_heartbeat(store_url):
    with RunStore(store_url) as asking, RunStore(store_url, flush_seconds=None) as training:
        run_id = asking.create_run("r", CONFIG, status="running", pid=os.getpid())
        training.heartbeat(run_id, 1)
        assert not training.stop_requested(run_id)
        assert asking.request_stop(run_id)
        assert not training.stop_requested(run_id)  # read with the next beat written
        training.heartbeat(run_id, 2)
        training.flush()
        assert training.stop_requested(run_id)
        asking.update_run(run_id, status="stopped")
        assert not asking.request_stop(run_id)  # nothing to stop any more
        # Only a resume (train --resume takes it over with stop_requested None) or a
        # requeue spends a stop: a new process taking over a queued run keeps it.
        asking.update_run(run_id, status="queued")
        assert asking.get_run(run_id).stop_requested is not None
        asking.update_run(run_id, status="failed")
        assert asking.requeue_runs([run_id]) == 1
        assert asking.get_run(run_id).stop_requested is None


# -- a server that goes away ------------------------------------------------------------


def test_a_writer_keeps_its_rows_while_the_server_is_away(own_pg_server, tmp_path):
    url = f"{own_pg_server.create_database()}?runs={tmp_path}"
    with RunStore(url) as setup:
        run_id = setup.create_run("r", CONFIG, status="running", pid=os.getpid())
    with RunStore(url, flush_seconds=None, defer_when_busy=True, create=False) as writer:
        writer.log_scalars(run_id, [(step, "train/loss", step / 10) for step in range(100)])
        writer.flush()
        own_pg_server.stop()
        writer.log_scalars(run_id, [(step, "train/loss", step / 10) for step in range(100, 300)])
        began = time.monotonic()
        assert writer.flush() is False  # kept in memory, not lost, not an exception
        assert time.monotonic() - began < 10
        own_pg_server.start()
        assert writer.flush() is True
        steps = writer.scalars(run_id)["step"].tolist()
    assert steps == list(range(300))


# -- what an audit of the server store found (each failed before its fix) ---------------


def test_a_claimed_run_of_an_old_study_is_not_failed_by_another_host(store_url, monkeypatch):
    with RunStore(store_url) as store:
        study_id, run_ids = store.create_study("old", "sweep", "quick", {}, [
            {"variant": "v", "seed": 1, "config": CONFIG, "max_steps": 10}
        ])  # fmt: skip
        with other_connection(store) as execute:
            execute("UPDATE runs SET created = ?", (time.time() - 600,))  # stored long ago
        monkeypatch.setenv("BLOCKVIZ_HOST", "node-b")
        assert store.claim_study_run(study_id, os.getpid(), None) == run_ids[0]
        monkeypatch.setenv("BLOCKVIZ_HOST", "node-a")
        assert store.reap_dead() == []  # the claim beat: node B's silence starts now
        store.update_run(run_ids[0], pid=os.getpid(), status="queued")  # train takes over
        assert time.time() - store.get_run(run_ids[0]).heartbeat < 5


def test_a_run_being_claimed_elsewhere_does_not_end_a_workers_claims(pg_url, tmp_path):
    import psycopg

    with RunStore(f"{pg_url}?runs={tmp_path}") as store:
        runs = [{"variant": "v", "seed": i, "config": CONFIG, "max_steps": 10} for i in range(3)]
        study_id, run_ids = store.create_study("s", "sweep", "quick", {}, runs)
        with psycopg.connect(pg_url) as frozen:  # another worker, stuck mid-claim
            frozen.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (run_ids[0],))
            assert store.claim_study_run(study_id, 101, None) == run_ids[1]
            assert store.claim_study_run(study_id, 102, None) == run_ids[2]


def test_a_failing_statement_is_not_taken_for_a_lost_server(pg_url, tmp_path):
    import psycopg

    from blockviz.store.server import SERIAL_LOCK_KEY

    with RunStore(f"{pg_url}?runs={tmp_path}", busy_timeout_s=5.0) as store:
        run_id = store.create_run("r", CONFIG)
        store.conn.execute("SET lock_timeout = '200ms'")
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s)", (SERIAL_LOCK_KEY,))
            began = time.monotonic()
            with pytest.raises(StoreError, match="cannot use the run store"):
                store.update_run(run_id, notes="x")  # the lock wait fails: not a lost server
            assert time.monotonic() - began < 2.0


def test_another_hosts_live_run_is_neither_deleted_nor_counted_in_this_hosts_slots(
    store_url, monkeypatch
):
    monkeypatch.setenv("BLOCKVIZ_HOST", "node-7")
    with RunStore(store_url) as store:
        remote = store.create_run("remote", CONFIG, status="running", pid=2**22 + 9)
        monkeypatch.setenv("BLOCKVIZ_HOST", "node-1")
        with pytest.raises(StoreError, match="on host node-7; stop it before deleting"):
            store.delete_run(remote)
        mine = store.create_run("mine", CONFIG)
        assert store.claim_slot(mine, 1, pid=2**22 + 9)  # node-7's run holds no slot here


def test_text_with_nul_characters_does_not_stop_a_runs_rows(store_url):
    with RunStore(store_url, flush_seconds=None) as store:
        run_id = store.create_run("r", CONFIG)
        store.log_sample(run_id, 1, "p", "a\x00b")
        store.log_scalars(run_id, [(1, "train/loss", 2.0)])
        store.flush()
        assert len(store.scalars(run_id)) == 1
        assert store.samples(run_id)["text"].item() in ("a\x00b", "a\ufffdb")


def test_a_password_is_never_printed(tmp_path):
    from blockviz.store import redact

    assert redact("postgresql://me:p@ss@db:5/x") == "postgresql://me:***@db:5/x"
    text = "study work 1 --store postgresql://u:pw@h/d?runs=/a@b --threads 1"
    assert redact(text) == "study work 1 --store postgresql://u:***@h/d?runs=/a@b --threads 1"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://u@h/d?password=pw&sslmode=require", "postgresql://u@h/d?password=***&"),
        ("postgresql://h/d?sslmode=x&PASSWORD=pw", "postgresql://h/d?sslmode=x&PASSWORD=***"),
        ("host=h dbname=d password=pw user=u", "host=h dbname=d password=*** user=u"),
        ("host=h password='p w' user=u", "host=h password=*** user=u"),
    ],
)
def test_a_password_in_any_form_libpq_takes_is_masked(text, shown):
    """Only `user:pw@` was masked: `?password=` reached study sweep's hint, study launch's
    lines and the job logs in clear."""
    from blockviz.store import redact

    assert redact(text).startswith(shown) and "pw" not in redact(text).replace("pwd", "")


def test_a_password_never_reaches_another_process_command_line(pg_url, tmp_path, monkeypatch):
    """What a worker, a run or a fork is started with names the store without its password;
    the process reads it from PGPASSWORD, which opening the store sets."""
    from blockviz.launch import forking, study_runner

    monkeypatch.setenv("PGPASSWORD", "before")  # restored after the test, whatever it was
    url = f"{pg_url}?password=s3cret&runs={tmp_path / 'runs'}"
    with RunStore(url, flush_seconds=None) as store:
        assert "s3cret" not in store.location.text
        commands = [
            study_runner.worker_args(store, 1),
            forking.fork_command(store, 1, 10, {"lr": 0.01}),
            forking.replay_command(store, 1, 10),
        ]
        assert not any("s3cret" in " ".join(command) for command in commands)
        assert os.environ["PGPASSWORD"] == "s3cret"
    with RunStore(store.location.text, flush_seconds=None) as again:  # as a child opens it
        assert again.location.where == store.location.where


def test_a_bad_option_in_the_url_is_named_not_called_an_unreachable_server(pg_url):
    """`?sslmode=bogus` read "cannot reach the run store ...; is the server running?"."""
    with pytest.raises(StoreError) as raised:
        RunStore(f"{pg_url}?sslmode=bogus")
    message = str(raised.value)
    assert "sslmode" in message and "cannot reach" not in message, message
    assert not isinstance(raised.value, StoreUnreachable)


def test_an_sqlite_too_old_for_the_store_is_one_line(tmp_path, monkeypatch):
    import sqlite3

    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    with pytest.raises(StoreError, match=r"needs SQLite 3\.35 or newer"):
        RunStore(tmp_path / "s.db")
    assert not (tmp_path / "s.db").exists()
