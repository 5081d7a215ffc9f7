"""The geometry of the induction probe's batch, shared by the probe and the findings.

Each row of the batch is a random half of `repeat_half(block_size)` tokens followed by the
same half again (training/induction.py); `probe_rows` rows, their tokens drawn uniformly
from `probe_tokens` (the vocabulary without its line breaks). Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

# Tokens the repeated batch holds in all (rows x 2L): enough rows that the prefix score's
# standard error over rows is well under the formation threshold (docs/internals.md, "The
# induction statistics", has the measurement), few enough that the probe stays cheap.
PROBE_TOKENS = 2048
MIN_ROWS = 16  # long contexts still get this many rows


def repeat_half(block_size: int) -> int:
    """L, the length of each half of a repeated sequence: block_size // 2."""
    return block_size // 2


def probe_rows(block_size: int) -> int:
    """How many repeated rows the probe measures: PROBE_TOKENS // 2L, at least MIN_ROWS."""
    return max(MIN_ROWS, PROBE_TOKENS // max(1, 2 * repeat_half(block_size)))


def is_line_break(char: str) -> bool:
    """Whether a character ends a line (as str.splitlines counts: \\n, \\r, \\x0b, ...)."""
    return len(f"a{char}b".splitlines()) > 1


def probe_tokens(chars: Sequence[str]) -> list[int]:
    """The token ids the repeated batch draws from: every character of the vocabulary but
    its line breaks (every one when fewer than 2 others are left).

    Every corpus here is made of lines, and a model trained on them may rightly stop
    matching at a line break; a row holding one would then measure the corpus's line
    structure, not prefix matching, and how many rows hold one is down to chance."""
    kept = [i for i, char in enumerate(chars) if not is_line_break(char)]
    return kept if len(kept) >= 2 else list(range(len(chars)))


def uniform_prefix_score(half: int) -> float:
    """The prefix-matching score of a head attending uniformly over its causal prefix: the
    mean over the second repeat's queries i = L..2L-1 of 1 / (i + 1), the weight each of
    its i + 1 keys gets (about ln 2 / L)."""
    return sum(1.0 / (i + 1) for i in range(half, 2 * half)) / half
