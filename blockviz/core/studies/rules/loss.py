"""The rules that compare final val loss between two groups: lower_loss and not_worse.

Also what other rules compare with: `contrast` (better − worse, paired by seed and
unpaired, or the verdict that needs no interval) and `below_zero` (supported below 0,
contradicted above, else inconclusive). Each rule is described in `studies.verdicts`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from blockviz.core.studies.comparisons import Comparison, compare, interval_text, match_columns
from blockviz.core.studies.define import Claim, StudyDef
from blockviz.core.studies.outcomes import usable_losses
from blockviz.core.studies.rules.base import (
    Verdict,
    failed_count,
    finished_runs,
    group_name,
    outcomes_text,
    select,
    too_few,
)


def contrast(
    claim: Claim,
    better: pd.DataFrame,
    worse: pd.DataFrame,
    names: tuple[str, str],
    on: Sequence[str] = (),
    values: str = "val_loss",
    what: str = "final val loss",
) -> Verdict | Comparison:
    """better − worse on a column, paired and unpaired (`comparisons.compare`); or the
    verdict that needs no interval: too few finished runs, or one side with no finite
    value (every finished run diverged) while the other has one, so the other is lower."""
    a, b = usable_losses(finished_runs(better)), usable_losses(finished_runs(worse))
    per_run = values == "val_loss"  # else one value per seed (a sensitivity)
    unit = "finished run(s)" if per_run else "seed(s) with the whole sweep finished"
    if len(a) < 2 or len(b) < 2:
        small = names[0] if len(a) < 2 else names[1]
        return too_few(claim, small, min(len(a), len(b)), unit)
    compared = compare(a, b, names, values, on, "runs" if per_run else "seeds")
    na, nb = compared.counts
    if na == 0 and nb >= 1 and failed_count(a) == len(a):
        return _one_sided(claim, "contradicted", (names[0], a), (names[1], b), what)
    if nb == 0 and na >= 1 and failed_count(b) == len(b):
        return _one_sided(claim, "supported", (names[1], b), (names[0], a), what)
    if compared.used is None:
        return too_few(claim, "a side with a finite value", min(na, nb), unit)
    return compared


def _one_sided(
    claim: Claim,
    verdict: str,
    without: tuple[str, pd.DataFrame],
    other: tuple[str, pd.DataFrame],
    what: str,
) -> Verdict:
    """The verdict when one side's finished runs all failed with no finite value: what
    each side's runs did, in counts."""
    said = (
        f"no finished run of {without[0]} ended with a {what} to compare "
        f"({outcomes_text(without[1])}); {other[0]}: {outcomes_text(other[1])}"
    )
    numbers = {f"finished {name}": len(runs) for name, runs in (without, other)}
    numbers.update({f"failed {name}": failed_count(runs) for name, runs in (without, other)})
    return Verdict(claim, verdict, f"{said}.", numbers)


def _said(compared: Comparison, what: str) -> str:
    interval = compared.used
    assert interval is not None
    a, b = compared.names
    return f"{what} of {a} minus {b}, {compared.method()}: {interval_text(interval)}"


def _alone(compared: Comparison, side: int) -> str:
    """`a failed to train in 1 seed where b trained` ('' when it did in none)."""
    n = compared.lone_failures[side]
    if not n:
        return ""
    failed, other = compared.names[side], compared.names[1 - side]
    return f"{failed} failed to train in {n} seed{'' if n == 1 else 's'} where {other} trained"


def _decide(
    claim: Claim, compared: Comparison, said: str, lower: bool, higher: bool, numbers: dict
) -> Verdict:
    """The verdict of an interval that lies below (`lower`) or above (`higher`) its bound,
    with the seeds where one side failed alone as evidence no interval holds: a side that
    failed where the other trained is never the one found better."""
    lone_a, lone_b = _alone(compared, 0), _alone(compared, 1)
    notes = "; ".join(x for x in (lone_a, lone_b) if x)
    both = f"{said}; {notes}" if notes else said
    if lower and not lone_a:
        return Verdict(claim, "supported", f"{both}.", numbers, (compared,))
    if higher and not lone_b:
        return Verdict(claim, "contradicted", f"{both}.", numbers, (compared,))
    if lower or higher:
        against = lone_a if lower else lone_b
        why = f"{said}, but {against}: a failure is the worst outcome, not a missing one"
        rest = lone_b if lower else lone_a
        return Verdict(
            claim, "inconclusive", f"{why}{'; ' + rest if rest else ''}.", numbers, (compared,)
        )
    return Verdict(claim, "inconclusive", f"{both}.", numbers, (compared,))


def below_zero(claim: Claim, compared: Verdict | Comparison, what: str) -> Verdict:
    """Supported if the interval lies below 0, contradicted if above, else inconclusive;
    a side that failed to train in a seed where the other trained is never found better."""
    if isinstance(compared, Verdict):
        return compared
    interval, said, numbers = compared.used, _said(compared, what), compared.numbers()
    assert interval is not None
    lower, higher = interval.high < 0, interval.low > 0
    where = "below zero" if lower else "above zero" if higher else "which includes zero"
    return _decide(claim, compared, f"{said}, {where}", lower, higher, numbers)


def _better_minus_worse(
    claim: Claim, results: pd.DataFrame, study: StudyDef
) -> Verdict | Comparison:
    """The final val loss of the claim's `better` group minus its `worse` group."""
    better, worse = claim.args["better"], claim.args["worse"]
    return contrast(
        claim,
        select(results, better),
        select(results, worse),
        (group_name(better), group_name(worse)),
        match_columns(study.swept, better, worse),
    )


def lower_loss(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    """Supported if the interval of (better − worse) final val loss lies below 0."""
    compared = _better_minus_worse(claim, results, study)
    return below_zero(claim, compared, "final val loss")


def not_worse(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    """Supported if the interval of (better − worse) stays below +margin nats."""
    margin = claim.args["margin"]
    number = isinstance(margin, int | float) and not isinstance(margin, bool)
    if not number or not math.isfinite(margin) or margin < 0:
        raise ValueError(f"not_worse margin must be a number of nats >= 0, not {margin!r}")
    compared = _better_minus_worse(claim, results, study)
    if isinstance(compared, Verdict):
        return compared
    interval, said = compared.used, _said(compared, "final val loss")
    assert interval is not None
    numbers = {**compared.numbers(), "margin": float(margin)}
    bound = f"the margin of {margin:+.3f} nats"
    a, b = compared.names
    if interval.high < margin:
        said = f"{said}; its upper bound is below {bound}, so {a} does as well as {b} within it"
    elif interval.low > margin:
        said = f"{said}; its lower bound is above {bound}, so {a} does worse than {b} by more"
    else:
        said = f"{said}, which includes {bound}"
    return _decide(claim, compared, said, interval.high < margin, interval.low > margin, numbers)
