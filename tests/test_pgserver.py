"""The PostgreSQL fixtures (tests/conftest.py, tests/pgserver.py) give what they promise:
fresh empty databases on the session's server, and a server of a test's own that can go
down and come back with its data."""

import re
import socket
from pathlib import Path

import psycopg
import pytest

from tests import pgserver


def _tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        query = "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        return [name for (name,) in conn.execute(query)]


def test_a_pg_url_database_takes_a_table_and_a_row(pg_url):
    assert pg_url.startswith("postgresql://blockviz@127.0.0.1:")
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE runs (id integer PRIMARY KEY, name text NOT NULL)")
        conn.execute("INSERT INTO runs VALUES (1, 'ünïcode run')")
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT id, name FROM runs").fetchall() == [(1, "ünïcode run")]


def test_two_pg_urls_are_different_empty_databases(pg_url, pg_server):
    other = pg_server.create_database()
    try:
        assert other != pg_url
        assert _tables(pg_url) == _tables(other) == []
        with psycopg.connect(pg_url) as conn:
            conn.execute("CREATE TABLE only_here (x integer)")
        assert (_tables(pg_url), _tables(other)) == (["only_here"], [])
    finally:
        pg_server.drop_database(other)


def test_store_url_is_a_sqlite_file_or_a_pg_database(store_url, tmp_path, request):
    if request.node.callspec.id == "sqlite":
        assert store_url == str(tmp_path / "runs" / "blockviz.db")
    else:  # a fresh empty database (the URL may carry the store's own parameters)
        assert store_url.startswith("postgresql://blockviz@127.0.0.1:")
        assert _tables(store_url.partition("?")[0]) == []


def test_own_pg_server_goes_down_and_comes_back_with_its_data(own_pg_server):
    url = own_pg_server.create_database()
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE kept (x integer)")
        conn.execute("INSERT INTO kept VALUES (42)")

    own_pg_server.stop()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)

    # A start that fails (its port taken meanwhile) says why, from the server's log.
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", own_pg_server.port))
        squatter.listen()
        with pytest.raises(pgserver.PgServerError, match="could not bind"):
            own_pg_server.start()

    own_pg_server.start()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM kept").fetchall() == [(42,)]

    folder = own_pg_server.folder
    own_pg_server.close()
    own_pg_server.close()  # idempotent: the fixture closes it again
    assert not folder.exists()


def test_without_binaries_a_test_skips_but_under_ci_it_fails(monkeypatch):
    monkeypatch.setattr(pgserver, "find_bindir", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"^{re.escape(pgserver.MISSING)}$"):
        pgserver.require_binaries()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="binaries not found"):
        pgserver.require_binaries()
    with pytest.raises(pgserver.PgServerError, match=r"`apt-get install postgresql`"):
        pgserver.PgServer()


def test_the_binaries_are_found_by_the_tests_own_search():
    pgserver.require_binaries()
    bindir = pgserver.find_bindir()
    assert bindir is not None and pgserver.unavailable() is None
    assert all((Path(bindir) / tool).exists() for tool in ("initdb", "pg_ctl", "postgres"))
