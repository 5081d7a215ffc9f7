"""Where a store lives: an SQLite file path, or a PostgreSQL server named by a URL.

`--store` and `$BLOCKVIZ_STORE` take either. Text that starts like a URL (`scheme://`) is
a URL: `postgresql://` (or `postgres://`) is a server store, `sqlite:///path` a file, and
any other scheme is refused with one line (it never becomes a folder named `scheme:`).
Anything else is a file path.

A server store keeps its run folders (checkpoints, logs) on disk like a file store does;
the URL's `runs` query parameter names that folder, and on a cluster it must be a path
every worker sees (a shared file system):

    postgresql://me@db.example:5432/blockviz?runs=/shared/blockviz

Without it the folder is `runs/<database>` under the working directory. The parameter is
blockviz's own and is taken off the URL before it reaches the driver; a password in the
URL is never printed (`where`, `redact`), nor handed to another process on its command
line: `text` leaves it out, and the processes blockviz starts read it from `PGPASSWORD`,
which opening the store sets (`password`), as libpq does for any client.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from blockviz.store.errors import StoreError

DEFAULT_STORE = Path("runs") / "blockviz.db"
SERVER_SCHEMES = ("postgresql", "postgres")
RUNS_PARAM = "runs"
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")


@dataclass(frozen=True)
class Location:
    """A store's place: `path` for a file store; `url` (the driver's) for a server store.

    `text` is what another process is given as `--store` to open the same store; `where`
    is how messages name it (no password); `workspace` holds the run folders, the study
    folders and uploads.
    """

    text: str
    path: Path | None = None
    url: str | None = None
    where: str = ""
    workspace: Path = Path()
    password: str | None = field(default=None, repr=False)  # the URL's, kept out of `text`

    @property
    def is_server(self) -> bool:
        """Whether the store is a database server (PostgreSQL), not a file."""
        return self.url is not None

    def workspace_or_file(self) -> Path:
        """The store file, or a server store's workspace folder."""
        return self.path if self.path is not None else self.workspace


def default_store_text() -> str:
    """$BLOCKVIZ_STORE if set, else runs/blockviz.db relative to the working directory."""
    return os.environ.get("BLOCKVIZ_STORE", "").strip() or str(DEFAULT_STORE)


def default_store_path() -> Path:
    """$BLOCKVIZ_STORE as a path when it names a file (default: runs/blockviz.db, relative);
    for a server URL, that store's workspace folder."""
    text = default_store_text()
    if _URL.match(text) is None:
        return Path(text).expanduser()
    return parse_location(text).workspace_or_file()


def parse_location(target: str | Path | None) -> Location:
    """The Location of a store given as a path, a URL, or None ($BLOCKVIZ_STORE / default).

    StoreError for a URL scheme blockviz does not support or a server URL it cannot use.
    """
    if target is None:
        target = default_store_text()
    if isinstance(target, Path):
        return _file(target)
    text = str(target).strip()
    if not text:
        raise StoreError("the run store is empty text; give a file path or a postgresql:// URL")
    match = _URL.match(text)
    if match is None:
        return _file(Path(text))
    scheme = match.group(1).lower()
    if scheme == "sqlite":
        return _file(Path(unquote(urlsplit(text).path)))
    if scheme not in SERVER_SCHEMES:
        raise StoreError(
            f"unsupported run store URL scheme {scheme!r} in {redact(text)!r}; give a file "
            "path (SQLite) or a postgresql://user@host:port/database URL"
        )
    return _server(text)


def _file(path: Path) -> Location:
    path = path.expanduser().absolute()
    return Location(text=str(path), path=path, where=str(path), workspace=path.parent)


def _server(text: str) -> Location:
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        raise StoreError(f"the run store URL {redact(text)!r} has a bad port number") from None
    query = parse_qsl(parts.query, keep_blank_values=True)
    runs = [value for key, value in query if key == RUNS_PARAM]
    rest = [(key, value) for key, value in query if key != RUNS_PARAM]
    given = [value for key, value in rest if key == "password"]
    password = given[-1] if given else unquote(parts.password) if parts.password else None
    # What another process is given: the URL without its password, in either form.
    user, _, host = parts.netloc.rpartition("@")
    netloc = f"{user.split(':', 1)[0]}@{host}" if user else host
    public = [(key, value) for key, value in rest if key != "password"]
    url = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(rest), ""))
    database = unquote(parts.path.lstrip("/")) or unquote(parts.username or "") or "postgres"
    if runs and runs[-1].strip():
        workspace = Path(runs[-1]).expanduser().absolute()
    else:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", database) or "postgres"
        workspace = (DEFAULT_STORE.parent / safe).absolute()
    # A worker started elsewhere gets the folder spelled out, so it agrees with this one.
    child = urlunsplit(
        (
            "postgresql",
            netloc,
            parts.path,
            urlencode([*public, (RUNS_PARAM, str(workspace))], safe="/"),
            "",
        )
    )
    host = parts.hostname or "localhost"
    where = f"postgresql://{host}{f':{port}' if port else ''}/{database}"
    return Location(text=child, url=url, where=where, workspace=workspace, password=password)


def redact(text: str) -> str:
    """Text with the password of any URL in it replaced by ***, in each form libpq takes:
    `user:secret@host` (up to the last @ before the host: a password may hold a raw @),
    `?password=secret` / `&password=secret`, and `password=secret` in a key=value string."""
    text = re.sub(r"(://[^/:@\s]*:)[^/\s]*@", r"\1***@", text)
    return re.sub(r"(?i)(\bpassword\s*=\s*)('[^']*'|[^&\s'\"#]*)", r"\1***", text)
