"""The geometry of the induction probe's batch, shared by the probe and the findings.

Each sequence of the batch is a random half of `repeat_half(block_size)` tokens followed by
the same half again (training/induction.py). Torch-free.
"""

from __future__ import annotations


def repeat_half(block_size: int) -> int:
    """L, the length of each half of a repeated sequence: block_size // 2."""
    return block_size // 2


def uniform_prefix_score(half: int) -> float:
    """The prefix-matching score of a head attending uniformly over its causal prefix: the
    mean over the second repeat's queries i = L..2L-1 of 1 / (i + 1), the weight each of
    its i + 1 keys gets (about ln 2 / L)."""
    return sum(1.0 / (i + 1) for i in range(half, 2 * half)) / half
