"""Two groups of a study's runs compared on one column: paired by seed, and unpaired.

A seed fixes a run's data order (and its initial weights, where two variants' shapes
agree), and every run is scored on the same evaluation text (`core.evaluation`), so the
runs of two variants with the same seed share those draws, and the part of the
seed-to-seed spread the two have in common cancels in their difference. `compare`
therefore gives both:

- **paired**: one difference per seed both sides finished with a finite value, and the
  one-sample 95% t interval of their mean (`stats.paired_interval`; n = those seeds);
- **unpaired**: Welch's 95% interval of the difference of the two sides' means over all
  their finite values (`stats.difference_interval`), as if no run had a partner.

A verdict rests on the paired interval when at least 2 seeds pair up, else on Welch's
(`Comparison.used`).

When a group holds several runs per seed (a dict group spanning several variants, say
every depth), the runs of one seed are first matched on the swept columns neither group
fixes (`match_columns`: depth 6 against depth 6), and the matched differences are then
averaged within the seed, so each seed gives one difference. The seed, not the run, is
the replicate: runs with the same seed share its data order, so
their differences are not independent, and counting them as separate pairs would
overstate n. Matching before averaging keeps a run missing on one side (diverged, or
not finished) from changing which cells the other side's mean covers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from blockviz.core.studies.stats import Interval, difference_interval, paired_interval

Group = str | Mapping[str, Any]


@dataclass(frozen=True)
class Comparison:
    """A minus B on one column: the paired interval (None under 2 pairs) and Welch's."""

    names: tuple[str, str]
    paired: Interval | None  # of the per-seed differences; n = pairs
    unpaired: Interval | None  # Welch's; None unless both sides have 2 finite values
    pairs: int  # seeds both sides finished with a finite value
    counts: tuple[int, int]  # finite values of A and of B
    means: tuple[float, float]  # their means (NaN where none)
    unit: str = "runs"  # what a value is: a run, or a seed's whole sweep
    # seeds where A (then B) has no value (its runs diverged or blew up) and the other does
    lone_failures: tuple[int, int] = (0, 0)

    @property
    def used(self) -> Interval | None:
        """The interval a verdict rests on: paired when 2 pairs exist, else Welch's."""
        return self.paired if self.paired is not None else self.unpaired

    def method(self) -> str:
        """How `used` was computed and on how much, in words."""
        if self.paired is not None:
            return f"paired by seed over {self.paired.n} pairs"
        return (
            f"unpaired (Welch, {self.counts[0]} and {self.counts[1]} {self.unit}; "
            f"{self.pairs} seed pair{'' if self.pairs == 1 else 's'}, 2 needed to pair)"
        )

    def both(self) -> str:
        """Both intervals: "A minus B: paired −0.008 (…), n=2 pairs; unpaired …"."""
        paired = (
            f"paired {short_interval(self.paired)}, n={self.paired.n} pairs"
            if self.paired is not None
            else f"paired: {self.pairs} pair{'' if self.pairs == 1 else 's'}, 2 needed"
        )
        unpaired = (
            f"unpaired {short_interval(self.unpaired)}, n={self.counts[0]} and "
            f"{self.counts[1]} {self.unit}"
            if self.unpaired is not None
            else f"unpaired: {self.counts[0]} and {self.counts[1]} {self.unit}, 2 a side needed"
        )
        return f"{self.names[0]} minus {self.names[1]}: {paired}; {unpaired}"

    def numbers(self, prefix: str = "") -> dict[str, Any]:
        """Both intervals as numbers (NaN where one is missing), keys led by `prefix`."""
        used, paired, unpaired = self.used, self.paired, self.unpaired
        out: dict[str, Any] = {
            "difference": used.mean if used else math.nan,
            "low": used.low if used else math.nan,
            "high": used.high if used else math.nan,
            "interval": "paired" if paired is not None else "unpaired",
            "pairs": self.pairs,
            "paired difference": paired.mean if paired else math.nan,
            "paired low": paired.low if paired else math.nan,
            "paired high": paired.high if paired else math.nan,
            "unpaired difference": unpaired.mean if unpaired else math.nan,
            "unpaired low": unpaired.low if unpaired else math.nan,
            "unpaired high": unpaired.high if unpaired else math.nan,
        }
        if not prefix:
            out[f"mean {self.names[0]}"] = self.means[0]
            out[f"mean {self.names[1]}"] = self.means[1]
            out["n"] = f"{self.counts[0]} and {self.counts[1]}"
        return {f"{prefix}{key}": value for key, value in out.items()}


