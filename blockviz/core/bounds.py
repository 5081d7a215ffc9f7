"""`Bound`, the allowed range of a number, and the few limits other checks share.

Each numeric config field declares its `Bound` where it is declared (`core.config`, whose
`BOUNDS` collects them); `MAX_VOCAB`, `MAX_STEPS` and `MAX_SEED` are also read by the data
checks, the seed lists and the step counts. Plain data, no imports from the rest of
blockviz.
"""

from __future__ import annotations

from dataclasses import dataclass

# Distinct characters a vocabulary may hold. 10,000 covers every alphabet and the few
# thousand CJK characters of everyday text; past it a "character" model is mostly an
# embedding table of symbols seen once or twice (a text of every Unicode code point has
# 1.1 million). The data checks refuse larger vocabularies with this figure.
MAX_VOCAB = 10_000
MAX_STEPS = 10_000_000  # ~a month of a tiny model on a GPU; also caps warm-up and intervals
MAX_SEED = 2**32 - 1  # what numpy's and torch's seeding accept


@dataclass(frozen=True)
class Bound:
    """The allowed range of one numeric field; inclusive ends unless marked open."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        """Whether `value` lies in the range (NaN never does)."""
        above = self.low < value if self.low_open else self.low <= value
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self, integer: bool) -> str:
        """'an integer in [1, 256]' or 'a number in (0.0, 10.0]'."""
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        kind = "an integer" if integer else "a number"
        return f"{kind} in {left}{self.low}, {self.high}{right}"
