"""Safe file names and writes that never leave the output folder (symlinks included)."""

from __future__ import annotations

import os
import re
import stat
import unicodedata
from pathlib import Path

from blockviz.core.files import atomic_write

MAX_STEM = 100  # file-name stem cap: room for a suffix and well under every FS limit


class ExportError(ValueError):
    """An export cannot be written as asked; the message names the path or value and why."""


def safe_filename(text: str, ext: str) -> str:
    """A file name made of [a-z0-9._-] from any text: no separators, no '..', never empty."""
    ascii_text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode()
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", ascii_text).lower()
    stem = re.sub(r"\.{2,}", ".", stem)  # '..' never survives, even inside a name
    stem = re.sub(r"-{2,}", "-", stem)
    # No leading dot (a hidden file) and no trailing dot or dash to glue onto the suffix.
    stem = stem.strip("._-")[:MAX_STEM].strip("._-") or "export"
    suffix = re.sub(r"[^a-z0-9]", "", str(ext).lower())[:10]
    return f"{stem}.{suffix}" if suffix else stem


def _check_name(name: str) -> None:
    """Refuse names that are not a single plain path component."""
    separators = {"/", "\\", os.sep, os.altsep or "/", "\0"}
    if not name or name in (".", "..") or any(s in name for s in separators):
        raise ExportError(
            f"file name {name!r} is not allowed; use one plain name without path "
            "separators (safe_filename makes one)"
        )


# Opening a folder never follows a symlink (O_NOFOLLOW) and never opens anything else.
_FOLDER_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


class OutFolder:
    """An output folder opened once; every export write goes through `write` and stays in it.

    The root is resolved once (a symlink given as the folder itself is the caller's
    choice). Below it, subfolders are created and opened one component at a time
    relative to their parent's file descriptor, refusing any component that is a
    symlink, so nothing swapped in later can redirect a write either. Each file is
    written to a temporary name in its folder and renamed over the target, and a rename
    replaces a symlink at the target instead of following it.
    """

    def __init__(self, out_dir: str | Path) -> None:
        if not {os.open, os.mkdir, os.stat, os.rename, os.unlink} <= os.supports_dir_fd:
            raise ExportError("writing exports needs a system with dir_fd support (POSIX)")
        root = Path(out_dir).expanduser()
        if root.exists() and not root.is_dir():
            raise ExportError(f"--out {root} exists and is not a folder")
        try:
            root.mkdir(parents=True, exist_ok=True)
            self.root = root.resolve(strict=True)
            root_fd = os.open(self.root, _FOLDER_FLAGS)
        except OSError as exc:
            raise ExportError(
                f"cannot create the output folder {root} ({exc.strerror or exc})"
            ) from None
        self._folders: dict[str, int] = {"": root_fd}

    def __enter__(self) -> OutFolder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the folder descriptors (writing afterwards reopens nothing: it fails)."""
        folders, self._folders = self._folders, {}
        for fd in folders.values():
            os.close(fd)

    def folder(self, relative: str) -> int:
        """The descriptor of root/relative ('a/b'), created if missing; never via a symlink."""
        if relative in self._folders:
            return self._folders[relative]
        if not self._folders:
            raise ExportError(f"the output folder {self.root} is closed")
        parent_path, _, name = relative.rpartition("/")
        _check_name(name)
        parent = self.folder(parent_path)
        shown = self.root / relative
        try:
            os.mkdir(name, 0o777, dir_fd=parent)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ExportError(f"cannot create the folder {shown} ({exc.strerror})") from None
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError as exc:
            raise ExportError(f"cannot read the folder {shown} ({exc.strerror})") from None
        if stat.S_ISLNK(info.st_mode):
            raise ExportError(
                f"{shown} is a symlink; not writing through it (exports stay inside {self.root})"
            )
        if not stat.S_ISDIR(info.st_mode):
            raise ExportError(f"{shown} exists and is not a folder; not writing into it")
        try:
            fd = os.open(name, _FOLDER_FLAGS, dir_fd=parent)
        except OSError as exc:  # replaced by a symlink since the check: ELOOP
            raise ExportError(f"cannot open the folder {shown} ({exc.strerror})") from None
        self._folders[relative] = fd
        return fd

    def write(self, relative: str, data: bytes | str, *, overwrite: bool = True) -> Path:
        """Write data to root/relative ('charts/loss.png') whole, then return its path.

        An existing regular file is replaced (unless overwrite=False, which refuses); a
        symlink, folder or anything else at that name is refused and left as it is.
        """
        for part in relative.split("/"):
            _check_name(part)  # no '', '.', '..' or backslash anywhere in the path
        folder_path, _, name = relative.rpartition("/")
        folder = self.folder(folder_path)
        target = self.root / relative
        try:
            info: os.stat_result | None = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        except OSError as exc:
            raise ExportError(f"cannot read {target} ({exc.strerror})") from None
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise ExportError(f"{target} exists and is not a regular file; not writing over it")
        if info is not None and not overwrite:
            raise ExportError(f"{target} already exists; pass overwrite=True to replace it")
        try:
            atomic_write(name, data, dir_fd=folder)
        except OSError as exc:
            raise ExportError(f"cannot write {target} ({exc.strerror or exc})") from None
        return target


def write_file(out_dir: Path, name: str, data: bytes | str, *, overwrite: bool = True) -> Path:
    """Write `data` to out_dir/name and return the path; refuse to write anywhere else.

    An existing regular file of that name is replaced (re-running an export refreshes it),
    atomically, unless `overwrite=False`, which raises instead. A symlink or a folder in
    the way is refused, never followed.
    """
    _check_name(name)
    with OutFolder(out_dir) as out:
        return out.write(name, data, overwrite=overwrite)


def unique_name(name: str, taken: set[str]) -> str:
    """`name`, or name-2, name-3 ... when two titles sanitise to the same file name."""
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    candidate, count = name, 1
    while candidate in taken:
        count += 1
        candidate = f"{stem}-{count}.{ext}" if ext else f"{stem}-{count}"
    taken.add(candidate)
    return candidate
