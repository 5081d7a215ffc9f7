"""Commands as a user pastes them: `python -m blockviz WORDS [--store STORE]` (the CLI's
hints, `study show`'s re-run command and the Studies page's)."""

from __future__ import annotations

import shlex

from blockviz import CLI
from blockviz.store import RunStore, parse_location


def command_line(store: RunStore, *words: str) -> str:
    """`.venv/bin/python -m blockviz WORDS [--store STORE]` as one line a shell takes as
    printed: the store named unless it is the default one (its URL without a password),
    every word quoted where it needs to be."""
    parts = list(words)
    if store.location.text != parse_location(None).text:
        parts += ["--store", store.location.text]
    return " ".join([CLI, *map(shlex.quote, parts)])
