"""How single values cross into SQLite and back: floats, JSON columns, `?` lists."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any


def real(value: Any) -> float | None:
    """A float for SQLite; NaN goes in as NULL by SQLite's own rule."""
    return None if value is None else float(value)


def convert_column(convert: Callable[[Any], Any], column: Sequence[Any]) -> list[Any]:
    """Apply a converter to a column; floats take the fast builtin unless a None is there."""
    if convert is real:
        try:
            return list(map(float, column))
        except TypeError:  # a None (missing value) among them
            pass
    return list(map(convert, column))


def encode_json(value: Any) -> str | None:
    """Dicts and lists become JSON text; objects with `to_json` use it; text passes."""
    if value is None or isinstance(value, str):
        return value
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    return json.dumps(value, sort_keys=True)


def decode_json(text: str | None) -> Any:
    """Parsed JSON, or None when the column is empty or not JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def placeholders(values: Sequence[Any]) -> str:
    """As many `?` as values, comma-separated, for an IN (...) list or a VALUES row."""
    return ", ".join("?" * len(values))
