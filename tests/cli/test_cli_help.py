"""Every config flag's --help says what its field does (the registry's help), its type,
its choices or range, and its default."""

from __future__ import annotations

import argparse
import re

import pytest

from blockviz.cli import build_parser
from blockviz.core import config as cfg
from blockviz.core.config import BOUNDS
from blockviz.core.config_train import ACCELERATORS, PRECISIONS, STRATEGIES

# Which config sections each command takes flags for.
COMMAND_SECTIONS = {
    "train": list(cfg.SECTIONS),
    "params": ["model"],
    "data": ["data"],
    "init-grads": ["model", "data"],
}


def command_help(command: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The --help text of one command, one flag per line (a terminal wide enough for the
    longest help)."""
    monkeypatch.setenv("COLUMNS", "3000")
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    return subparsers.choices[command].format_help()


def flag_line(help_text: str, name: str) -> str:
    """The help line of `--name`."""
    match = re.search(rf"^\s+--{name} (\S+)\s+(.*)$", help_text, re.MULTILINE)
    assert match, f"--{name} is missing from the help"
    return match.group(0)


def expected_default(section: str, name: str) -> str:
    default = getattr(cfg.SECTIONS[section](), name)
    if default is None:
        return "auto"
    return str(default).lower() if isinstance(default, bool) else str(default)


@pytest.mark.parametrize("command", sorted(COMMAND_SECTIONS))
def test_every_config_flag_explains_its_field_and_shows_type_choices_and_default(
    command, monkeypatch
):
    help_text = command_help(command, monkeypatch)
    for section in COMMAND_SECTIONS[command]:
        for name, annotation in cfg.field_types(cfg.SECTIONS[section]).items():
            line = flag_line(help_text, name)
            spec = cfg.FIELDS[name]
            # what the field does, in a sentence from the registry (once `{true,false}` alone)
            assert spec.help.endswith(".") and spec.help in line, line
            assert f"(default: {expected_default(section, name)})" in line, line
            if spec.choices:
                for choice in spec.choices:
                    assert choice in line, (name, choice, line)
            elif annotation is int:
                assert "INT" in line and "an integer in [" in line, line
            elif annotation is float:
                assert "FLOAT" in line and "a number in " in line, line
            elif annotation is bool:
                assert "{true,false}" in line and "true or false" in line, line
            elif name == "final_norm":
                assert "{auto,true,false}" in line, line
            else:
                assert name == "dataset", f"{name}: no rule for its help"
                assert all(corpus in line for corpus in ("pydocs", "ops", "file")), line


@pytest.mark.parametrize("name", ["precision", "accelerator", "strategy"])
def test_auto_choice_flags_list_their_real_choices(name, monkeypatch):
    """These three once read `AUTO|BOOL`: their default is the word auto, not a bool."""
    line = flag_line(command_help("train", monkeypatch), name)
    assert "BOOL" not in line
    choices = {"precision": PRECISIONS, "accelerator": ACCELERATORS}.get(name, STRATEGIES)
    assert "{" + ",".join(choices) + "}" in line, line


def test_help_numbers_are_the_bounds_validation_enforces(monkeypatch):
    help_text = command_help("train", monkeypatch)
    for name, bound in BOUNDS.items():
        if f"--{name} " in help_text:
            line = flag_line(help_text, name)
            assert f"{bound.low}, {bound.high}" in line, line


def test_weight_decay_help_says_which_tensors_decay_in_the_sidebar_and_the_cli(monkeypatch):
    # As training.lit.param_groups builds the groups (tests/training/test_lit.py checks each
    # tensor):
    # embeddings are matrices too, yet only a tied one (the LM head's matrix) decays.
    from blockviz.dashboard.config_fields import SPECS

    line = flag_line(command_help("train", monkeypatch), "weight_decay")
    for text in (line, SPECS["weight_decay"].help):
        assert "Linear weight matrices only" in text
        assert "the token embedding is the LM head's matrix, so it decays too" in text
        assert "none on biases, norm gains (qk_norm's included) or the untied token" in text
    assert "a number in [0.0, 10.0] (default: 0.1)" in line


def _helps(parser, path="blockviz"):
    """(command path, --help text) of the parser and every command under it."""
    yield path, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _helps(sub, f"{path} {name}")


def test_no_help_shows_a_hidden_entry_and_study_work_is_documented(monkeypatch):
    """Python 3.11 listed `work      ==SUPPRESS==` under `study --help`, while README tells
    users to run `study work`."""
    monkeypatch.setenv("COLUMNS", "400")
    helps = dict(_helps(build_parser()))
    for path, text in helps.items():
        assert "SUPPRESS" not in text, path
    assert re.search(r"^\s+work\s+one worker", helps["blockviz study"], re.MULTILINE)
    assert "--store STORE" in helps["blockviz study work"]


def test_the_top_level_help_names_the_dashboard_and_the_docs(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    text = build_parser().format_help()
    for needle in ("make run", "make run PORT=", "docs/cli-guide.md", "docs/config-guide.md"):
        assert needle in text, needle


@pytest.mark.parametrize("command", sorted(COMMAND_SECTIONS))
def test_each_config_group_points_to_the_config_guide(command, monkeypatch):
    """A config flag's help says its type, range and default, not what the field does:
    its group's heading says where that is."""
    help_text = command_help(command, monkeypatch)
    for section in COMMAND_SECTIONS[command]:
        heading = re.search(rf"^{section} config:\n(.*)$", help_text, re.MULTILINE)
        assert heading and "docs/config-guide.md" in heading.group(1), (command, section)
