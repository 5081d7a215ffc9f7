"""Run tags and notes: what a tag may hold, how a typed list is read, how long notes may be.

Tags label runs for filtering (Runs, Compare) and mark the dashboard's own runs
(`AUTO_TAG`: the Playground's auto-runs, hidden from the Runs list by default). Notes are
free plain text about a run. Both are user-supplied, so both are bounded and shown as
plain text only. One rule for the dashboard, the CLI and the store.
"""

from __future__ import annotations

from collections.abc import Iterable

TAG_MAX = 32  # characters per tag
TAGS_MAX = 16  # tags per run
NOTES_MAX = 4000  # characters of notes per run
TAG_EXTRA_CHARS = frozenset("-_.+=:")
AUTO_TAG = "auto"  # a run the Playground launched on its own


class TagError(ValueError):
    """A tag list or a note that cannot be stored; the message names the problem."""


def parse_tags(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """Tags from a comma-separated string or an iterable: stripped, deduplicated, checked.

    A tag is 1-32 letters, digits and `-_.+=:` (no spaces: commas separate tags). Order
    is kept; an empty string or None means no tags.
    """
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    tags: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise TagError(f"tag {part!r} is not text")
        tag = part.strip()
        if not tag:
            continue
        bad = sorted({c for c in tag if not (c.isalnum() or c in TAG_EXTRA_CHARS)})
        if bad:
            shown = ", ".join("a space" if c == " " else repr(c) for c in bad)
            raise TagError(
                f"tag {tag[:TAG_MAX]!r} holds {shown}; a tag is letters, digits and "
                "-_.+=: (commas separate tags)"
            )
        if len(tag) > TAG_MAX:
            raise TagError(f"tag {tag[:TAG_MAX]!r}... is longer than {TAG_MAX} characters")
        if tag not in tags:
            tags.append(tag)
    if len(tags) > TAGS_MAX:
        raise TagError(f"{len(tags)} tags given; a run holds at most {TAGS_MAX}")
    return tuple(tags)


def clean_notes(text: str | None) -> str:
    """Notes as stored: control characters other than newline and tab dropped, bounded."""
    if text is None:
        return ""
    if not isinstance(text, str):
        raise TagError("notes must be text")
    kept = "".join(c for c in text if c in "\n\t" or c.isprintable())
    kept = kept.strip()
    if len(kept) > NOTES_MAX:
        raise TagError(f"notes are {len(kept):,} characters; at most {NOTES_MAX:,} are kept")
    return kept


def tags_text(tags: Iterable[str] | None) -> str:
    """Tags as one comma-separated string (the Runs table, the report)."""
    return ", ".join(tags or ())
