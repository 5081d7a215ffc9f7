"""The Verdict a rule returns, and what every rule does with a group of runs.

A group is a variant label or {results column: value} (`select`); the helpers name it,
keep its finished runs, count its failures and say what its runs did. The rules are
`rules.loss`, `rules.counts` and `rules.sweep`; `studies.verdicts` dispatches a claim to
its rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from blockviz.core.studies.comparisons import Comparison
from blockviz.core.studies.define import Claim
from blockviz.core.studies.outcomes import FAILED, outcome_counts

VERDICTS = ("supported", "contradicted", "inconclusive", "pending")


@dataclass(frozen=True)
class Verdict:
    """A claim judged on the runs: the verdict, why, the numbers it rests on, and every
    difference it computed (paired and unpaired)."""

    claim: Claim
    verdict: str
    reason: str
    numbers: Mapping[str, Any] = field(default_factory=dict)
    comparisons: tuple[Comparison, ...] = ()


# ---------------------------------------------------------------------------- groups


def select(results: pd.DataFrame, group: str | Mapping[str, Any]) -> pd.DataFrame:
    """The runs of a group: a variant label, or {column: value} over the results columns."""
    if isinstance(group, str):
        return results[results["variant"] == group]
    if not isinstance(group, Mapping) or not group:
        raise ValueError(f"a group is a variant label or a non-empty dict, not {group!r}")
    mask = pd.Series(True, index=results.index)
    for column, value in group.items():
        if column not in results.columns:
            raise ValueError(f"no column {column!r} to select runs by")
        mask &= results[column] == value
    return results[mask]


def group_name(group: str | Mapping[str, Any]) -> str:
    """A group as a sentence names it: its label, or `norm_position post, warmup off`."""
    if isinstance(group, str):
        return group
    return ", ".join(f"{k} {v}" for k, v in group.items())


def finished_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with an outcome (converged, diverged, blew up or stalled)."""
    return runs[runs["outcome"] != ""]


def failed_count(runs: pd.DataFrame) -> int:
    """How many of the runs failed to train (`outcomes.FAILED`)."""
    return int(runs["outcome"].isin(FAILED).sum())


def outcomes_text(runs: pd.DataFrame) -> str:
    """What the runs' outcomes were: `1 converged, 1 stalled`."""
    return outcome_counts(runs["outcome"].value_counts().to_dict())


def too_few(claim: Claim, what: str, n: int, unit: str = "finished run(s)") -> Verdict:
    """The inconclusive verdict of a side with fewer than 2 runs (or seeds) to judge."""
    return Verdict(claim, "inconclusive", f"cannot judge: only {n} {unit} of {what}; 2 needed", {})
