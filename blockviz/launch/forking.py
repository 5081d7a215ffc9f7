"""Fork and Replay from the dashboard: `python -m blockviz fork|replay` in the background.

The new run registers itself (its id is only known once it has), so the process logs into
its parent's folder (forks.log) and a startup watch turns an early refusal (a field that
changes the parameters, a step not kept) into a LaunchError carrying the log's last line.
The watch ends as soon as the twin's row appears (the process registers it under its own
pid, after every refusal the plan can make), so the page can name and link it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from blockviz.launch.runner import LaunchError, spawn_logged
from blockviz.store import RunStore

FORK_LOG = "forks.log"
# How long a start waits for the twin to register (imports, data, checkpoint read: every
# refusal comes from the plan, before that); past this it returns without the twin's id,
# and the run appears in the picker when it registers.
REGISTER_WAIT_S = 30.0
POLL_S = 0.1
TAIL_BYTES = 16_384  # of forks.log read back for a refusal


def fork_command(store: RunStore, run_id: int, step: int, changes: Mapping[str, Any]) -> list[str]:
    """`python -m blockviz fork RUN --step N --FIELD VALUE ...` for this store."""
    flags = [item for field, value in changes.items() for item in (f"--{field}", str(value))]
    return [
        *(sys.executable, "-m", "blockviz", "fork", str(run_id), "--step", str(step)),
        *("--store", store.location.text, "--no_progress", *flags),
    ]


def replay_command(store: RunStore, run_id: int, around: int) -> list[str]:
    """`python -m blockviz replay RUN --around STEP` for this store."""
    return [
        *(sys.executable, "-m", "blockviz", "replay", str(run_id), "--around", str(around)),
        *("--store", store.location.text, "--no_progress"),
    ]


def start(store: RunStore, run_id: int, command: list[str]) -> int | None:
    """Run `command` detached, logging into the parent's forks.log; the twin's run id once
    its process registered it (None if it had not within REGISTER_WAIT_S). LaunchError
    when it exits with an error first (the log's last line says why)."""
    log_path = store.run_dir(run_id) / FORK_LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start_at = log_path.stat().st_size if log_path.exists() else 0
    try:
        proc = spawn_logged(command, log_path)
    except OSError as exc:
        raise LaunchError(f"could not start {command[3]} ({exc.strerror or exc})") from None
    began = time.monotonic()
    twin = None
    while proc.poll() is None and twin is None:
        if time.monotonic() - began > REGISTER_WAIT_S:
            return None
        twin = registered_twin(store, run_id, proc.pid)
        time.sleep(POLL_S)
    code = proc.poll()
    if code:
        with open(log_path, "rb") as log:  # this start's lines only, and not too many
            log.seek(max(start_at, log_path.stat().st_size - TAIL_BYTES))
            text = log.read(TAIL_BYTES).decode("utf-8", "replace")
        last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
        raise LaunchError(last or f"{command[3]} exited with status {code}", None, text[-4000:])
    return twin if twin is not None else registered_twin(store, run_id, proc.pid)


def registered_twin(store: RunStore, run_id: int, pid: int) -> int | None:
    """The id of the fork or replay of `run_id` that process `pid` registered, if any."""
    return next((int(t.id) for t in store.twins_of(run_id) if t.pid == pid), None)


def last_refusal(store: RunStore, run_id: int) -> str | None:
    """The newest line of the parent's forks.log when it is a refusal (`... error: ...`):
    what a fork or replay said after the startup watch had ended; None otherwise."""
    path = store.run_dir(run_id) / FORK_LOG
    try:
        with open(path, "rb") as log:
            log.seek(max(0, path.stat().st_size - TAIL_BYTES))
            tail = log.read(TAIL_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines and ": error: " in lines[-1] else None
