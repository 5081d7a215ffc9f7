"""A run's train.log: our log, Lightning's messages and Python warnings while it trains,
written to <run_dir>/train.log (and never a traceback to stderr when the disk is full).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

from blockviz.training.trainer import quiet_lightning, release_lightning_log

# "blockviz.training" covers every module of the package (lifecycle, logger, plan, ...).
_LOG_TARGETS = ("blockviz.training", "blockviz.store", "py.warnings")


class RunLogHandler(logging.FileHandler):
    """train.log; when it cannot be written (a full disk) it drops lines without a word.

    logging's default prints a traceback to stderr for every line it cannot write
    (hundreds on a full disk); the run's one-line outcome says what happened instead.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8")
        self.write_error: str | None = None

    def handleError(self, record: logging.LogRecord) -> None:
        """Remember the first error; print nothing."""
        if self.write_error is None:
            exc = sys.exc_info()[1]
            self.write_error = getattr(exc, "strerror", None) or str(exc) or "write failed"


def open_log(run_dir: Path) -> logging.Handler:
    """Route our log, Lightning's messages and Python warnings into <run_dir>/train.log."""
    handler = RunLogHandler(run_dir / "train.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    quiet_lightning(handler)
    logging.captureWarnings(True)
    for name in _LOG_TARGETS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return handler


def close_log(handler: logging.Handler) -> None:
    release_lightning_log(handler)
    for name in _LOG_TARGETS:
        logging.getLogger(name).removeHandler(handler)
    logging.captureWarnings(False)
    with contextlib.suppress(OSError):  # a full disk cannot take the last buffered lines
        handler.close()
