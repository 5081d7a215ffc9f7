"""The rules across a swept field's values: less_sensitive and sweet_spot.

`sensitivity_table` is the learning-rate sensitivity of each group over the sweep, per
seed and with its 95% interval (the study page draws it); less_sensitive compares two
groups' sensitivities. sweet_spot compares one value with every other. Each rule is
described in `studies.verdicts`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sized
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from blockviz.core.spec import and_list
from blockviz.core.studies.comparisons import (
    Comparison,
    interval_text,
    match_columns,
    seed_pairs,
)
from blockviz.core.studies.define import Claim, StudyDef
from blockviz.core.studies.outcomes import lr_sensitivity, usable_losses
from blockviz.core.studies.rules.base import Verdict, group_name, select
from blockviz.core.studies.rules.loss import below_zero, contrast
from blockviz.core.studies.stats import mean_interval


def _sensitivities(runs: pd.DataFrame, field_name: str) -> pd.DataFrame:
    """One row per seed: its LR sensitivity over the field's values (all must be finished)."""
    rows = []
    for seed, by_seed in runs.groupby("seed"):
        if (by_seed["outcome"] == "").any():
            continue
        init = by_seed["init_loss"].dropna()
        if init.empty:
            continue
        value = lr_sensitivity(
            list(by_seed[field_name]), list(by_seed["val_loss"]), float(init.iloc[0])
        )
        finite = pd.to_numeric(usable_losses(by_seed)["val_loss"], errors="coerce").dropna()
        best = float(finite.min()) if len(finite) else math.nan
        rows.append({"seed": seed, "sensitivity": value, "best": best, "outcome": "converged"})
    return pd.DataFrame(rows, columns=["seed", "sensitivity", "best", "outcome"])


def sensitivity_table(results: pd.DataFrame, field_name: str, by: str) -> pd.DataFrame:
    """The learning-rate sensitivity of each value of `by` over `field_name`'s sweep, and
    its best loss over the sweep (a seed's lowest finite val loss): means over seeds with
    their 95% t intervals (NaN with one seed) and the seeds they rest on."""
    rows = []
    if field_name in results.columns and by in results.columns:
        for value in dict.fromkeys(results[by]):
            per_seed = _sensitivities(results[results[by] == value], field_name)
            row: dict[str, Any] = {by: value}
            for column, prefix in (("sensitivity", ""), ("best", "best_")):
                interval = mean_interval(per_seed[column].dropna())
                spread = interval is not None and interval.n > 1
                row[prefix + "low"] = interval.low if spread else math.nan
                row[prefix + "high"] = interval.high if spread else math.nan
                row[column] = interval.mean if interval else math.nan
            row["seeds"] = int(per_seed["sensitivity"].map(math.isfinite).sum())
            rows.append(row)
    columns = [by, "sensitivity", "low", "high", "best", "best_low", "best_high", "seeds"]
    return pd.DataFrame(rows, columns=columns)


def less_sensitive(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    """Supported if better's LR sensitivity is below worse's (interval below 0)."""
    better, worse, name = claim.args["better"], claim.args["worse"], claim.args["field"]
    sa = _sensitivities(select(results, better), name)
    sb = _sensitivities(select(results, worse), name)
    what = "learning-rate sensitivity"
    compared = contrast(
        claim, sa, sb, (group_name(better), group_name(worse)), values="sensitivity", what=what
    )
    return below_zero(claim, compared, what)


@dataclass
class _Standing:
    """Where `at` stands against each other value of the field, by the interval of
    (at − other): what a sweet_spot verdict is made of."""

    beaten: list[Any] = field(default_factory=list)  # below 0, or the other all diverged
    lower: list[Any] = field(default_factory=list)  # above 0: the other is lower, significantly
    # `at` had no loss to compare (every finished run of it failed) and the other did
    outtrained: list[Any] = field(default_factory=list)
    ahead: list[Any] = field(default_factory=list)  # `at` lower in the mean, not significantly
    behind: dict[Any, float] = field(default_factory=dict)  # the other lower in the mean: by
    # the other lower in at least half of the seeds that pair up: "k of n"
    seeds_lower: dict[Any, str] = field(default_factory=dict)
    unknown: list[Any] = field(default_factory=list)  # too few finished runs to compare
    notes: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)

    def add(
        self, other: Any, them: str, compared: Verdict | Comparison, pairs: pd.DataFrame
    ) -> None:
        """File one comparison of `at` with the value `other` (called `them`), and its
        seeds (`comparisons.seed_pairs`, `at` as a): the mean alone can hide the seeds."""
        lower = int((pairs["b"] < pairs["a"]).sum())
        if len(pairs) and 2 * lower >= len(pairs):
            self.seeds_lower[other] = f"{lower} of {len(pairs)}"
        if isinstance(compared, Verdict):  # too few runs, or one side all diverged
            self.notes.append(f"vs {them}: {compared.reason.rstrip('.')}")
            if compared.verdict == "supported":
                self.beaten.append(other)
            elif compared.verdict == "contradicted":
                self.outtrained.append(other)
            else:
                self.unknown.append(other)
            return
        interval = compared.used
        assert interval is not None
        self.comparisons.append(compared)
        self.numbers.update(compared.numbers(prefix=f"vs {them}: "))
        self.notes.append(f"vs {them}: {interval_text(interval)}, {compared.method()}")
        if interval.high < 0:
            self.beaten.append(other)
        elif interval.low > 0:
            self.lower.append(other)
        elif interval.mean > 0:
            self.behind[other] = interval.mean
        else:
            self.ahead.append(other)


