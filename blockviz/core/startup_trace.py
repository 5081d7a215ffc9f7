"""Timestamps of a run's start-up phases, for benchmarks/bench_startup.py.

When BLOCKVIZ_STARTUP_TRACE names a file, `mark(label)` appends "label <unix time>" to it,
once per label per process; otherwise it does nothing. The train process marks the
phases between its start and its first step, so the benchmark can say where the time
between Launch and the first loss point goes.
"""

from __future__ import annotations

import os
import time

ENV = "BLOCKVIZ_STARTUP_TRACE"
_seen: set[str] = set()


def enabled() -> bool:
    """Whether this process writes a trace."""
    return bool(os.environ.get(ENV))


def mark(label: str) -> None:
    """Record that `label` happened now (first time only); a write that fails is ignored."""
    path = os.environ.get(ENV)
    if not path or label in _seen:
        return
    _seen.add(label)
    try:
        with open(path, "a", encoding="utf-8") as trace:
            trace.write(f"{label} {time.time():.6f}\n")
    except OSError:
        pass
