"""Run names in the sidebar: the suggestion (core.naming) and the check before launch."""

from __future__ import annotations

from blockviz.core.config import RunConfig
from blockviz.core.naming import run_name, sanitize_name
from blockviz.store import StoreError, check_name


def suggest_name(preset_name: str, run_config: RunConfig) -> str:
    """The name the sidebar suggests: the one `blockviz train` would give (core.naming)."""
    return run_name(run_config, preset_name)


def checked_name(typed: str) -> tuple[str, str | None]:
    """The sanitised run name and, when it cannot be used (a bare number), why not."""
    try:
        return check_name(typed), None
    except StoreError as exc:
        return sanitize_name(typed), str(exc)
