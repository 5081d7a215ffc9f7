"""The command line is read once, at the edge, into frozen requests: the training side
never sees an `argparse.Namespace`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from blockviz.cli import build_parser
from blockviz.cli.requests import fork_request, train_request
from blockviz.core.flags import UsageError, build_config

ROOT = Path(__file__).resolve().parents[2] / "blockviz"


def test_train_flags_become_one_frozen_request():
    args = build_parser().parse_args(
        ["train", "--preset", "tiny", "--lr", "3e-3", "--seeds", "0-2", "--replicas", "2",
         "--store", "s.db", "--max_running", "1", "--threads", "2", "--no_progress"]
    )  # fmt: skip
    request = train_request(args)
    assert request.seeds == (0, 1, 2) and request.replicas == 2
    assert (request.session.store, request.session.max_running) == ("s.db", 1)
    assert (request.session.threads, request.session.progress) == (2, False)
    assert request.source.fields == (("lr", "3e-3"),)
    assert build_config(request.source).train.lr == 3e-3
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.name = "changed"  # type: ignore[misc]


def test_a_fork_request_keeps_the_field_texts_it_was_given():
    args = build_parser().parse_args(["fork", "run-a", "--step", "20", "--dropout", "0.2"])
    request = fork_request(args)
    assert (request.run, request.step, request.fields) == ("run-a", 20, (("dropout", "0.2"),))


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["train", "--max_running", "-1"], "--max_running"),
        (["train", "--threads", "0"], "--threads"),
        (["train", "--seeds", "0,1", "--run_id", "3"], "--seeds cannot be combined"),
    ],
)
def test_bad_flags_are_refused_while_reading_them(argv, words):
    with pytest.raises(UsageError, match=words):
        train_request(build_parser().parse_args(argv))


def test_nothing_past_the_command_line_takes_its_parsed_flags():
    # The flag-to-config converter (core/flags.py) builds the parser's flags; the rest of
    # the package reads requests (training), or nothing of the command line at all.
    for package in ("training", "launch", "core", "store"):
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "core" / "flags.py":
                continue
            assert "argparse" not in path.read_text(encoding="utf-8"), path
