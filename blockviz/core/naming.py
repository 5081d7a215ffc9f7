"""Run names: what characters a name may hold, and the one name suggested for a config.

The sidebar and `blockviz train` name a run the same way: the preset it starts from, or
the fields that differ from it ('post-ln-relu-6L'), architecture first. The store keeps
names unique (adding -2, -3) and refuses bare numbers, which read as run ids.
"""

from __future__ import annotations

from blockviz.core import config
from blockviz.core.config import RunConfig
from blockviz.core.inert import inert_fields
from blockviz.core.presets import DEFAULT_PRESET

NAME_MAX = 80
NAME_EXTRA_CHARS = frozenset("-_.+= ")
MAX_NAME_TOKENS = 5  # a longer difference is cut and says how many fields it left out


def sanitize_name(name: str) -> str:
    """A run name made of letters, digits, `-_.+=` and single spaces, at most 80 chars."""
    spaced = " ".join(str(name).split())  # tabs, newlines and runs of spaces: one space
    kept = "".join(c if c.isalnum() or c in NAME_EXTRA_CHARS else "-" for c in spaced)
    trimmed = kept[:NAME_MAX].strip(" -._")
    return trimmed or "run"


MAX_RUN_ID = 2**63 - 1  # SQLite's largest integer: no store holds a larger run id


def is_id_text(text: str) -> bool:
    """Whether text names a run by id: ASCII digits only (`²` and `٣` are not ids)."""
    return text.isascii() and text.isdigit()


def run_id_from_text(text: str) -> int | None:
    """The id (of a run, or a study) that text names; None for other text and for ids no
    store can hold.

    The length is checked before `int`, which refuses more than 4,300 digits and would
    give SQLite a number it cannot bind.
    """
    if not is_id_text(text):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(MAX_RUN_ID)):
        return None
    number = int(digits)
    return number if number <= MAX_RUN_ID else None


def shortened_id(text: str, keep: int = 24) -> str:
    """Id text cut to its first `keep` digits and its length, so a message stays one line."""
    return text if len(text) <= keep else f"{text[:keep]}… ({len(text):,} digits)"


def _field_order() -> dict[str, int]:
    """The fields with a name token first (what a name is mostly about), then the rest,
    each in the registry's order."""
    specs = config.FIELDS.values()
    names = [s.name for s in specs if s.token] + [s.name for s in specs if not s.token]
    return {name: index for index, name in enumerate(names)}


def run_name(run_config: RunConfig, preset: str | None = None) -> str:
    """The suggested name: the preset's name, or what differs from it, e.g. 'post-ln-relu-6L'.

    Without a preset the base is the default config ('baby-cpu'). The vocabulary size is
    left out: it follows the dataset, which names itself. So is a field that does nothing
    under the rest of the config (core.inert: Norm type with norm position none).
    """
    base_name = preset or DEFAULT_PRESET
    changed = config.diff(config.preset(base_name), run_config)
    changed.pop("vocab_size", None)
    for name in inert_fields(run_config):
        changed.pop(name, None)
    order = _field_order()
    tokens = [
        config.FIELDS[name].name_token(new)
        for name, (_, new) in sorted(changed.items(), key=lambda item: order[item[0]])
    ]
    if not tokens:
        return base_name
    shown = tokens[:MAX_NAME_TOKENS]
    if len(tokens) > MAX_NAME_TOKENS:
        shown.append(f"+{len(tokens) - MAX_NAME_TOKENS}")
    name = sanitize_name("-".join(shown))
    # An upload named 2024.txt: a bare number would read as a run id.
    return f"run-{name}" if is_id_text(name) else name
