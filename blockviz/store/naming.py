"""Run names: which characters a name may hold, and why a bare number is not a name."""

from __future__ import annotations

from blockviz.store.errors import StoreError

RunRef = int | str  # a run given by its id or by its exact name

NAME_MAX = 80
_NAME_EXTRA_CHARS = frozenset("-_.+= ")


def sanitize_name(name: str) -> str:
    """A run name made of letters, digits, `-_.+=` and single spaces, at most 80 chars."""
    spaced = " ".join(str(name).split())  # tabs, newlines and runs of spaces: one space
    kept = "".join(c if c.isalnum() or c in _NAME_EXTRA_CHARS else "-" for c in spaced)
    trimmed = kept[:NAME_MAX].strip(" -._")
    return trimmed or "run"


def is_id_text(text: str) -> bool:
    """Whether text names a run by id: ASCII digits only (`²` and `٣` are not ids)."""
    return text.isascii() and text.isdigit()


def check_name(name: str) -> str:
    """The sanitised name, or StoreError when it is a bare number (ids own those).

    `show 2` and `?run=2` mean run id 2, so a run named `2` could never be reached by
    its name; every way of naming a run (CLI, sidebar, rename) goes through here.
    """
    clean = sanitize_name(name)
    if is_id_text(clean):
        raise StoreError(
            f"run name {clean!r} is a bare number, which reads as a run id; "
            f"add a letter, e.g. 'run-{clean}'"
        )
    return clean
