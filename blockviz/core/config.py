"""Run configuration: `RunConfig` (model + train + data), the field registry, JSON, diff and
replace.

Every field is a plain value so a config is JSON on disk, a flag on the CLI and a widget in
the sidebar, and every field is declared once, with `fields.knob`, in its section's
dataclass (`config_model.ModelConfig`, `config_train.TrainConfig` and `DataConfig`): its
default, label, help, range or words, and the rules the rest of blockviz reads about it.
`FIELDS` is that registry, by name; `BOUNDS` its numeric ranges. `validate()` raises
`ConfigError` naming the field, the bad value and what is allowed. The named presets are
`core.presets` (`preset()` here builds one). Nothing here imports torch, so the UI can
validate on every keystroke.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field, fields
from typing import Any, get_args, get_origin, get_type_hints

from blockviz.core.bounds import Bound
from blockviz.core.config_model import ModelConfig
from blockviz.core.config_train import DataConfig, TrainConfig
from blockviz.core.fields import ConfigError, ConfigField, check_value, fields_of, is_int
from blockviz.core.presets import PRESETS


@dataclass
class RunConfig:
    """Everything a training run needs: model + train + data, saved as JSON with the run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def validate(self) -> RunConfig:
        """Validate all three parts and the rules that span them."""
        self.model.validate()
        self.train.validate()
        self.data.validate()
        if self.train.warmup_steps > self.train.max_steps:
            raise ConfigError(
                "warmup_steps",
                self.train.warmup_steps,
                f"must be <= max_steps={self.train.max_steps}",
            )
        return self

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict: {"model": {...}, "train": {...}, "data": {...}}."""
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        """JSON text that `from_json` turns back into an equal config."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Build from a nested dict; unknown sections or fields raise ConfigError."""
        if not isinstance(data, dict):
            raise ConfigError("config", type(data).__name__, "must be a JSON object")
        unknown = set(data) - {"model", "train", "data"}
        if unknown:
            raise ConfigError(sorted(unknown)[0], "?", "sections are model, train and data")
        parts = {}
        for section, section_cls in SECTIONS.items():
            values = data.get(section, {})
            if not isinstance(values, dict):
                raise ConfigError(section, values, "must be a JSON object of field: value")
            parts[section] = from_dict(section_cls, values)
        return cls(**parts)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        """Parse JSON text produced by `to_json` (or written by hand)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("config", text[:40], f"is not valid JSON ({exc.msg})") from None
        except RecursionError:
            # A config is three levels deep; thousands of brackets are never one.
            raise ConfigError(
                "config", text[:40], "nests too deeply to be a config (sections, fields, values)"
            ) from None
        except ValueError:
            # Python refuses to read an integer past sys.get_int_max_str_digits() digits.
            raise ConfigError(
                "config",
                text[:40],
                f"holds a number of more than {sys.get_int_max_str_digits():,} digits; "
                "no config field takes one",
            ) from None
        return cls.from_dict(data)


SECTIONS: dict[str, type] = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}
# Every config field, by name, in the sections' order and each section's declaration order.
FIELDS: dict[str, ConfigField] = {
    name: spec for cls in SECTIONS.values() for name, spec in fields_of(cls).items()
}
# Every numeric field's range: validate() enforces it, the sidebar's number widgets take
# their min and max from it, the CLI's --help and the generated docs quote it. The limits
# are generous for small character models on one machine or GPU box, yet keep every size a
# count or an estimate can loop over, or a tensor can be allocated for, finite.
BOUNDS: dict[str, Bound] = {
    name: spec.bound for name, spec in FIELDS.items() if spec.bound is not None
}


def check_int(name: str, value: Any) -> None:
    """ConfigError unless `value` is an integer within the field's bound (the registry's
    check, for a value outside a config)."""
    check_value(FIELDS[name], value)


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a config dataclass's fields, by name."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def coerce(name: str, text: str, annotation: Any) -> Any:
    """Turn a flag's text into the field's type, or raise ConfigError naming the field."""
    raw = text.strip()
    optional = get_origin(annotation) is not None and type(None) in get_args(annotation)
    if optional:
        if raw.lower() in ("auto", "none", "null"):
            return None
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if annotation is bool:
        lowered = raw.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ConfigError(name, text, "must be true or false")
    if annotation is int:
        allowed = "must be " + (
            BOUNDS[name].describe(integer=True) if name in BOUNDS else "an integer"
        )
        try:
            return int(raw)
        except ValueError:
            # Also digits past Python's int-from-text limit: far out of every range anyway.
            raise ConfigError(name, text, allowed) from None
    if annotation is float:
        try:
            # 1e999 reads as inf and "nan" as nan; validate() refuses both by name.
            return float(raw)
        except ValueError:
            raise ConfigError(name, text, "must be a number") from None
    return raw


def from_dict(cls: type, values: dict[str, Any]) -> Any:
    """Build one config dataclass from a dict, rejecting unknown fields by name."""
    if not isinstance(values, dict):
        raise ConfigError(cls.__name__, values, "must be a JSON object")
    types = field_types(cls)
    for name in values:
        if name not in types:
            raise ConfigError(name, values[name], f"is not a field of {cls.__name__}")
    kwargs = {}
    for name, value in values.items():
        # JSON has no int/float distinction for whole numbers: 1.0 is a fine lr.
        if types[name] is float and is_int(value) and abs(value) < 2**1023:
            value = float(value)  # a larger int stays one, for validate() to refuse
        kwargs[name] = value
    return cls(**kwargs)


def replace(config: RunConfig, **overrides: Any) -> RunConfig:
    """A copy of `config` with fields overridden by bare name (`n_layer=2, lr=3e-4`)."""
    parts = {key: dataclasses.asdict(getattr(config, key)) for key in SECTIONS}
    for name, value in overrides.items():
        section = section_of(name)
        parts[section][name] = value
    return RunConfig.from_dict(parts)


def section_of(name: str) -> str:
    """Which section (model / train / data) owns a field name."""
    for section, cls in SECTIONS.items():
        if name in field_types(cls):
            return section
    raise ConfigError(name, "?", "is not a config field")


def preset(name: str) -> RunConfig:
    """The RunConfig of a named preset."""
    if name not in PRESETS:
        raise ConfigError("preset", name, "choose one of " + ", ".join(PRESETS))
    return replace(RunConfig(), **PRESETS[name])


def diff(a: RunConfig, b: RunConfig) -> dict[str, tuple[Any, Any]]:
    """Fields whose values differ between two configs, by bare field name."""
    out: dict[str, tuple[Any, Any]] = {}
    da, db = a.to_dict(), b.to_dict()
    for section in SECTIONS:
        for name, value in da[section].items():
            if db[section][name] != value:
                out[name] = (value, db[section][name])
    return out
