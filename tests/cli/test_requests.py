"""The command line is read once, at the edge, into frozen requests: the training side
never sees an `argparse.Namespace`."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blockviz import cli
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


def test_a_short_max_steps_scales_the_warm_up_it_did_not_type(capsys):
    """`train --preset baby-cpu --max_steps 10` was refused over the preset's 100 warm-up
    steps, a field the user never typed (issue 35)."""
    args = build_parser().parse_args(["train", "--preset", "baby-cpu", "--max_steps", "10"])
    config = build_config(train_request(args).source)
    assert (config.train.max_steps, config.train.warmup_steps) == (10, 0)
    note = capsys.readouterr().out
    assert "warm-up scaled to 0 steps" in note and "--warmup_steps" in note, note
    # A longer run keeps the preset's warm-up as it is, and says nothing.
    args = build_parser().parse_args(["train", "--preset", "tiny", "--max_steps", "40"])
    assert build_config(train_request(args).source).train.warmup_steps == 5
    assert capsys.readouterr().out == ""


def test_a_missing_dataset_is_refused_while_reading_the_flags():
    args = build_parser().parse_args(["train", "--dataset", "no-such-file.txt"])
    with pytest.raises(UsageError, match=r"^--dataset 'no-such-file\.txt' is neither"):
        train_request(args)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # typed: named by its flag
        (["--max_steps", "10", "--warmup_steps", "100"], "--warmup_steps: 100 is not allowed"),
        (["--lr", "abc"], "--lr: 'abc' is not allowed"),
        # not typed: the flag that sets it
        (["--lr", "1e-5"], "min_lr was not given as a flag: --min_lr sets it"),
    ],
)
def test_a_config_error_names_the_flag(argv, message, capsys):
    assert cli.main(["train", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bad_arguments_are_refused_before_torch_is_imported(tmp_path):
    """A missing dataset was reported 12-19 s after the command started, once torch and
    Lightning had loaded."""
    code = (
        "import sys\nfrom blockviz import cli\n"
        "status = cli.main(['train', '--dataset', 'missing.txt', '--max_steps', '10'])\n"
        "print(status, 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.stdout.splitlines()[-1] == "2 False", done.stderr
    assert "'missing.txt' is neither a built-in corpus" in done.stderr
