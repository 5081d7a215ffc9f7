"""Command-line flags generated from the config dataclasses, reading a config file, and
a config's errors and adjustments in the words of the flags the user typed.

Torch-free: the CLI and the `train` command (training side) both build configs this way.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from blockviz.core import config as cfg
from blockviz.core import hardware, replicas
from blockviz.core.config import BOUNDS
from blockviz.core.corpora import read_regular_file
from blockviz.core.fields import ConfigError, ConfigField
from blockviz.core.requests import ConfigSource
from blockviz.core.vocab import DataError

EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command line or input: printed as one line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the problem, then exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# Where the config flags' --help sends the reader for the rules between fields and the
# model's wiring (each flag's own help says what its field does, its values and default).
CONFIG_GROUP_NOTE = "the rules between fields and how a block is wired: docs/config-guide.md"


def flag_metavar_and_help(spec: ConfigField) -> tuple[str, str]:
    """The metavar and help of one config flag: what the field does (the registry's
    help), its choices or range, its default."""
    kind, default = spec.kind, spec.default
    shown_default = (
        "auto" if default is None else str(default).lower() if kind == "bool" else default
    )
    metavar = {
        "select": "{" + ",".join(spec.choices) + "}",
        "bool": "{true,false}",
        "tristate": "{auto,true,false}",
        "int": "INT",
        "float": "FLOAT",
    }.get(kind, "NAME|PATH" if spec.name == "dataset" else "STR")
    # argparse formats help with %-style: a literal % must be doubled.
    text = f"{spec.help} Takes {spec.allowed()} (default: {shown_default})."
    return metavar, text.replace("%", "%%")


def add_config_flags(parser: argparse.ArgumentParser, sections: Sequence[str]) -> None:
    """One `--field` flag per field of the named config sections (values parsed later).

    The help of each says what the field does, its choices or range, and its default; the
    values are still parsed by `config_overrides`, so a bad one gets the field's message.
    """
    for section in sections:
        group = parser.add_argument_group(f"{section} config", CONFIG_GROUP_NOTE)
        for spec in cfg.FIELDS.values():
            if spec.section == section:
                metavar, help_text = flag_metavar_and_help(spec)
                group.add_argument(
                    spec.flag,
                    dest=f"cfg_{spec.name}",
                    metavar=metavar,
                    default=None,
                    help=help_text,
                )


def given_fields(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The config field flags given on the command line, as (field, text) pairs."""
    given = []
    for section in cfg.SECTIONS.values():
        for name in cfg.field_types(section):
            text = getattr(args, f"cfg_{name}", None)
            if text is not None:
                given.append((name, text))
    return tuple(given)


def coerce_fields(fields: Iterable[tuple[str, str]], sections: Sequence[str]) -> dict[str, Any]:
    """Field texts (`given_fields`) of the named sections, coerced to their types."""
    texts = dict(fields)
    overrides: dict[str, Any] = {}
    for section in sections:
        for name, annotation in cfg.field_types(cfg.SECTIONS[section]).items():
            if texts.get(name) is not None:
                overrides[name] = cfg.coerce(name, texts[name], annotation)
    return overrides


def config_overrides(args: argparse.Namespace, sections: Sequence[str]) -> dict[str, Any]:
    """The config fields given on the command line, coerced to their types."""
    return coerce_fields(given_fields(args), sections)


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
    except ConfigError as exc:
        raise UsageError(f"--config {path}: {exc}") from None


def _base_config(source: ConfigSource) -> cfg.RunConfig:
    """The config the field flags go on top of: the config file, else the preset, else
    the defaults."""
    if source.file:
        return read_config_file(source.file)
    return cfg.preset(source.preset) if source.preset else cfg.RunConfig()


def build_config(source: ConfigSource) -> cfg.RunConfig:
    """Preset or config file, then field flags on top; validated."""
    base = _base_config(source)
    overrides = coerce_fields(source.fields, list(cfg.SECTIONS))
    return cfg.replace(base, **overrides).validate() if overrides else base.validate()


