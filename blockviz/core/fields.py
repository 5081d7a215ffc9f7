"""What one config field is: `ConfigField`, and `knob()`, which declares one.

Every field of the config dataclasses (`core.config`) is declared with `knob(default, ...)`:
its label, its one-paragraph help, its range or its words, and the rules other parts of
blockviz read about it — its token in run names, whether a fork or a resume may change
it, whether replicas may differ in it, how exported code spells it, where the sidebar
draws it. `config.FIELDS` collects them by name; the sidebar and Playground widgets, the
CLI flags and their `--help`, the generated docs, run naming, the URL state, code export,
and the fork, resume and replica rules all read that registry. `check_value` checks a value
against its field, `ConfigError` names what is wrong. Plain data: no torch, no Streamlit,
nothing else of blockviz but `bounds`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from blockviz.core.bounds import Bound

# What a fork may do with a field (`ConfigField.fork`).
FORK_OFFERED = "offered"  # Live's fork panel offers it; it keeps every parameter's shape
FORK_FREE = "free"  # a fork may change it, if the parameters keep their shapes
FORK_FIXED = "fixed"  # what the checkpoint is of: a fork never changes it

# Where the sidebar draws a field (`ConfigField.group`); None: no widget of its own.
ARCHITECTURE = "architecture"
TRAINING = "training"
ADVANCED = "advanced"  # the training fields under "Advanced"
DATA = "data"
OPS = "ops"  # the synthetic ops task's fields, shown with that dataset only
GROUPS = (ARCHITECTURE, TRAINING, ADVANCED, OPS, DATA)

_META = "blockviz.field"  # the dataclass field metadata key a knob's ConfigField sits under


@dataclass(frozen=True)
class ConfigField:
    """One config field: what it is, what it does, and what may change it.

    `name`, `section`, `annotation` and `default` are filled in from the dataclass that
    declares it (`declared`); the rest is what `knob()` was given.
    """

    label: str  # the widget's label
    help: str  # what it does, one paragraph (sources cited where a claim is the literature's)
    bound: Bound | None = None  # a number's range
    choices: tuple[str, ...] = ()  # the words a text field allows
    group: str | None = None  # where the sidebar draws it (GROUPS); None: no widget of its own
    step: float | None = None  # a number widget's step
    fmt: str | None = None  # a float widget's printf format
    token: Callable[[Any], str] | None = None  # its part of a suggested run name
    fork: str = FORK_FREE  # FORK_OFFERED | FORK_FREE | FORK_FIXED
    resume: bool = False  # a resumed run may change it (hardware and cadence, never the maths)
    per_replica: bool = False  # replicas of one batch may differ in it
    code: str | None = None  # the exported script's comment on its constant; None: not one
    allowed_text: str = ""  # what a text field allows, in words (its error and its --help)
    name: str = ""
    section: str = ""
    annotation: Any = None
    default: Any = None

    @property
    def optional(self) -> bool:
        """Whether None is a value (`auto`)."""
        return self.default is None

    @property
    def kind(self) -> str:
        """bool | tristate | select | int | float | text: how a widget and a flag read it."""
        if self.annotation is bool:
            return "tristate" if self.optional else "bool"
        if self.choices:
            return "select"
        if self.annotation is int:
            return "int"
        if self.annotation is float:
            return "float"
        return "text"

    @property
    def flag(self) -> str:
        """The command line's flag for it."""
        return f"--{self.name}"

    def allowed(self) -> str:
        """What values it takes, in words: 'one of pre, post, none', 'an integer in [1, 256]'."""
        kind = self.kind
        if kind == "select":
            return "one of " + ", ".join(self.choices)
        if kind == "bool":
            return "true or false"
        if kind == "tristate":
            return "auto, true or false"
        if kind in ("int", "float") and self.bound is not None:
            return self.bound.describe(integer=kind == "int")
        return self.allowed_text or "text"

    def name_token(self, value: Any) -> str:
        """Its part of a run name for `value`: its token, else `<field><value>`."""
        return self.token(value) if self.token else f"{self.name}{value}"


def knob(default: Any, label: str, help: str, **rules: Any) -> Any:
    """A config dataclass field with its default and its ConfigField (`rules`: the
    ConfigField's other attributes)."""
    meta = ConfigField(label=label, help=" ".join(help.split()), **rules)
    return dataclasses.field(default=default, metadata={_META: meta})


@functools.cache
def fields_of(cls: type) -> dict[str, ConfigField]:
    """The ConfigFields of one config dataclass (its `SECTION`), by name, in order."""
    hints = get_type_hints(cls)
    out: dict[str, ConfigField] = {}
    for item in dataclasses.fields(cls):
        meta = item.metadata.get(_META)
        if meta is None:
            raise TypeError(f"{cls.__name__}.{item.name} is not declared with knob()")
        annotation = hints[item.name]
        if item.default is None:  # `bool | None`: the type without None
            annotation = next(a for a in annotation.__args__ if a is not type(None))
        out[item.name] = dataclasses.replace(
            meta, name=item.name, section=cls.SECTION, annotation=annotation, default=item.default
        )
    return out


def _shown(value: Any) -> str:
    """repr(value) for a message, kept to one short line whatever the value is."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        # repr() of an int past 4300 digits raises; the size is what the user needs anyway
        return f"an integer of {math.floor(value.bit_length() * math.log10(2)) + 1:,} digits"
    text = repr(value)
    if len(text) > 80:
        return f"{text[:60]}… ({len(text):,} characters)"
    return text


class ConfigError(ValueError):
    """A config field holds a value that is not allowed; the message names all three."""

    def __init__(
        self, field_name: str, value: Any, allowed: str, message: str | None = None
    ) -> None:
        self.field = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(message or f"{field_name}: {_shown(value)} is not allowed; {allowed}")


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_value(spec: ConfigField, value: Any) -> None:
    """ConfigError unless `value` is one the field allows (its type, range or words)."""
    kind = spec.kind
    if kind == "tristate" and value is None:
        return
    if kind in ("bool", "tristate"):
        if not isinstance(value, bool):
            raise ConfigError(spec.name, value, "must be true or false")
    elif kind == "select":
        if value not in spec.choices:
            raise ConfigError(spec.name, value, "choose one of " + ", ".join(spec.choices))
    elif kind in ("int", "float"):
        integer = kind == "int"
        bound = spec.bound
        if not ((is_int(value) if integer else _is_number(value)) and bound.contains(value)):
            raise ConfigError(spec.name, value, "must be " + bound.describe(integer=integer))
    elif not isinstance(value, str) or not value.strip():
        raise ConfigError(spec.name, value, "name " + spec.allowed())


def check_fields(part: Any) -> None:
    """Check every field of one config section against its ConfigField, in order."""
    for name, spec in fields_of(type(part)).items():
        check_value(spec, getattr(part, name))


def number_in(name: str, value: Any, low: float, high: float) -> None:
    """A number in [low, high], for ranges that depend on another field."""
    if not (_is_number(value) and low <= value <= high):
        raise ConfigError(name, value, f"must be a number in [{low}, {high}]")
