"""What a store's runs cost on disk: a run folder's size, the store's checkpoints, and the
size past which the Runs page and `blockviz runs` warn (torch-free).

Every count walks one folder the store owns (a run's folder, or the store's folder of run
folders) without following links, so the work is bounded by what that store wrote.
Checkpoints are most of it: each is a full training state (weights and both AdamW
moments), and a run keeps `last.ckpt`, `best.ckpt` and its kept `step-N.ckpt` fork points.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

CKPT_SUFFIX = ".ckpt"
WARN_ENV = "BLOCKVIZ_CKPT_WARN_MB"
# About 200 checkpoints of the default (baby-cpu) model, 10 MB each (benchmarks/auto_run_disk.py).
DEFAULT_WARN_MB = 2000
MB = 1_000_000
# How to free the space, as both the Runs page and `blockviz runs` say it.
FREE_HINT = (
    "delete runs you no longer need on the Runs page (select a run, then Delete; switch on "
    "Show auto-runs to list the Playground's), which removes their folders"
)


def _files(folder: Path) -> Iterator[os.DirEntry[str]]:
    """Every regular file under `folder` (links neither followed nor counted)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:  # gone, or never made: nothing to count
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _files(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                yield entry
        except OSError:
            continue


def _size(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_size
    except OSError:  # deleted between the listing and the stat (a thinned checkpoint)
        return 0


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under `folder` (0 when it does not exist)."""
    return sum(_size(entry) for entry in _files(Path(folder)))


def checkpoint_bytes(folder: Path) -> int:
    """The bytes of the checkpoint files (`*.ckpt`) under `folder`."""
    return sum(_size(e) for e in _files(Path(folder)) if e.name.endswith(CKPT_SUFFIX))


def size_text(n_bytes: int | None) -> str:
    """'48.9 MB', '312 kB', '0 B' (decimal units, as file managers show them); '-' for None."""
    if n_bytes is None:
        return "-"
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n_bytes >= scale:
            value = n_bytes / scale
            return f"{value:.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    return f"{n_bytes} B"


class WarnSizeError(ValueError):
    """The warning size given is not a number of megabytes."""


def warn_mb(given: str | int | None = None) -> int:
    """The checkpoint size (MB) past which a store warns: `given` (a flag), else
    $BLOCKVIZ_CKPT_WARN_MB, else DEFAULT_WARN_MB; 0 turns the warning off."""
    text = str(given) if given is not None else os.environ.get(WARN_ENV, "").strip()
    if not text:
        return DEFAULT_WARN_MB
    source = "--ckpt_warn_mb" if given is not None else f"${WARN_ENV}"
    if not text.isdigit():
        raise WarnSizeError(
            f"{source}: {text[:40]!r} is not allowed; give the size in whole megabytes "
            "(0 turns the warning off)"
        )
    return int(text)


def over_warning(ckpt_bytes: int, limit_mb: int, where: str) -> str | None:
    """The warning when `ckpt_bytes` of checkpoints in `where` pass `limit_mb` (plain text),
    else None (and always None when the limit is 0)."""
    if limit_mb <= 0 or ckpt_bytes <= limit_mb * MB:
        return None
    return (
        f"Checkpoints take {size_text(ckpt_bytes)} in {where}, past the "
        f"{size_text(limit_mb * MB)} this store warns at (${WARN_ENV}). To free space, "
        f"{FREE_HINT}."
    )
