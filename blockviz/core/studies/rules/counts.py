"""The rules that count: runs by outcome, and one block's parameters.

converges and fails_often (pooled groups), fails_deep, lower_max_stable_lr (the largest
learning rate at which every run converged, `max_stable`) and param_share, which needs
no run. Each rule is described in `studies.verdicts`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from blockviz.core.params import param_breakdown
from blockviz.core.spec import PARAM_GROUPS, and_list
from blockviz.core.studies.comparisons import match_columns
from blockviz.core.studies.define import Claim, StudyDef
from blockviz.core.studies.outcomes import FAILED
from blockviz.core.studies.rules.base import (
    Verdict,
    failed_count,
    finished_runs,
    group_name,
    outcomes_text,
    select,
    too_few,
)
from blockviz.core.studies.rules.loss import below_zero, contrast


def _pooled(
    results: pd.DataFrame, groups: Sequence[str | Mapping[str, Any]]
) -> tuple[pd.DataFrame, str, list[str]]:
    """The groups' finished runs together, the groups' names, and what has no finished run
    yet: a whole group by its name, else each variant it spans that has none."""
    parts, waiting = [], []
    for group in groups:
        runs = select(results, group)
        done = finished_runs(runs)
        parts.append(done)
        if done.empty:
            waiting.append(group_name(group))
        else:
            finished = set(done["variant"])
            waiting += [v for v in dict.fromkeys(runs["variant"]) if v not in finished]
    return pd.concat(parts), "; ".join(group_name(g) for g in groups), waiting


def _failures(runs: pd.DataFrame) -> str:
    """`2 failed to train (1 diverged, 1 stalled)`."""
    failed = runs[runs["outcome"].isin(FAILED)]
    return f"{len(failed)} failed to train" + (f" ({outcomes_text(failed)})" if len(failed) else "")


def _pooled_counts(claim: Claim, results: pd.DataFrame) -> tuple[pd.DataFrame, str, Verdict | None]:
    """The pooled finished runs, their names, and the verdict when they cannot be judged:
    fewer than 2, or a group (or a variant of one) with no finished run."""
    runs, what, waiting = _pooled(results, claim.args["groups"])
    if len(runs) < 2:
        return runs, what, too_few(claim, what, len(runs))
    if waiting:
        said = f"no run of {and_list(waiting)} has finished, and the claim covers all of {what}"
        numbers = {"finished": len(runs), "failed": failed_count(runs), "waiting": len(waiting)}
        return runs, what, Verdict(claim, "inconclusive", f"{said}.", numbers)
    return runs, what, None


def converges(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    """Supported if at least 2 runs of the pooled groups finished and all converged."""
    runs, what, early = _pooled_counts(claim, results)
    if early is not None:
        return early
    n, failed = len(runs), failed_count(runs)
    numbers = {"finished": n, "failed": failed, "converged": n - failed}
    said = f"{n - failed} of {n} finished runs of {what} converged"
    if failed == 0:
        return Verdict(claim, "supported", f"{said}.", numbers)
    verdict = "contradicted" if failed > n / 2 else "inconclusive"
    return Verdict(claim, verdict, f"{said}; {_failures(runs)}.", numbers)


def fails_often(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    """Supported if at least half of the pooled groups' finished runs failed to train."""
    runs, what, early = _pooled_counts(claim, results)
    if early is not None:
        return early
    n, failed = len(runs), failed_count(runs)
    numbers = {"finished": n, "failed": failed}
    said = f"of {n} finished runs of {what}, {_failures(runs)}"
    if failed >= n / 2:
        return Verdict(claim, "supported", f"{said}.", numbers)
    if failed == 0:
        return Verdict(claim, "contradicted", f"{said}.", numbers)
    return Verdict(claim, "inconclusive", f"{said} (fewer than half).", numbers)


def max_stable(runs: pd.DataFrame, field_name: str) -> float | None:
    """The largest field value at which every finished run converged (None: none did)."""
    stable = None
    for value, at in finished_runs(runs).groupby(field_name):
        if len(at) and (at["outcome"] == "converged").all():
            stable = value if stable is None else max(stable, value)
    return stable


