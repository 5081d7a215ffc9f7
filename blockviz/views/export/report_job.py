"""A report built in a download's worker thread, and the progress a page polls meanwhile.

A download whose data is a callable builds only when clicked, in a thread of its own; the
page learns of the click from the button's callback and polls the job until the build
ends. The two sides may come in either order (the build can start before the callback has
run), so a job counts requests, starts and finishes rather than holding one flag. A request
whose build never started (the browser dropped the download) stops counting as building
after `stall_s`, so the page does not poll forever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

STALL_S = 120.0  # a requested build that never started is given up after this
Progress = Callable[[float, str], None]  # (fraction done, what it is doing)


@dataclass(frozen=True)
class JobStatus:
    """One consistent reading of a report job."""

    building: bool
    fraction: float  # of the build in progress or the last one, in [0, 1]
    message: str
    error: str  # why the last build failed; "" when it did not
    size: int  # bytes of the last build that succeeded; 0 before one did
    run_ids: tuple[int, ...]  # the runs of the last build started


class ReportJob:
    """The state a page and its download's worker thread share; every method is thread-safe."""

    def __init__(
        self, stall_s: float = STALL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._lock = threading.Lock()
        self._stall_s = stall_s
        self._clock = clock
        self._requested = 0
        self._started = 0
        self._finished = 0
        self._requested_at = 0.0
        self._fraction = 0.0
        self._message = ""
        self._error = ""
        self._size = 0
        self._run_ids: tuple[int, ...] = ()
        self._data: bytes | None = None  # the last build that succeeded

    def request(self) -> None:
        """The download was clicked (its button's on_click callback)."""
        with self._lock:
            self._requested += 1
            self._requested_at = self._clock()

    def _progress(self, fraction: float, message: str = "") -> None:
        with self._lock:
            self._fraction = min(max(float(fraction), 0.0), 1.0)
            self._message = str(message)

    def builder(
        self, build: Callable[[Progress], bytes], run_ids: Sequence[int]
    ) -> Callable[[], bytes]:
        """The download's data callable: runs `build(progress)`, recording how it goes.

        An error in the build is recorded (the page shows it) and raised again, so the
        download fails instead of saving a broken file.
        """
        wanted = tuple(int(i) for i in run_ids)

        def run() -> bytes:
            with self._lock:
                self._started += 1
                self._fraction, self._message, self._error, self._size = 0.0, "starting", "", 0
                self._run_ids = wanted
            data: bytes | None = None
            error = ""
            try:
                data = build(self._progress)
                return data
            except Exception as exc:
                error = str(exc) or type(exc).__name__
                raise
            finally:
                with self._lock:
                    # Size and finish together: a poller that sees the build done sees
                    # its size (or its error).
                    self._error = error
                    self._size = 0 if data is None else len(data)
                    self._data = data
                    self._finished += 1

        return run

    def result(self, run_ids: Sequence[int]) -> bytes | None:
        """The bytes of the last successful build, when it was of these runs."""
        with self._lock:
            if self._data is None or self._run_ids != tuple(int(i) for i in run_ids):
                return None
            return self._data

    def _building(self) -> bool:
        pending = max(self._requested, self._started) > self._finished
        stalled = (
            self._started < self._requested and self._clock() - self._requested_at > self._stall_s
        )
        return pending and not stalled

    def building(self) -> bool:
        """Whether a build is requested or running (and has not stalled)."""
        with self._lock:
            return self._building()

    def status(self) -> JobStatus:
        """Everything the page shows, read at one instant."""
        with self._lock:
            return JobStatus(
                building=self._building(),
                fraction=self._fraction,
                message=self._message,
                error=self._error,
                size=self._size,
                run_ids=self._run_ids,
            )