def _value_name(results: pd.DataFrame, name: str, value: Any) -> str:
    """A field value by its variant's label when one variant has it, else `name value`."""
    labels = list(dict.fromkeys(results.loc[results[name] == value, "variant"]))
    return str(labels[0]) if len(labels) == 1 else f"{name} {value}"


def sweet_spot(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    """Supported if `at` beats every smaller value and no larger one is lower, in the mean
    or in half of the seeds; both a smaller and a larger value must have been run."""
    at, name = claim.args["at"], claim.args["field"]
    here = select(results, at)
    if here.empty:
        raise ValueError(f"no runs of {group_name(at)} to judge")
    value = here[name].iloc[0]
    swept = results[results[name].notna()]
    me = _value_name(results, name, value)
    on = match_columns([c for c in study.swept if c != name], at)
    standing = _Standing()
    others = sorted(v for v in swept[name].unique() if v != value)
    for other in others:
        them = _value_name(results, name, other)
        there = results[results[name] == other]
        pairs = seed_pairs(usable_losses(here), usable_losses(there), on=on)
        standing.add(other, them, contrast(claim, here, there, (me, them), on), pairs)

    def named(values: Iterable[Any]) -> str:
        return and_list([_value_name(results, name, v) for v in values])

    def are(values: Sized) -> str:
        return "is" if len(values) == 1 else "are"

    # What stands between `at` and "supported", each in words.
    failures = []
    if standing.lower:
        failures.append(
            f"{named(standing.lower)} {are(standing.lower)} lower than {me}, significantly"
        )
    if standing.outtrained:
        failures.append(
            f"every finished run of {me} failed to train, while {named(standing.outtrained)} "
            "did not"
        )
    if not any(o < value for o in others):
        failures.append(f"no {name} smaller than {value} was run")
    if not any(o > value for o in others):
        failures.append(f"no {name} larger than {value} was run")
    if unclear := sorted(o for o in [*standing.ahead, *standing.behind] if o < value):
        failures.append(f"{me} is not significantly lower than {named(unclear)}")
    if larger := sorted(o for o in standing.behind if o > value):
        by = and_list([f"{standing.behind[o]:.3f}" for o in larger])
        failures.append(
            f"{named(larger)} {are(larger)} lower than {me} in the mean (by {by}), "
            "not significantly"
        )
    if most := {
        o: w
        for o, w in standing.seeds_lower.items()
        if o > value and o not in [*larger, *standing.lower]
    }:
        failures.append(
            and_list(
                [
                    f"{_value_name(results, name, o)} is lower than {me} in {w}"
                    for o, w in most.items()
                ]
            )
            + " seeds"
        )
    if standing.unknown:
        failures.append(f"too few finished runs to compare {me} with {named(standing.unknown)}")
    numbers = {
        **standing.numbers,
        "lower than": ", ".join(map(str, standing.beaten)) or "none",
        "higher than": ", ".join(map(str, [*standing.lower, *standing.outtrained])) or "none",
    }
    said = f"final val loss of {me} minus each other {name}: {'; '.join(standing.notes)}"
    if failures:
        verdict = "contradicted" if standing.lower or standing.outtrained else "inconclusive"
        why = "; ".join(failures)
        why = why[0].upper() + why[1:]
    else:
        verdict = "supported"
        why = (
            f"{me} is lower than every smaller {name}, and no larger one is lower in the mean "
            "or in half of the seeds"
        )
    return Verdict(claim, verdict, f"{said}. {why}.", numbers, tuple(standing.comparisons))
