"""What can go wrong with a run store, said so that a user can act on it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

SQLITE_HEADER = b"SQLite format 3\x00"

CORRUPT_ADVICE = (
    "restore it from a backup, or move it aside to start a new store "
    "(`sqlite3 FILE .recover` may save its rows)"
)

READONLY_HINTS = ("not writable", "read-only", "readonly", "unable to open", "cannot create")


class StoreError(ValueError):
    """A problem with the run store a user can act on; the message says what and where."""


class StoreLocked(StoreError):
    """Another process held the store's lock for longer than the busy timeout."""


class StoreUnreachable(StoreLocked):
    """A server store did not answer within the busy timeout (stopped, restarting, network).

    A StoreLocked: whatever waits out a locked file (a run's lifecycle writes) waits for
    the server the same way, and a training writer keeps its rows in memory meanwhile.
    """


def is_readonly_error(exc: StoreError) -> bool:
    """Whether opening failed because the file or its folder cannot be written here."""
    return any(hint in str(exc) for hint in READONLY_HINTS)


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for another connection's lock."""
    text = str(exc)
    return "locked" in text or "busy" in text


def has_sqlite_header(path: Path) -> bool:
    """Whether the file starts like an SQLite database (False when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def store_error(
    exc: sqlite3.Error, path: Path, busy_timeout_s: float, *, opening: bool = False
) -> StoreError:
    """A StoreError that says what went wrong with which file."""
    text = str(exc)
    if "not a database" in text or "malformed" in text:
        if not has_sqlite_header(path):
            return StoreError(
                f"{path} is not a blockviz run store (not an SQLite file: {text}); "
                "give another --store path"
            )
        return StoreError(f"the run store {path} is corrupt ({text}); {CORRUPT_ADVICE}")
    if "disk is full" in text or "disk I/O" in text:
        return StoreError(
            f"cannot write the run store {path}: {text} (is its disk full?); "
            "free some space and try again"
        )
    if "locked" in text or "busy" in text:
        return StoreLocked(
            f"the run store {path} stayed locked by another process for "
            f"{busy_timeout_s:g} s; try again"
        )
    if "readonly" in text or "read-only" in text:
        return StoreError(f"the run store {path} is read-only here ({text})")
    if "closed" in text:
        return StoreError(f"the run store {path} is closed")
    verb = "open" if opening else "use"
    return StoreError(f"cannot {verb} the run store {path}: {text}")


def missing_store(where: str, why: str) -> str:
    """The message for a store that must exist already and does not: where it looked and
    why it found none; nothing is created."""
    relative = "" if "://" in where else " (a relative path starts from the folder you run in)"
    return (
        f"no run store at {where} ({why}); nothing was created: name the store with --store "
        f"or BLOCKVIZ_STORE{relative}"
    )