def interval_text(interval: Interval) -> str:
    """`+0.010 (95% interval +0.002 to +0.018)`."""
    return f"{interval.mean:+.3f} (95% interval {interval.low:+.3f} to {interval.high:+.3f})"


def short_interval(interval: Interval) -> str:
    """`+0.010 (+0.002 to +0.018)`."""
    return f"{interval.mean:+.3f} ({interval.low:+.3f} to {interval.high:+.3f})"


def match_columns(swept: Sequence[str], *groups: Group) -> list[str]:
    """The swept columns runs of one seed are matched on: those no group fixes (a variant
    label fixes every one, so then the seed alone)."""
    if any(isinstance(group, str) for group in groups):
        return []
    fixed = {column for group in groups for column in group}
    return [column for column in swept if column not in fixed]


def _finite(values: pd.Series) -> pd.Series:
    numbers = pd.to_numeric(values, errors="coerce").astype(float)
    return numbers[numbers.map(math.isfinite)]


def seed_pairs(
    a: pd.DataFrame, b: pd.DataFrame, values: str = "val_loss", on: Sequence[str] = ()
) -> pd.DataFrame:
    """One row per seed with a finite value on both sides: seed, a, b (each side's mean over
    that seed's runs matched on `on`), seeds in order."""
    keys = ["seed", *(c for c in on if c in a.columns and c in b.columns)]
    left = a.loc[_finite(a[values]).index, [*keys, values]]
    right = b.loc[_finite(b[values]).index, [*keys, values]]
    matched = left.merge(right, on=keys, suffixes=("_a", "_b"))
    per_seed = matched.groupby("seed", sort=True)[[f"{values}_a", f"{values}_b"]].mean()
    per_seed.columns = ["a", "b"]
    return per_seed.reset_index()


def lone_failures(
    a: pd.DataFrame, b: pd.DataFrame, values: str = "val_loss", on: Sequence[str] = ()
) -> tuple[int, int]:
    """Seeds where one side has no finite value (its run diverged or blew up) in a cell
    (matched on `on`) where the other side has one: (A's, B's). Such a seed is evidence,
    the worst outcome for the side without a value, that no interval can hold."""
    keys = ["seed", *(c for c in on if c in a.columns and c in b.columns)]
    sides = [
        side[keys].assign(ok=pd.to_numeric(side[values], errors="coerce").map(math.isfinite))
        for side in (a, b)
    ]
    cells = sides[0].merge(sides[1], on=keys, suffixes=("_a", "_b"))
    a_alone = cells.loc[~cells["ok_a"] & cells["ok_b"], "seed"].nunique()
    b_alone = cells.loc[cells["ok_a"] & ~cells["ok_b"], "seed"].nunique()
    return int(a_alone), int(b_alone)


def compare(
    a: pd.DataFrame,
    b: pd.DataFrame,
    names: tuple[str, str],
    values: str = "val_loss",
    on: Sequence[str] = (),
    unit: str = "runs",
) -> Comparison:
    """A minus B on the column `values`, paired by seed (matched on `on`) and unpaired."""
    fa, fb = _finite(a[values]), _finite(b[values])
    pairs = seed_pairs(a, b, values, on)
    return Comparison(
        names=names,
        paired=paired_interval(pairs["a"].tolist(), pairs["b"].tolist()),
        unpaired=difference_interval(fa, fb),
        pairs=len(pairs),
        counts=(len(fa), len(fb)),
        means=(
            float(fa.mean()) if len(fa) else math.nan,
            float(fb.mean()) if len(fb) else math.nan,
        ),
        unit=unit,
        lone_failures=lone_failures(a, b, values, on),
    )
