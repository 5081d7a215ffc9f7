"""Command-line flags generated from the config dataclasses, and reading a config file.

Torch-free: the CLI and the `train` command (training side) both build configs this way.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, NoReturn

from blockviz.core import config as cfg
from blockviz.core.corpora import DataError, read_regular_file

EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command line or input: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the problem, then exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def add_config_flags(parser: argparse.ArgumentParser, sections: Sequence[str]) -> None:
    """One `--field` flag per field of the named config sections (values parsed later)."""
    for section in sections:
        cls = cfg.SECTIONS[section]
        group = parser.add_argument_group(f"{section} config")
        defaults = cls()
        for f in fields(cls):
            default = getattr(defaults, f.name)
            shown = "auto" if default is None else default
            group.add_argument(
                f"--{f.name}",
                dest=f"cfg_{f.name}",
                metavar=type(shown).__name__.upper() if shown != "auto" else "AUTO|BOOL",
                default=None,
                help=f"default {shown}",
            )


def config_overrides(args: argparse.Namespace, sections: Sequence[str]) -> dict[str, Any]:
    """The config fields given on the command line, coerced to their types."""
    overrides: dict[str, Any] = {}
    for section in sections:
        for name, annotation in cfg.field_types(cfg.SECTIONS[section]).items():
            text = getattr(args, f"cfg_{name}", None)
            if text is not None:
                overrides[name] = cfg.coerce(name, text, annotation)
    return overrides


# A RunConfig is about 1 KB of JSON; anything much larger is not one.
MAX_CONFIG_BYTES = 1024 * 1024


def read_config_file(path: str) -> cfg.RunConfig:
    """The RunConfig in a JSON file; UsageError naming the file when it cannot be one."""
    try:
        data = read_regular_file(
            path,
            f"--config {path}",
            MAX_CONFIG_BYTES,
            want="a RunConfig JSON file",
            advice="a RunConfig is about 1 KB of JSON",
        )
        text = data.decode("utf-8")
    except DataError as exc:
        raise UsageError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"--config {path}: byte offset {exc.start} is not UTF-8; a config is JSON text"
        ) from None
    try:
        return cfg.RunConfig.from_json(text)
    except cfg.ConfigError as exc:
        raise UsageError(f"--config {path}: {exc}") from None


def run_config_from_args(args: argparse.Namespace) -> cfg.RunConfig:
    """Preset or --config file, then field flags on top; validated."""
    base = cfg.preset(args.preset) if getattr(args, "preset", None) else cfg.RunConfig()
    config_path = getattr(args, "config", None)
    if config_path:
        base = read_config_file(config_path)
    overrides = config_overrides(args, list(cfg.SECTIONS))
    return cfg.replace(base, **overrides).validate() if overrides else base.validate()
