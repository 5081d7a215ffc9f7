"""Atomic file writes: a reader sees no file or the whole file, never half of one.

One mechanism for every file blockviz writes whole (run configs, uploads, downloads,
exports): write a temporary file in the target's own folder, then rename it over the
target. rename(2) within one folder is atomic, replaces whatever entry has the name (a
symlink included) and never follows it. On any error the temporary file is removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

# O_NOFOLLOW and O_EXCL: the temporary name is new, so nothing planted there is followed.
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL
_TEMP_FLAGS |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@contextmanager
def atomic_file(target: str | os.PathLike[str], *, dir_fd: int | None = None) -> Iterator[BinaryIO]:
    """A binary file to write; on leaving the block it replaces `target` whole.

    With `dir_fd`, `target` is a bare name inside the folder that descriptor opens (the
    export code opens folders one level at a time so that no symlink redirects a write).
    If the block raises, the target is left as it was and the temporary file is removed.
    """
    folder, name = (None, os.fspath(target)) if dir_fd is not None else _split(target)
    temp = f".{name[:40]}.{secrets.token_hex(6)}.part"
    temp_path = temp if folder is None else os.path.join(folder, temp)
    fd = os.open(temp_path, _TEMP_FLAGS, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
        final = name if folder is None else os.path.join(folder, name)
        os.replace(temp_path, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_path, dir_fd=dir_fd)
        raise


def atomic_write(
    target: str | os.PathLike[str], data: bytes | str, *, dir_fd: int | None = None
) -> None:
    """Write `data` (text as UTF-8) to `target` whole, through `atomic_file`."""
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    with atomic_file(target, dir_fd=dir_fd) as handle:
        handle.write(payload)


def _split(target: str | os.PathLike[str]) -> tuple[str, str]:
    path = Path(target)
    return str(path.parent), path.name
