"""Throwaway PostgreSQL servers for the tests: `initdb` into a temp folder, serve on a free
loopback port, remove it all when done.

    server = PgServer()               # initdb + start (a second or two)
    url = server.create_database()    # postgresql://blockviz@127.0.0.1:PORT/test_...
    server.stop(); server.start()     # an outage: same data, same port
    server.close()                    # stop and remove the folder

The server binaries come from Debian's `postgresql` package (.ci/run installs it). The
server never runs as root: as root, every server command runs as the `postgres` user
(`nobody` where there is none) through runuser or setpriv; otherwise as yourself.
`python3 tests/pgserver.py` prints the binaries' folder, or why there are none (exit 1);
it needs only the standard library, so .ci/run can ask before the venv exists.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

MISSING = "PostgreSQL server binaries not found; `apt-get install postgresql` (.ci/run does)"
USER = "blockviz"  # the superuser initdb creates; trust auth, so no password
START_TIMEOUT = 30  # seconds; every wait below is bounded
STOP_TIMEOUT = 30
# Durability off: a test server's data lives no longer than the test run.
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}
_TOOLS = ("initdb", "pg_ctl", "postgres")


class PgServerError(RuntimeError):
    """A server command failed or timed out; the message ends with the server log's tail."""


def find_bindir() -> Path | None:
    """The folder with initdb, pg_ctl and postgres: `pg_config --bindir`, else the highest
    /usr/lib/postgresql/<version>/bin, else wherever PATH has initdb; None if none has all."""
    candidates = []
    if pg_config := shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out:
                candidates.append(Path(out))
    debian = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += [Path(d) for d in sorted(debian, key=_version, reverse=True)]
    if initdb := shutil.which("initdb"):
        candidates.append(Path(initdb).parent)
    for folder in candidates:
        if all(os.access(folder / tool, os.X_OK) for tool in _TOOLS):
            return folder
    return None


def _version(bindir: str) -> tuple[int, ...]:
    """/usr/lib/postgresql/15/bin -> (15,); 9.6 -> (9, 6); anything else sorts first."""
    return tuple(int(n) for n in re.findall(r"\d+", Path(bindir).parent.name))


def unavailable() -> str | None:
    """Why no test server can be started here (MISSING), or None if one can."""
    return None if find_bindir() else MISSING


def require_binaries() -> None:
    """For a fixture: skip when no server can be started, but fail when CI=true, so CI
    can never silently skip the PostgreSQL tests."""
    import pytest

    reason = unavailable()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: not skipping)", pytrace=False)
    pytest.skip(reason)


def _run_as() -> tuple[list[str], pwd.struct_passwd | None]:
    """The command prefix that drops root (and the user it drops to); nothing if not root."""
    if os.geteuid() != 0:
        return [], None
    for name in ("postgres", "nobody"):
        try:
            user = pwd.getpwnam(name)
        except KeyError:
            continue
        if shutil.which("runuser"):
            return ["runuser", "-u", name, "--"], user
        setpriv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}"]
        return [*setpriv, "--init-groups", "--"], user
    raise PgServerError("running as root and there is no `postgres` or `nobody` user")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PgServer:
    """A PostgreSQL server of its own in a fresh temp folder, started on construction."""

    def __init__(self, bindir: Path | None = None) -> None:
        found = bindir or find_bindir()
        if found is None:
            raise PgServerError(MISSING)
        self.bindir = found
        self._prefix, user = _run_as()
        self.folder = Path(tempfile.mkdtemp(prefix="blockviz-pg-"))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self.port = 0
        self._running = False
        self._closed = False
        atexit.register(self.close)  # a backstop; the fixtures close explicitly
        try:
            if user is not None:
                os.chown(self.folder, user.pw_uid, user.pw_gid)
            # --locale=C: whatever LANG says here cannot clash with UTF8
            initdb = ["-D", self.data, "-A", "trust", "-U", USER, "--no-sync", "-E", "UTF8"]
            self._run("initdb", [*initdb, "--locale=C"], timeout=START_TIMEOUT)
            self._start_on_free_port()
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<PgServer {state} on 127.0.0.1:{self.port}, {self.folder}>"

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self) -> str:
        """A fresh empty database with a unique name; its URL."""
        name = f"test_{uuid.uuid4().hex[:16]}"
        self._admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop a database create_database made (closing any connections still open)."""
        name = url.rsplit("/", 1)[1]
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def start(self) -> None:
        """Start again after stop(): the same data folder, the same port."""
        if self._closed:
            raise PgServerError("this server is closed")
        if not self._running:
            self._pg_ctl_start()

    def stop(self) -> None:
        """Stop (fast shutdown: open connections are cut); return once the port refuses."""
        if not self._running and not (self.data / "postmaster.pid").exists():
            return  # (a start that timed out may have left one starting)
        stop = ["stop", "-D", self.data, "-w", "-t", str(STOP_TIMEOUT), "-m"]
        try:
            self._run("pg_ctl", [*stop, "fast"], timeout=STOP_TIMEOUT + 10)
        except PgServerError:
            if (self.data / "postmaster.pid").exists():  # still up: cut it short
                self._run("pg_ctl", [*stop, "immediate"], timeout=STOP_TIMEOUT + 10)
        self._running = False
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except ConnectionRefusedError:
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise PgServerError(self._failure(f"port {self.port} still open after stop"))
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the server and remove its folder; idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            self.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _start_on_free_port(self) -> None:
        """Start on a port the kernel just called free; once more if it was taken since."""
        for attempt in (1, 2):
            self.port = _free_port()
            logged = self.log.stat().st_size if self.log.exists() else 0
            try:
                self._pg_ctl_start()
                return
            except PgServerError:
                new_log = self.log.read_bytes()[logged:] if self.log.exists() else b""
                if attempt == 2 or b"could not bind" not in new_log:
                    raise

    def _pg_ctl_start(self) -> None:
        options = ["-p", str(self.port), "-c", f"unix_socket_directories={self.folder}"]
        for name, value in SETTINGS.items():
            options += ["-c", f"{name}={value}"]
        start = ["start", "-D", self.data, "-l", self.log, "-w", "-t", str(START_TIMEOUT)]
        self._run("pg_ctl", [*start, "-o", shlex.join(options)], timeout=START_TIMEOUT + 10)
        self._running = True

    def _run(self, tool: str, args: list[str | Path], timeout: float) -> None:
        command = [*self._prefix, str(self.bindir / tool), *map(str, args)]
        try:
            done = subprocess.run(
                command, cwd=self.folder, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as timed_out:
            raise PgServerError(self._failure(f"{tool} timed out after {timeout} s")) from timed_out
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip()
            raise PgServerError(self._failure(f"{shlex.join(command)} failed:\n{output}"))

    def _admin(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement)

    def _failure(self, what: str, lines: int = 20) -> str:
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            tail = ["(no server log)"]
        return f"{what}\n--- last lines of {self.log}:\n" + "\n".join(tail)


if __name__ == "__main__":
    bindir = find_bindir()
    print(bindir or MISSING, file=sys.stdout if bindir else sys.stderr)
    sys.exit(0 if bindir else 1)