def lower_max_stable_lr(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    """Supported if `lower`'s largest stable value is at most `than`'s / factor."""
    lower, than, name = claim.args["lower"], claim.args["than"], claim.args["field"]
    factor = float(claim.args.get("factor", 1.0))
    a, b = select(results, lower), select(results, than)
    if len(finished_runs(a)) < 2 or len(finished_runs(b)) < 2:
        return too_few(
            claim,
            f"{group_name(lower)} or {group_name(than)}",
            min(len(finished_runs(a)), len(finished_runs(b))),
        )
    la, lb = max_stable(a, name), max_stable(b, name)
    numbers = {
        f"largest stable {name}, {group_name(lower)}": la,
        f"largest stable {name}, {group_name(than)}": lb,
        "factor": factor,
    }
    said = (
        f"largest {name} at which every run converged: "
        f"{group_name(lower)} {la}, {group_name(than)} {lb}"
    )
    if la is None and lb is not None:
        return Verdict(claim, "supported", f"{said}.", numbers)
    if la is None or lb is None:
        return Verdict(claim, "inconclusive", f"{said}.", numbers)
    if la <= lb / factor:
        return Verdict(claim, "supported", f"{said} (at least {factor:g}× lower).", numbers)
    if la >= lb:
        return Verdict(claim, "contradicted", f"{said}.", numbers)
    return Verdict(claim, "inconclusive", f"{said} (lower, by less than {factor:g}×).", numbers)


def fails_deep(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    """Supported if more than half of the deep group's finished runs failed to train while
    fewer than half of its contrast's (the reference) did: a depth at which the reference
    fails too says nothing about what the deep group lacks."""
    deep, reference = claim.args["deep"], claim.args["reference"]
    runs = finished_runs(select(results, deep))
    ref = finished_runs(select(results, reference))
    n, failed = len(runs), failed_count(runs)
    if n < 2:
        return too_few(claim, group_name(deep), n)
    said = f"of {n} finished runs of {group_name(deep)}, {_failures(runs)}"
    numbers: dict[str, Any] = {"finished": n, "failed": failed}
    if failed > n / 2:
        if len(ref) < 2:
            return too_few(claim, f"{group_name(reference)}, the contrast", len(ref))
        ref_failed = failed_count(ref)
        numbers.update({"reference finished": len(ref), "reference failed": ref_failed})
        against = f"of {len(ref)} of {group_name(reference)}, {_failures(ref)}"
        if 2 * ref_failed < len(ref):
            return Verdict(claim, "supported", f"{said}; {against}.", numbers)
        why = f"{said}; but {against} as well, so the failure is not the deep group's own"
        return Verdict(claim, "inconclusive", f"{why}.", numbers)
    compared = below_zero(
        claim,
        contrast(
            claim,
            runs,
            select(results, reference),
            (group_name(deep), group_name(reference)),
            match_columns(study.swept, deep, reference),
        ),
        "final val loss",
    )
    numbers.update(compared.numbers)
    reason = f"{said}; {compared.reason}"
    # Not above zero: the deep runs trained no worse than the reference. Too few reference
    # runs to compare (inconclusive with no interval) is no evidence either way.
    no_worse = compared.verdict == "supported" or (
        compared.verdict == "inconclusive" and compared.comparisons
    )
    if failed == 0 and no_worse:
        return Verdict(claim, "contradicted", reason, numbers, compared.comparisons)
    return Verdict(claim, "inconclusive", reason, numbers, compared.comparisons)


def param_share(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    """Supported if the variant's block holds a share of `part` in [low, high]."""
    part, low, high = claim.args["part"], float(claim.args["low"]), float(claim.args["high"])
    config = study.config_for(claim.args["variant"])
    rows = [r for r in param_breakdown(config.model).rows if r.layer == 0]
    block = sum(r.count for r in rows)
    share = sum(r.count for r in rows if PARAM_GROUPS.get(r.component) == part) / block
    numbers = {"share": share, "low": low, "high": high, "block parameters": block}
    said = f"{part} holds {share:.1%} of one block's {block:,} parameters"
    if low <= share <= high:
        return Verdict(claim, "supported", f"{said} (within {low:.0%} to {high:.0%}).", numbers)
    return Verdict(claim, "contradicted", f"{said} (outside {low:.0%} to {high:.0%}).", numbers)
