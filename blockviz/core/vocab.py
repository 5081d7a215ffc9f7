"""Character vocabularies, train/val splits and a dataset's fingerprint (torch-free)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence

from blockviz.core.bounds import MAX_VOCAB


class DataError(ValueError):
    """A dataset, file or download that cannot be used; the message says why and what to do."""


def check_vocab_size(text: str, label: str) -> int:
    """The number of distinct characters of `text`; DataError past MAX_VOCAB (10,000)."""
    size = len(set(text))
    if size > MAX_VOCAB:
        raise DataError(
            f"{label} has {size:,} distinct characters, more than the {MAX_VOCAB:,} a "
            "character vocabulary may hold; use text in fewer scripts, or replace rare "
            "symbols before training"
        )
    return size


class CharVocab:
    """Characters <-> integer ids; built from a whole corpus and saved with each run as JSON.

    `encode` is strict by default: a character the vocabulary has never seen raises
    DataError naming it. With `replace_unknown=True` each unseen character becomes
    `replacement`: a space when the vocabulary has one, else its first (lowest) symbol.
    """

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        if not chars:
            raise DataError("a vocabulary needs at least one character")
        if any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise DataError("a vocabulary holds single characters only")
        if len(set(chars)) != len(chars):
            raise DataError("a vocabulary lists each character once")
        self.chars: list[str] = chars
        self._ids: dict[str, int] = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharVocab:
        """The sorted set of characters of `text`; DataError past MAX_VOCAB of them."""
        if not text:
            raise DataError("cannot build a vocabulary from empty text")
        check_vocab_size(text, "the text")
        return cls(sorted(set(text)))

    @property
    def size(self) -> int:
        """Number of symbols (the model's vocab_size)."""
        return len(self.chars)

    @property
    def replacement(self) -> str:
        """What `encode(..., replace_unknown=True)` writes for an unseen character."""
        return " " if " " in self._ids else self.chars[0]

    def __contains__(self, char: object) -> bool:
        return char in self._ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharVocab) and other.chars == self.chars

    __hash__ = None  # type: ignore[assignment]  # mutable list inside: not a dict key

    def __repr__(self) -> str:
        return f"CharVocab(size={self.size}, chars={''.join(self.chars)!r})"

    def index(self, char: str) -> int:
        """The id of one character (DataError when unseen)."""
        return self.encode(char)[0]

    def encode(self, text: str, replace_unknown: bool = False) -> list[int]:
        """Ids of each character; unseen ones raise DataError, or map to `replacement`."""
        ids = self._ids
        try:
            return [ids[c] for c in text]
        except KeyError:
            pass
        if replace_unknown:
            fallback = ids[self.replacement]
            return [ids.get(c, fallback) for c in text]
        unknown = [(pos, c) for pos, c in enumerate(text) if c not in ids]
        shown = ", ".join(f"{c!r} at position {pos}" for pos, c in unknown[:5])
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise DataError(
            f"the text has {len(unknown)} character(s) the vocabulary does not know: "
            f"{shown}{more}; the vocabulary has {self.size} symbols. Remove them, or encode with "
            f"replace_unknown=True to write {self.replacement!r} in their place"
        )

    def decode(self, ids: Iterable[int]) -> str:
        """The text of a sequence of ids (a list or a 1-D tensor)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()  # a tensor: one transfer, then plain ints
        ids = list(ids)
        if not all(isinstance(i, int) and 0 <= i < self.size for i in ids):
            raise DataError(
                f"ids to decode must be integers in [0, {self.size - 1}] for this vocabulary"
            )
        return "".join(self.chars[i] for i in ids)

    def to_json(self) -> str:
        """JSON text that `from_json` reads back into an equal vocabulary."""
        return json.dumps({"chars": self.chars})

    @classmethod
    def from_json(cls, text: str) -> CharVocab:
        """A vocabulary saved by `to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"vocabulary JSON does not parse ({exc.msg})") from None
        if not isinstance(data, dict) or not isinstance(data.get("chars"), list):
            raise DataError('vocabulary JSON must be an object {"chars": [...]}')
        return cls(data["chars"])


# ---------------------------------------------------------------- splits and fingerprints


def split_sizes(n_chars: int, val_fraction: float) -> tuple[int, int]:
    """(train, val) lengths of a contiguous split: the last `val_fraction` is validation."""
    n_train = int(n_chars * (1 - val_fraction))
    return n_train, n_chars - n_train


def min_chars(block_size: int, val_fraction: float) -> int:
    """The shortest text whose both splits hold one window of block_size + 1 characters."""
    need = block_size + 1
    # The validation split holds ceil(n * val_fraction) characters, so n must pass
    # (need - 1) / val_fraction; both lengths only grow with n, so walk up from there.
    n = max(need, int((need - 1) / val_fraction) - 1)
    while min(split_sizes(n, val_fraction)) < need:
        n += 1
    return n


def check_split(n_chars: int, val_fraction: float, block_size: int, label: str) -> tuple[int, int]:
    """Split sizes, or DataError saying how many characters `block_size` needs."""
    n_train, n_val = split_sizes(n_chars, val_fraction)
    need = block_size + 1
    if min(n_train, n_val) < need:
        short = "validation" if n_val < need else "training"
        got = n_val if n_val < need else n_train
        raise DataError(
            f"{label} has {n_chars:,} characters, too short for block_size={block_size}: the "
            f"{short} split gets {got:,} but needs at least {need:,} (block_size + 1). Use a text "
            f"of at least {min_chars(block_size, val_fraction):,} characters at "
            f"val_fraction={val_fraction}, or a smaller block_size"
        )
    return n_train, n_val


def unigram_nats(text: str) -> float:
    """Entropy (nats) of the text's character frequencies: the loss of predicting every
    character by how often it occurs, ignoring all context (0.0 for empty text)."""
    if not text:
        return 0.0
    counts = Counter(text)
    total = len(text)
    return -math.fsum(c / total * math.log(c / total) for c in counts.values())
