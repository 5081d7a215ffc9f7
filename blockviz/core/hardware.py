"""How many runs train at once here, and how many CPU threads each one takes (torch-free).

A run's share of the machine is the cores divided by the run slots, so that when every
slot is busy the threads add up to the cores and no run's threads wait on another's. On
a CPU-only machine each core is a slot, so a run takes one thread: torch's CPU kernels
spin while they wait for a thread that the scheduler gave to another process, and on a
2-core box a quick-size run with 2 threads beside a second run trained 12x slower than
with 1 (BENCHMARKS.md, "Studies that answer"). With GPUs, each visible GPU is a slot and its run
takes an equal share of the cores for the work around it.
"""

from __future__ import annotations

import functools
import os
import subprocess

MAX_THREADS = 1024  # `--threads` bound: more than any machine this runs on has cores
ENV_SLOTS = "BLOCKVIZ_MAX_RUNNING"


def cpu_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS says; at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


@functools.cache
def visible_gpus() -> int:
    """GPUs a run here could use: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=3, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in listing.splitlines() if line.startswith("GPU")])


def hardware_slots() -> int:
    """One slot per visible GPU, else one per CPU core."""
    return visible_gpus() or cpu_cores()


def _configured_slots() -> int | None:
    """$BLOCKVIZ_MAX_RUNNING when it is a positive whole number, else None."""
    configured = os.environ.get(ENV_SLOTS, "").strip()
    return int(configured) if configured.isdigit() and int(configured) > 0 else None


def default_slots() -> int:
    """How many runs may train at once: $BLOCKVIZ_MAX_RUNNING, else `hardware_slots()`."""
    return _configured_slots() or hardware_slots()


def slots_source() -> str:
    """Where `default_slots()` came from: `BLOCKVIZ_MAX_RUNNING=3`, `one per GPU: ...`."""
    configured = _configured_slots()
    if configured:
        return f"{ENV_SLOTS}={configured}"
    gpus = visible_gpus()
    if gpus:
        return f"one per GPU: this machine has {gpus}"
    return f"one per CPU core: this machine has {cpu_cores()}"


def share_of_cores(slots: int) -> int:
    """A run's CPU threads when `slots` runs may train at once: cores ÷ slots, at least 1."""
    return max(1, cpu_cores() // max(1, int(slots)))


def default_threads(max_running: int = 0) -> int:
    """Threads for a run started with `--max_running` (0: no limit, so the default slots)."""
    return share_of_cores(max_running if max_running > 0 else default_slots())


def threads_text(threads: int) -> str:
    """`1 thread`, `4 threads`: how `show` and the time estimates name a run's share."""
    return f"{threads} thread" if threads == 1 else f"{threads} threads"
