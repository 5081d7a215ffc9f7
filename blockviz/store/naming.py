"""Why a bare number is not a run name (the name syntax itself is `blockviz.core.naming`)."""

from __future__ import annotations

from blockviz.core.naming import is_id_text, sanitize_name
from blockviz.store.errors import StoreError

RunRef = int | str  # a run given by its id or by its exact name


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