def fit_warmup(source: ConfigSource) -> tuple[ConfigSource, str | None]:
    """A typed `--max_steps` shorter than the warm-up the user did not type (the preset's,
    the file's or the default): the warm-up scaled to the same share of the run, added as
    if typed, and a note saying so; else the source as it is and None."""
    typed = dict(source.fields)
    if "max_steps" not in typed or "warmup_steps" in typed:
        return source, None
    max_steps = cfg.coerce("max_steps", typed["max_steps"], int)
    base = _base_config(source).train
    if not BOUNDS["max_steps"].contains(max_steps) or base.warmup_steps <= max_steps:
        return source, None
    scaled = base.warmup_steps * max_steps // max(base.max_steps, base.warmup_steps)
    origin = (
        f"--config {source.file}"
        if source.file
        else f"the preset {source.preset}"
        if source.preset
        else "the defaults"
    )
    note = (
        f"--max_steps {max_steps} is shorter than the warm-up of {origin} "
        f"({base.warmup_steps} of {base.max_steps} steps): warm-up scaled to {scaled} steps, "
        "the same share of the run; --warmup_steps sets another"
    )
    fields = (*source.fields, ("warmup_steps", str(scaled)))
    return dataclasses.replace(source, fields=fields), note


def flag_message(exc: ConfigError, args: argparse.Namespace) -> str:
    """A config field's error in the command line's words: named by its flag when the
    user typed it; else saying which flag sets the field."""
    text = str(exc)
    if not hasattr(args, f"cfg_{exc.field}"):
        return text  # not a field this command takes as a flag
    if getattr(args, f"cfg_{exc.field}") is None:
        return f"{text} ({exc.field} was not given as a flag: --{exc.field} sets it)"
    if text.startswith(f"--{exc.field}"):
        return text  # the message names the flag already
    return f"--{text}" if text.startswith(f"{exc.field}:") else f"--{exc.field}: {text}"


def config_source(args: argparse.Namespace) -> ConfigSource:
    """A command's `--preset`, `--config` and field flags, as given."""
    return ConfigSource(
        preset=getattr(args, "preset", None),
        file=getattr(args, "config", None),
        fields=given_fields(args),
    )


def run_config_from_args(args: argparse.Namespace) -> cfg.RunConfig:
    """Preset or --config file, then field flags on top; validated."""
    return build_config(config_source(args))


def threads_arg(p: argparse.ArgumentParser) -> None:
    """`--threads N`: the CPU threads each run takes (default: its share of the cores)."""
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="INT",
        help="CPU threads each run takes (default: the cores ÷ the runs allowed at once, "
        f"at least 1; at most {hardware.MAX_THREADS})",
    )


def replicas_arg(p: argparse.ArgumentParser) -> None:
    """`--replicas K|auto|off`: the most runs one batched model trains at once."""
    p.add_argument(
        "--replicas",
        default=str(replicas.DEFAULT_REPLICAS),
        metavar="K|auto|off",
        help="the most runs that share every shape train as replicas of one batched model "
        f"(default {replicas.DEFAULT_REPLICAS}: {replicas.GPU_REPLICAS} where the process "
        f"that trains sees a GPU, else {replicas.CPU_REPLICAS}; off: each run alone)",
    )


def replicas_from_args(args: argparse.Namespace) -> int:
    """`--replicas` as a number (off: 1); UsageError naming a bad value."""
    try:
        return replicas.parse_replicas(getattr(args, "replicas", None) or "off")
    except ValueError as exc:
        raise UsageError(f"--replicas: {exc}") from None


def check_threads(threads: int | None) -> None:
    """UsageError unless `--threads` is absent or in [1, MAX_THREADS]."""
    if threads is not None and not 1 <= threads <= hardware.MAX_THREADS:
        raise UsageError(
            f"--threads: {threads} is not allowed; must be an integer from 1 to "
            f"{hardware.MAX_THREADS}"
        )
