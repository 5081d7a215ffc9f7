"""`patiently`: a lifecycle write waits out a locked store or a silent server, and says which."""

from __future__ import annotations

import logging

import pytest

from blockviz.store import StoreLocked, StoreUnreachable
from blockviz.training import lifecycle


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (StoreUnreachable("x"), "the run store's server does not answer"),
        (StoreLocked("x"), "the run store is locked by another process"),
    ],
)
def test_a_write_that_waits_says_what_it_waits_for(error, said, monkeypatch, caplog):
    """A PostgreSQL outage was logged as "locked by another process"."""
    monkeypatch.setattr(lifecycle.time, "sleep", lambda seconds: None)
    calls = []

    def write() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise error
        return "done"

    with caplog.at_level(logging.WARNING, logger=lifecycle.__name__):
        assert lifecycle.patiently(write) == "done"
    assert [r.getMessage() for r in caplog.records] == [f"{said}; waiting to write"]
