"""The rules that turn a study's runs into verdicts (its per-variant table: `summary`).

This module holds the table of rules (`RULES`), `judge` and `verdicts`; the `Verdict` type
and the group helpers are `rules.base`, the rules themselves `rules.loss`
(lower_loss, not_worse), `rules.counts` (converges, fails_often, fails_deep,
lower_max_stable_lr, param_share) and `rules.sweep` (less_sensitive, sweet_spot).

A claim names a rule and its arguments (`blockviz.core.studies.define.Claim`); `judge` applies
the rule to the study's results frame (`studies.outcomes.results_frame`) and returns
*supported*, *contradicted* or *inconclusive* with a sentence naming the numbers used, or
*pending* while a run the claim rests on (`NEEDS`) is queued or running; a run it rests on
that ended without a result (stopped, failed) makes it inconclusive ("Cannot judge"), as
fewer than two finished runs on a side do. Nothing here knows what any configuration
"should" do.

A rule's group of runs is a variant label, or a dict {results column: value} that selects
runs by their swept values ({"norm_position": "post", "warmup": "off"}). "Finished" runs
are those with an outcome (converged, diverged, blew up or stalled); "failed to train"
means diverged, blew up or stalled (`outcomes.FAILED`).

Differences of final val loss between two groups (`studies.comparisons`) are computed two
ways, and a verdict carries both (`Verdict.comparisons`, and in `numbers`): **paired by
seed** (one difference per seed both groups finished with a finite value, its one-sample
95% t interval; a group with several runs per seed is matched on the swept columns
neither group fixes and averaged within the seed) and **unpaired** (Welch's 95%
interval). The verdict uses the paired interval when at least 2 seeds pair up, else
Welch's, and its sentence says which and on how many pairs. Why paired: a seed fixes the
data order (and the initial weights where shapes agree) for every variant, and every run is
scored on one evaluation text, so the seed-to-seed noise the two
variants share cancels in their difference, and what is left is the variants' own
difference. A difference counts as real only when its interval excludes zero. The rules:

- converges {groups}: supported if at least 2 runs finished and all converged;
  contradicted if more than half of the finished runs failed to train; else
  inconclusive. The groups are pooled, so a group with no run at all makes the verdict
  inconclusive and is named.
- fails_often {groups}: supported if at least half of at least 2 finished runs failed to
  train; contradicted if none did; else inconclusive (pooled as in converges).
- lower_loss {better, worse}: supported if the interval of (better − worse) lies below 0,
  contradicted if above 0, else inconclusive; but the side an interval favours must not
  have failed to train (diverged, blew up) in a seed where the other trained
  (`comparisons.lone_failures`): a failure is the worst outcome, never a missing value.
  When one side has no finite loss (every finished run diverged) and the other has one,
  the other side is lower; the sentence says what each side's runs did.
- not_worse {better, worse, margin}: "at least as well", tested as non-inferiority with a
  margin in nats: supported if the interval's upper bound of (better − worse) is below
  +margin, contradicted if its lower bound is above +margin, else inconclusive (failed
  seeds held against a side as in lower_loss).
- less_sensitive {better, worse, field}: per seed, the learning-rate sensitivity
  (`outcomes.lr_sensitivity`) of the group's runs across the field's values; the interval
  of (better − worse), paired by seed where it can be, decides as in lower_loss.
- lower_max_stable_lr {lower, than, field, factor}: the largest field value at which every
  finished run of the group converged; supported if lower's is at most than's / factor
  (or lower has none while than has one), contradicted if lower's is at least than's,
  else inconclusive.
- fails_deep {deep, reference}: supported if more than half of the deep group's finished
  runs failed to train and fewer than half of the reference's (its contrast) did;
  contradicted if all converged and the interval of (deep − reference) does not lie
  above 0; else inconclusive.
- sweet_spot {at, field}: contradicted if any other value of the field is lower than
  `at` (interval above 0, or every run of `at` diverged); supported only if `at` is lower
  than every smaller value (interval below 0), no larger value is lower in the mean (not
  merely "not significantly") or in at least half of the seeds that pair up, and both a
  smaller and a larger value were run; otherwise inconclusive, naming what failed.
- param_share {variant, part, low, high}: no training: the share of one block's
  parameters in `part` (a component of `core.params`: attn, ffn or norm) for the variant's
  config; supported inside [low, high], contradicted outside.

A rule with fewer than two finished runs on a side says so ("Cannot judge") and is
inconclusive.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from blockviz.core.spec import ACTIVE_STATUSES, and_list
from blockviz.core.studies.define import Claim, StudyDef
from blockviz.core.studies.rules.base import Verdict, select
from blockviz.core.studies.rules.counts import (
    converges,
    fails_deep,
    fails_often,
    lower_max_stable_lr,
    param_share,
)
from blockviz.core.studies.rules.loss import lower_loss, not_worse
from blockviz.core.studies.rules.sweep import less_sensitive, sweet_spot

RULES: dict[str, Callable[[Claim, pd.DataFrame, StudyDef], Verdict]] = {
    "converges": converges,
    "fails_often": fails_often,
    "lower_loss": lower_loss,
    "not_worse": not_worse,
    "less_sensitive": less_sensitive,
    "lower_max_stable_lr": lower_max_stable_lr,
    "fails_deep": fails_deep,
    "sweet_spot": sweet_spot,
    "param_share": param_share,
}


# The groups of runs each rule judges (param_share needs none; sweet_spot every run of its
# field): a verdict waits until every one of them has ended.
NEEDS: dict[str, Callable[[Mapping[str, Any]], list[Any]]] = {
    "converges": lambda args: list(args["groups"]),
    "fails_often": lambda args: list(args["groups"]),
    "lower_loss": lambda args: [args["better"], args["worse"]],
    "not_worse": lambda args: [args["better"], args["worse"]],
    "less_sensitive": lambda args: [args["better"], args["worse"]],
    "lower_max_stable_lr": lambda args: [args["lower"], args["than"]],
    "fails_deep": lambda args: [args["deep"], args["reference"]],
    "sweet_spot": lambda args: [args["at"]],
    "param_share": lambda args: [],
}


def needed_runs(claim: Claim, results: pd.DataFrame) -> pd.DataFrame:
    """The runs the claim's verdict rests on: its groups' (for sweet_spot, every run with a
    value of its field)."""
    groups = NEEDS[claim.rule](claim.args)
    if claim.rule == "sweet_spot" and claim.args["field"] in results.columns:
        return results[results[claim.args["field"]].notna()]
    if not groups:
        return results.iloc[0:0]
    return pd.concat([select(results, group) for group in groups]).drop_duplicates("run_id")


def _unended(claim: Claim, needed: pd.DataFrame) -> Verdict | None:
    """'pending' while a run the verdict needs is queued or running; 'inconclusive' (cannot
    judge) when one ended without a result (stopped or failed): missing evidence is never
    support, nor contradiction."""
    waiting = needed[needed["outcome"] == ""]
    if waiting.empty:
        return None
    counts = waiting["status"].value_counts()
    said = and_list([f"{n} {status}" for status, n in counts.items()])
    numbers = {"runs needed": len(needed), "not ended": len(waiting)}
    active = waiting["status"].isin(ACTIVE_STATUSES)
    if active.any():
        why = f"{int(active.sum())} of the {len(needed)} runs it rests on have not ended ({said})"
        return Verdict(claim, "pending", f"Pending: {why}.", numbers)
    why = (
        f"{len(waiting)} of the {len(needed)} runs it rests on ended without a result ({said}); "
        "`study resume` trains them again"
    )
    return Verdict(claim, "inconclusive", f"Cannot judge: {why}.", numbers)


def judge(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    """The claim's rule applied to the study's results: 'pending' until every run it needs
    has ended, and 'cannot judge' (inconclusive) while one of them ended without a result."""
    if claim.rule not in RULES:
        raise ValueError(f"claim rule {claim.rule!r} is not one of {', '.join(RULES)}")
    if results.empty and claim.rule != "param_share":
        return Verdict(claim, "pending", "Pending: no run has finished yet.", {})
    try:
        verdict = _unended(claim, needed_runs(claim, results)) if not results.empty else None
        verdict = verdict or RULES[claim.rule](claim, results, study)
    except KeyError as exc:
        raise ValueError(f"claim rule {claim.rule!r} needs the argument {exc}") from None
    # A reason is shown as a sentence: it starts with a capital, whatever the rule wrote.
    reason = verdict.reason[:1].upper() + verdict.reason[1:]
    return dataclasses.replace(verdict, reason=reason)


def verdicts(study: StudyDef, results: pd.DataFrame) -> list[Verdict]:
    """Every claim of the study, judged."""
    return [judge(claim, results, study) for claim in study.claims]
