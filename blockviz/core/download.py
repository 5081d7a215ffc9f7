"""Downloads into a checksum-pinned cache, with progress (the only network code)."""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from blockviz.core.files import atomic_file
from blockviz.core.vocab import DataError

Progress = Callable[[int, int | None], None]


def cache_dir() -> Path:
    """Downloads live in $BLOCKVIZ_CACHE, else $XDG_CACHE_HOME/blockviz, else ~/.cache/blockviz."""
    if os.environ.get("BLOCKVIZ_CACHE"):
        return Path(os.environ["BLOCKVIZ_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "blockviz"
    return Path.home() / ".cache" / "blockviz"


class _DownloadFailed(Exception):
    """Why one download attempt failed, in words; turned into a DataError by `download`."""


def download(
    url: str,
    dest: Path,
    sha256: str,
    size: int,
    progress: Progress | None = None,
    timeout: float = 30,
) -> Path:
    """`dest`, fetched from `url` unless a valid copy is there; verified, written atomically."""
    dest = Path(dest)
    if _file_matches(dest, sha256, size):
        return dest
    by_hand = (
        f"To work offline, download that URL another way and save it as {dest} "
        f"(it must be {size:,} bytes with SHA-256 {sha256})"
    )
    # Readers see no file or the whole, verified file: a failed or interrupted download
    # (Ctrl-C, a full disk) leaves nothing in the cache.
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(dest) as out:
            done, digest = _fetch(url, out, size, progress, timeout)
            if done != size:
                ended = f"the body ended after {done:,} of {size:,} bytes (truncated)"
                raise _DownloadFailed(ended)
            if digest != sha256:
                raise _DownloadFailed(f"its SHA-256 is {digest}, expected {sha256}")
    except _DownloadFailed as exc:
        raise DataError(f"could not download {url} to {dest}: {exc}. {by_hand}") from None
    except OSError as exc:
        raise DataError(
            f"cannot write to the cache directory {dest.parent} ({exc.strerror or exc}); "
            "set BLOCKVIZ_CACHE to a writable directory"
        ) from None
    return dest


def _fetch(
    url: str, out: BinaryIO, size: int, progress: Progress | None, timeout: float
) -> tuple[int, str]:
    """Stream `url` into `out`; return (bytes written, SHA-256 hex). Errors become words."""
    digest = hashlib.sha256()
    done = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            if progress:
                progress(0, size)
            while chunk := response.read(1 << 16):
                done += len(chunk)
                # A wrong URL can serve something huge; stop as soon as it is too big.
                if done > size:
                    raise _DownloadFailed(f"the server sent more than the expected {size:,} bytes")
                digest.update(chunk)
                out.write(chunk)
                if progress:
                    progress(done, size)
    except urllib.error.HTTPError as exc:
        raise _DownloadFailed(f"the server answered HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise _DownloadFailed(f"no connection ({exc.reason})") from None
    except TimeoutError:
        raise _DownloadFailed(f"no answer within {timeout:g} s") from None
    except (http.client.HTTPException, ConnectionError) as exc:
        raise _DownloadFailed(f"the connection failed ({type(exc).__name__}: {exc})") from None
    except ValueError as exc:  # urllib's answer to a malformed URL
        raise _DownloadFailed(f"not a usable URL ({exc})") from None
    return done, digest.hexdigest()


def _file_matches(path: Path, sha256: str, size: int) -> bool:
    """Whether `path` is a regular file of exactly `size` bytes with this SHA-256."""
    try:
        if not path.is_file() or path.stat().st_size != size:
            return False
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return False
    return digest.hexdigest() == sha256


class DownloadProgress:
    """Percentages on stderr while a download runs; silent when nothing is downloaded."""

    def __init__(self) -> None:
        self.shown = -1

    def __call__(self, done: int, total: int | None) -> None:
        percent = int(100 * done / total) if total else 0
        if percent != self.shown:
            self.shown = percent
            total_text = f"{total:,}" if total else "?"
            print(
                f"\rdownloading: {percent:3d}% ({done:,} / {total_text} bytes)",
                end="",
                file=sys.stderr,
            )

    def finish(self) -> None:
        if self.shown >= 0:
            print(file=sys.stderr)
