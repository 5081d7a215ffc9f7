"""Which machine a process runs on: its host name and its boot (torch-free).

A run records both beside its pid, so liveness can tell its own machine's runs (whose
pids it can check) from another machine's (judged by their heartbeat alone), and a pid
recorded before this machine restarted from one that is alive now.

`BLOCKVIZ_HOST` names the host instead of the system's host name: two workers on one
machine can pretend to be two hosts (the tests do), and a cluster whose nodes share a
host name can tell them apart.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def this_host() -> str:
    """$BLOCKVIZ_HOST, else the system's host name."""
    return os.environ.get("BLOCKVIZ_HOST", "").strip()[:200] or socket.gethostname()


@functools.cache
def boot_id() -> str:
    """This boot's id (Linux's boot_id), "" where the system does not say."""
    try:
        return BOOT_ID_FILE.read_text(encoding="ascii").strip()[:64]
    except OSError:
        return ""


def is_this_machine(host: str | None, boot: str | None) -> bool:
    """Whether a run recorded on (host, boot) lives on this machine in this boot.

    A run recorded before hosts were (host None) counts as this machine's, as it did then.
    """
    if host is None:
        return True
    return host == this_host() and (not boot or not boot_id() or boot == boot_id())
