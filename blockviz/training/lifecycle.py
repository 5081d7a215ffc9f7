"""What keeps a training process in touch with its run: stop signals, heartbeat, patience.

`StopRequest` turns SIGTERM / Ctrl-C into "stop after this step", `Heartbeat` tells the
store the process is alive (and flushes it), `patiently` retries a lifecycle write while
another process holds the store's lock, and `global_rank_from_env` says whether this
process is the one that records the run (global rank 0) before any Trainer exists.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any

from blockviz.store import RunStore, StoreError, StoreLocked, StoreUnreachable

HEARTBEAT_S = 2.0
# How long a lifecycle write (status, start, end) keeps retrying a locked store before
# the run gives up; its metric rows meanwhile wait in memory (RunStore.defer_when_busy).
LIFECYCLE_PATIENCE_S = 600.0

log = logging.getLogger(__name__)


class StopRequest:
    """SIGTERM / SIGINT handlers that ask the run to stop after the current step.

    Outside `Trainer.fit` this flag is all there is; during fit Lightning chains its own
    SIGTERM handler in front of ours and stops the loop itself. Ctrl-C takes the same path
    as SIGTERM instead of Lightning's KeyboardInterrupt exit (status 1, no checkpoint).
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        """Install the handlers (main thread only; elsewhere signals cannot be caught)."""
        if threading.current_thread() is threading.main_thread():
            for signum, handler in (
                (signal.SIGTERM, self._on_sigterm),
                (signal.SIGINT, self._on_sigint),
            ):
                self._previous[signum] = signal.getsignal(signum)
                signal.signal(signum, handler)
        return self

    def __exit__(self, *exc: object) -> None:
        """Restore the handlers that were there before."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        # A stop request installed around this one (`train --seeds` around each batch) is
        # told too, so the command stops rather than going on to its next batch.
        outer = self._previous.get(signal.SIGTERM)
        if isinstance(getattr(outer, "__self__", None), StopRequest):
            outer(signum, frame)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        # Whatever handles SIGTERM right now (ours, or Lightning's chain during fit).
        handler = signal.getsignal(signal.SIGTERM)
        if callable(handler):
            handler(signal.SIGTERM, frame)
        else:
            self.requested = True


class Heartbeat:
    """A daemon thread that beats the run's heartbeat (and so flushes the store) every few s.

    A Stop asked through the store (`RunStore.request_stop`: from a machine that cannot
    signal this process) comes back with a beat; the thread then sends this process the
    SIGTERM a local Stop sends, so the run stops the same way: after its step, with a
    checkpoint.
    """

    def __init__(self, store: RunStore, run_id: int) -> None:
        self.store = store
        self.run_id = run_id
        self.step = 0
        self._stop = threading.Event()
        self._signalled = False
        self._thread = threading.Thread(target=self._loop, name="blockviz-heartbeat", daemon=True)

    def start(self) -> None:
        """Beat now and then every interval."""
        self.store.heartbeat(self.run_id, self.step)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (waits for the thread)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.store.heartbeat(self.run_id, self.step)
            except StoreError as exc:  # a busy store must not kill training; try again
                log.warning("heartbeat failed: %s", exc)
            if self.store.stop_requested(self.run_id) and not self._signalled:
                self._signalled = True
                log.warning("a stop was requested through the store; stopping after this step")
                os.kill(os.getpid(), signal.SIGTERM)


def patiently(action: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a store write, retrying while another process holds the store's lock."""
    waiting_since: float | None = None
    while True:
        try:
            return action(*args, **kwargs)
        except StoreLocked as exc:
            now = time.monotonic()
            if waiting_since is None:
                waiting_since = now
                why = (
                    "the run store's server does not answer"
                    if isinstance(exc, StoreUnreachable)
                    else "the run store is locked by another process"
                )
                log.warning("%s; waiting to write", why)
            elif now - waiting_since > LIFECYCLE_PATIENCE_S:
                raise
            time.sleep(0.5)


def global_rank_from_env() -> int:
    """This process's global rank as the launcher set it (0 when launched by a person).

    Read from the environment because Lightning 2.6 has no way to learn it before the
    Trainer exists: `rank_zero_only.rank` is guessed at import from RANK / LOCAL_RANK /
    SLURM_PROCID alone, and `LightningEnvironment.global_rank()` is 0 until the strategy
    sets it during fit. Both say 0 for the process a person starts on node 1 of a
    multi-node run (NODE_RANK=1, no LOCAL_RANK), which would then write the store too.
    """
    for key in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    # Lightning's own launcher sets only LOCAL_RANK (and NODE_RANK) for the ranks it starts.
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    node = int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0")) or 0)
    return 0 if local == 0 and node == 0 else max(1, local)
