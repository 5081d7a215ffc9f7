"""The sidebar's config as text: the URL query that shares it, and what differs from its preset.

Streamlit-free. A shared URL names the preset and only the fields that differ from it
(`?preset=baby-cpu&norm_position=post&lr=0.003`); each value is read by `config.coerce`,
the same code that reads a `--field` flag, and checked on its own (bounds, choices). A
value that cannot be read is left out with the field's usual message, so the field keeps
the preset's value. Rules between fields (n_head divides d_model) are the sidebar's to show.
An uploaded text cannot travel in a URL: the query carries every other field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blockviz.core import config
from blockviz.core.corpora import BUILTIN
from blockviz.core.fields import ConfigError, check_value
from blockviz.core.presets import DEFAULT_PRESET, PRESETS
from blockviz.dashboard.config_fields import ALL_FIELDS, UPLOAD_CHOICE

PRESET_PARAM = "preset"
NAME_PARAM = "name"  # only a typed run name travels; a suggested one follows the fields
FIELD_PARAMS = (*(spec.name for spec in ALL_FIELDS), "dataset")
PARAMS = (PRESET_PARAM, NAME_PARAM, *FIELD_PARAMS)  # every key this module reads or writes
MAX_NAME_CHARS = 200  # a run name is cut to 80 anyway; this only refuses nonsense
MAX_LISTED_CHANGES = 6  # the preset caption lists this many changes, then counts the rest
UPLOAD_NOTE = (
    "An uploaded text cannot travel in a URL: a link to this page carries every other "
    "field; whoever opens it uploads the text again."
)


def flat_values(run_config: config.RunConfig) -> dict[str, Any]:
    """{field: value} over the sections of a config (field names are unique across them)."""
    return {name: value for part in run_config.to_dict().values() for name, value in part.items()}


def value_text(value: Any) -> str:
    """A config value as the CLI would take it: true/false, auto, 0.003, post."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back to the same float
    return str(value)


def changes(preset: str, values: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, value, preset's value) for each field in `values` that differs from the preset."""
    base = flat_values(config.preset(preset))
    return [
        (name, values[name], base[name])
        for name in FIELD_PARAMS
        if name in values and values[name] != base[name]
    ]


def encode(preset: str, values: Mapping[str, Any], name: str | None = None) -> dict[str, str]:
    """The query for a config: its preset, the fields that differ from it, a typed name.

    `values` holds config values by field; `dataset` is a built-in corpus's name, or
    UPLOAD_CHOICE, which stays out (an upload cannot travel in a URL).
    """
    query = {PRESET_PARAM: preset}
    for field_name, value, _ in changes(preset, values):
        if field_name == "dataset" and value not in BUILTIN:
            continue
        query[field_name] = value_text(value)
    if name:
        query[NAME_PARAM] = name
    return query


@dataclass
class Decoded:
    """What a URL query asks for: a preset, fields over it, a name, and what was refused."""

    preset: str = DEFAULT_PRESET
    values: dict[str, Any] = field(default_factory=dict)  # config values by field
    name: str | None = None
    problems: list[str] = field(default_factory=list)  # one line each, naming the key


def _check_one(name: str, value: Any) -> None:
    """ConfigError unless one field's value is allowed on its own."""
    if name == "dataset":
        if value not in BUILTIN:
            raise ConfigError(
                name, value, "a link can name a built-in corpus: " + ", ".join(BUILTIN)
            )
        return
    check_value(config.FIELDS[name], value)


def _types() -> dict[str, Any]:
    types: dict[str, Any] = {}
    for cls in config.SECTIONS.values():
        types |= config.field_types(cls)
    return types


def decode(query: Mapping[str, str], start: str = DEFAULT_PRESET) -> Decoded:
    """Read a URL query into a preset (`start` when it names none) and field values; never
    raises."""
    decoded = Decoded(preset=start)
    preset = query.get(PRESET_PARAM)
    if preset is not None:
        if preset in PRESETS:
            decoded.preset = preset
        else:
            error = ConfigError(PRESET_PARAM, preset, "choose one of " + ", ".join(PRESETS))
            decoded.problems.append(f"{error}; using {start}")
    types = _types()
    for key, text in query.items():
        if key == PRESET_PARAM:
            continue
        if key == NAME_PARAM:
            if len(text) > MAX_NAME_CHARS:
                decoded.problems.append(
                    f"name: {len(text):,} characters is too long for a run name; "
                    "the name is suggested instead"
                )
            elif text.strip():
                decoded.name = text
            continue
        if key not in FIELD_PARAMS:
            shown = key if len(key) <= 40 else key[:40] + "…"
            decoded.problems.append(f"{shown!r} is not a config field; ignored")
            continue
        try:
            value = config.coerce(key, text, types[key])
            _check_one(key, value)
        except ConfigError as exc:
            decoded.problems.append(f"{exc}; {key} keeps the preset's value")
            continue
        decoded.values[key] = value
    return decoded


def _shown(name: str, value: Any) -> str:
    if name == "dataset" and value == UPLOAD_CHOICE:
        return "your upload"
    if isinstance(value, float):
        return f"{value:g}"
    return value_text(value)


def changes_caption(preset: str, values: Mapping[str, Any]) -> str:
    """'changed: d_model 64 (preset 128), lr 0.003 (preset 0.001)', or '' when none differ."""
    found = changes(preset, values)
    if not found:
        return ""
    listed = [
        f"{name} {_shown(name, new)} (preset {_shown(name, old)})"
        for name, new, old in found[:MAX_LISTED_CHANGES]
    ]
    more = len(found) - MAX_LISTED_CHANGES
    if more > 0:
        listed.append(f"and {more} more")
    return "changed: " + ", ".join(listed)
