"""Run processes: who a run's process is, whether it is alive, and how to stop it (torch-free).

A pid alone does not name a process: once a run's process is gone the kernel hands its
pid to the next process that starts, and a dead child that nobody has waited for (a
zombie) still answers `kill(pid, 0)`. So every run records its process's identity, the
pid plus the process's start time as psutil reads it, and everything that asks "is the
run alive?" or sends it a signal checks both. A run recorded before identities existed
(no start time) counts as its own only while the process's command line names blockviz.

A run also records which machine its process runs on, its host name and its boot, so
liveness can tell its own machine's runs (whose pids it can check) from another machine's
(judged by their heartbeat alone), and a pid recorded before this machine restarted from
one that is alive now. `BLOCKVIZ_HOST` names the host instead of the system's host name:
two workers on one machine can pretend to be two hosts (the tests do), and a cluster whose
nodes share a host name can tell them apart.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

# Start times are read from the same kernel counter each time, so one process always
# reports the same value; the tolerance only absorbs float rounding.
START_TIME_TOLERANCE_S = 0.05
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class Identity:
    """A process as a run records it: pid and start time (unix seconds)."""

    pid: int
    started: float


def identity_of(pid: int | None = None) -> Identity | None:
    """The identity of process `pid` (default: this process), or None if it is gone."""
    pid = os.getpid() if pid is None else pid
    if pid <= 0:
        return None
    try:
        return Identity(pid, psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def _process(pid: int | None, started: float | None) -> psutil.Process | None:
    """The live, non-zombie process that is the run's own, or None."""
    if pid is None or pid <= 0:  # 0 and negatives would signal whole process groups
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None  # exited; only its exit status waits to be collected
        if started is not None:
            if abs(proc.create_time() - started) > START_TIME_TOLERANCE_S:
                return None  # the pid now belongs to another process
        elif not _names_blockviz(proc):
            return None
    except (psutil.NoSuchProcess, ValueError):
        return None
    except psutil.AccessDenied:
        # Exists but belongs to someone else: alive, though not ours to signal.
        return None if started is not None else proc
    return proc


def _names_blockviz(proc: psutil.Process) -> bool:
    """Whether a process's command line names blockviz (runs recorded without a start time)."""
    try:
        return any("blockviz" in part for part in proc.cmdline())
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return True  # cannot tell; a pid that exists is taken at its word, as before
    except psutil.NoSuchProcess:
        return False


def is_alive(pid: int | None, started: float | None) -> bool:
    """Whether the run's own process (pid and start time) is still running here."""
    return _process(pid, started) is not None


def signal_own(pid: int | None, started: float | None, signum: int = signal.SIGTERM) -> bool:
    """Send `signum` to the run's own process; False (nothing sent) if it is not there.

    psutil checks the process's start time again just before signalling, so a pid
    reused between the check and the signal is not hit either.
    """
    proc = _process(pid, started)
    if proc is None:
        return False
    try:
        proc.send_signal(signum)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return True


# ---------------------------------------------------------------------------- the machine


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
