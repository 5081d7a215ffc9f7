"""The rules that turn a study's runs into verdicts (its per-variant table: study_summary).

A claim names a rule and its arguments (`blockviz.core.studies.Claim`); `judge` applies
the rule to the study's results frame (`blockviz.core.outcomes.results_frame`) and returns
*supported*, *contradicted* or *inconclusive* with a sentence naming the numbers used.
Nothing here knows what any configuration "should" do.

A rule's group of runs is a variant label, or a dict {results column: value} that selects
runs by their swept values ({"norm_position": "post", "warmup": "off"}). "Finished" runs
are those with an outcome (converged, diverged, blew up or stalled); "failed to train"
means diverged, blew up or stalled (`outcomes.FAILED`).

Differences of final val loss between two groups (`core.comparisons`) are computed two
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
  inconclusive. The groups are pooled, so every group, and every variant a group spans,
  needs a finished run first: one with none makes the verdict inconclusive and is named.
- fails_often {groups}: supported if at least half of at least 2 finished runs failed to
  train; contradicted if none did; else inconclusive (pooled as in converges).
- lower_loss {better, worse}: supported if the interval of (better − worse) lies below 0,
  contradicted if above 0, else inconclusive. When one side has no finite loss (every
  finished run diverged) and the other has one, the other side is lower; the sentence
  says what each side's runs did.
- not_worse {better, worse, margin}: "at least as well", tested as non-inferiority with a
  margin in nats: supported if the interval's upper bound of (better − worse) is below
  +margin, contradicted if its lower bound is above +margin, else inconclusive.
- less_sensitive {better, worse, field}: per seed, the learning-rate sensitivity
  (`outcomes.lr_sensitivity`) of the group's runs across the field's values; the interval
  of (better − worse), paired by seed where it can be, decides as in lower_loss.
- lower_max_stable_lr {lower, than, field, factor}: the largest field value at which every
  finished run of the group converged; supported if lower's is at most than's / factor
  (or lower has none while than has one), contradicted if lower's is at least than's,
  else inconclusive.
- fails_deep {deep, reference}: supported if more than half of the deep group's finished
  runs failed to train; contradicted if all converged and the interval of
  (deep − reference) does not lie above 0; else inconclusive.
- sweet_spot {at, field}: contradicted if any other value of the field is lower than
  `at` (interval above 0, or every run of `at` diverged); supported only if `at` is lower
  than every smaller value (interval below 0), no larger value is lower in the mean (not
  merely "not significantly"), and every run of the field has finished; otherwise
  inconclusive, naming what failed.
- param_share {variant, part, low, high}: no training: the share of one block's
  parameters in `part` (a component of `core.params`: attn, ffn or norm) for the variant's
  config; supported inside [low, high], contradicted outside.

A rule with fewer than two finished runs on a side says so and is inconclusive.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from blockviz.core.comparisons import Comparison, compare, interval_text, match_columns
from blockviz.core.outcomes import FAILED, lr_sensitivity, outcome_counts, usable_losses
from blockviz.core.params import param_breakdown
from blockviz.core.spec import PARAM_GROUPS, and_list
from blockviz.core.studies import Claim, StudyDef
from blockviz.core.study_stats import mean_interval

VERDICTS = ("supported", "contradicted", "inconclusive")


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


def _name(group: str | Mapping[str, Any]) -> str:
    if isinstance(group, str):
        return group
    return ", ".join(f"{k} {v}" for k, v in group.items())


def _finished(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["outcome"] != ""]


def _failed(runs: pd.DataFrame) -> int:
    return int(runs["outcome"].isin(FAILED).sum())


def _did(runs: pd.DataFrame) -> str:
    """What the runs' outcomes were: `1 converged, 1 stalled`."""
    return outcome_counts(runs["outcome"].value_counts().to_dict())


def _too_few(claim: Claim, what: str, n: int, unit: str = "finished run(s)") -> Verdict:
    return Verdict(claim, "inconclusive", f"only {n} {unit} of {what}; 2 needed", {})


# ---------------------------------------------------------------------------- rules


def _pooled(
    results: pd.DataFrame, groups: Sequence[str | Mapping[str, Any]]
) -> tuple[pd.DataFrame, str, list[str]]:
    """The groups' finished runs together, the groups' names, and what has no finished run
    yet: a whole group by its name, else each variant it spans that has none."""
    parts, waiting = [], []
    for group in groups:
        runs = select(results, group)
        done = _finished(runs)
        parts.append(done)
        if done.empty:
            waiting.append(_name(group))
        else:
            finished = set(done["variant"])
            waiting += [v for v in dict.fromkeys(runs["variant"]) if v not in finished]
    return pd.concat(parts), "; ".join(_name(g) for g in groups), waiting


def _failures(runs: pd.DataFrame) -> str:
    """`2 failed to train (1 diverged, 1 stalled)`."""
    failed = runs[runs["outcome"].isin(FAILED)]
    return f"{len(failed)} failed to train" + (f" ({_did(failed)})" if len(failed) else "")


def _pooled_counts(claim: Claim, results: pd.DataFrame) -> tuple[pd.DataFrame, str, Verdict | None]:
    """The pooled finished runs, their names, and the verdict when they cannot be judged:
    fewer than 2, or a group (or a variant of one) with no finished run."""
    runs, what, waiting = _pooled(results, claim.args["groups"])
    if len(runs) < 2:
        return runs, what, _too_few(claim, what, len(runs))
    if waiting:
        said = f"no run of {and_list(waiting)} has finished, and the claim covers all of {what}"
        numbers = {"finished": len(runs), "failed": _failed(runs), "waiting": len(waiting)}
        return runs, what, Verdict(claim, "inconclusive", f"{said}.", numbers)
    return runs, what, None


def _converges(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    runs, what, early = _pooled_counts(claim, results)
    if early is not None:
        return early
    n, failed = len(runs), _failed(runs)
    numbers = {"finished": n, "failed": failed, "converged": n - failed}
    said = f"{n - failed} of {n} finished runs of {what} converged"
    if failed == 0:
        return Verdict(claim, "supported", f"{said}.", numbers)
    verdict = "contradicted" if failed > n / 2 else "inconclusive"
    return Verdict(claim, verdict, f"{said}; {_failures(runs)}.", numbers)


def _fails_often(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    runs, what, early = _pooled_counts(claim, results)
    if early is not None:
        return early
    n, failed = len(runs), _failed(runs)
    numbers = {"finished": n, "failed": failed}
    said = f"of {n} finished runs of {what}, {_failures(runs)}"
    if failed >= n / 2:
        return Verdict(claim, "supported", f"{said}.", numbers)
    if failed == 0:
        return Verdict(claim, "contradicted", f"{said}.", numbers)
    return Verdict(claim, "inconclusive", f"{said} (fewer than half).", numbers)


def _contrast(
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
    a, b = usable_losses(_finished(better)), usable_losses(_finished(worse))
    per_run = values == "val_loss"  # else one value per seed (a sensitivity)
    unit = "finished run(s)" if per_run else "seed(s) with the whole sweep finished"
    if len(a) < 2 or len(b) < 2:
        small = names[0] if len(a) < 2 else names[1]
        return _too_few(claim, small, min(len(a), len(b)), unit)
    compared = compare(a, b, names, values, on, "runs" if per_run else "seeds")
    na, nb = compared.counts
    if na == 0 and nb >= 1 and _failed(a) == len(a):
        return _one_sided(claim, "contradicted", (names[0], a), (names[1], b), what)
    if nb == 0 and na >= 1 and _failed(b) == len(b):
        return _one_sided(claim, "supported", (names[1], b), (names[0], a), what)
    if compared.used is None:
        return _too_few(claim, "a side with a finite value", min(na, nb), unit)
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
        f"({_did(without[1])}); {other[0]}: {_did(other[1])}"
    )
    numbers = {f"finished {name}": len(runs) for name, runs in (without, other)}
    numbers.update({f"failed {name}": _failed(runs) for name, runs in (without, other)})
    return Verdict(claim, verdict, f"{said}.", numbers)


def _said(compared: Comparison, what: str) -> str:
    interval = compared.used
    assert interval is not None
    a, b = compared.names
    return f"{what} of {a} minus {b}, {compared.method()}: {interval_text(interval)}"


def _below_zero(claim: Claim, compared: Verdict | Comparison, what: str) -> Verdict:
    """Supported if the interval lies below 0, contradicted if above, else inconclusive."""
    if isinstance(compared, Verdict):
        return compared
    interval, said, numbers = compared.used, _said(compared, what), compared.numbers()
    assert interval is not None
    if interval.high < 0:
        return Verdict(claim, "supported", f"{said}, below zero.", numbers, (compared,))
    if interval.low > 0:
        return Verdict(claim, "contradicted", f"{said}, above zero.", numbers, (compared,))
    return Verdict(claim, "inconclusive", f"{said}, which includes zero.", numbers, (compared,))


def _better_minus_worse(
    claim: Claim, results: pd.DataFrame, study: StudyDef
) -> Verdict | Comparison:
    """The final val loss of the claim's `better` group minus its `worse` group."""
    better, worse = claim.args["better"], claim.args["worse"]
    return _contrast(
        claim,
        select(results, better),
        select(results, worse),
        (_name(better), _name(worse)),
        match_columns(study.swept, better, worse),
    )


def _lower_loss(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    compared = _better_minus_worse(claim, results, study)
    return _below_zero(claim, compared, "final val loss")


def _not_worse(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
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
        why = f"{said}; its upper bound is below {bound}, so {a} does as well as {b} within it"
        return Verdict(claim, "supported", f"{why}.", numbers, (compared,))
    if interval.low > margin:
        why = f"{said}; its lower bound is above {bound}, so {a} does worse than {b} by more"
        return Verdict(claim, "contradicted", f"{why}.", numbers, (compared,))
    return Verdict(claim, "inconclusive", f"{said}, which includes {bound}.", numbers, (compared,))


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
        rows.append({"seed": seed, "sensitivity": value, "outcome": "converged"})
    return pd.DataFrame(rows, columns=["seed", "sensitivity", "outcome"])


def sensitivity_table(results: pd.DataFrame, field_name: str, by: str) -> pd.DataFrame:
    """The learning-rate sensitivity of each value of `by` over `field_name`'s sweep: mean
    over seeds with its 95% t interval (NaN with one seed) and the seeds it rests on."""
    rows = []
    if field_name in results.columns and by in results.columns:
        for value in dict.fromkeys(results[by]):
            per_seed = _sensitivities(results[results[by] == value], field_name)
            interval = mean_interval(per_seed["sensitivity"])
            spread = interval is not None and interval.n > 1
            rows.append(
                {
                    by: value,
                    "sensitivity": interval.mean if interval else math.nan,
                    "low": interval.low if spread else math.nan,
                    "high": interval.high if spread else math.nan,
                    "seeds": interval.n if interval else 0,
                }
            )
    return pd.DataFrame(rows, columns=[by, "sensitivity", "low", "high", "seeds"])


def _less_sensitive(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    better, worse, name = claim.args["better"], claim.args["worse"], claim.args["field"]
    sa = _sensitivities(select(results, better), name)
    sb = _sensitivities(select(results, worse), name)
    what = "learning-rate sensitivity"
    compared = _contrast(
        claim, sa, sb, (_name(better), _name(worse)), values="sensitivity", what=what
    )
    return _below_zero(claim, compared, what)


def max_stable(runs: pd.DataFrame, field_name: str) -> float | None:
    """The largest field value at which every finished run converged (None: none did)."""
    stable = None
    for value, at in _finished(runs).groupby(field_name):
        if len(at) and (at["outcome"] == "converged").all():
            stable = value if stable is None else max(stable, value)
    return stable


def _lower_max_stable(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    lower, than, name = claim.args["lower"], claim.args["than"], claim.args["field"]
    factor = float(claim.args.get("factor", 1.0))
    a, b = select(results, lower), select(results, than)
    if len(_finished(a)) < 2 or len(_finished(b)) < 2:
        return _too_few(
            claim, f"{_name(lower)} or {_name(than)}", min(len(_finished(a)), len(_finished(b)))
        )
    la, lb = max_stable(a, name), max_stable(b, name)
    numbers = {
        f"largest stable {name}, {_name(lower)}": la,
        f"largest stable {name}, {_name(than)}": lb,
        "factor": factor,
    }
    said = f"largest {name} at which every run converged: {_name(lower)} {la}, {_name(than)} {lb}"
    if la is None and lb is not None:
        return Verdict(claim, "supported", f"{said}.", numbers)
    if la is None or lb is None:
        return Verdict(claim, "inconclusive", f"{said}.", numbers)
    if la <= lb / factor:
        return Verdict(claim, "supported", f"{said} (at least {factor:g}× lower).", numbers)
    if la >= lb:
        return Verdict(claim, "contradicted", f"{said}.", numbers)
    return Verdict(claim, "inconclusive", f"{said} (lower, by less than {factor:g}×).", numbers)


def _fails_deep(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    deep, reference = claim.args["deep"], claim.args["reference"]
    runs = _finished(select(results, deep))
    n, failed = len(runs), _failed(runs)
    if n < 2:
        return _too_few(claim, _name(deep), n)
    said = f"of {n} finished runs of {_name(deep)}, {_failures(runs)}"
    numbers: dict[str, Any] = {"finished": n, "failed": failed}
    if failed > n / 2:
        return Verdict(claim, "supported", f"{said}.", numbers)
    compared = _below_zero(
        claim,
        _contrast(
            claim,
            runs,
            select(results, reference),
            (_name(deep), _name(reference)),
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
    unknown: list[Any] = field(default_factory=list)  # too few finished runs to compare
    notes: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)

    def add(self, other: Any, them: str, compared: Verdict | Comparison) -> None:
        """File one comparison of `at` with the value `other` (called `them`)."""
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


def _not_finished(runs: pd.DataFrame) -> str:
    """`2 runs of FFN 8× and 1 run of FFN 16× have not finished` ('' when all have)."""
    waiting = runs.loc[runs["outcome"] == "", "variant"]
    if waiting.empty:
        return ""
    counts = {v: int((waiting == v).sum()) for v in dict.fromkeys(waiting)}
    said = and_list([f"{n} run{'' if n == 1 else 's'} of {v}" for v, n in counts.items()])
    return f"{said} {'has' if len(waiting) == 1 else 'have'} not finished"


def _sweet_spot(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    at, name = claim.args["at"], claim.args["field"]
    here = select(results, at)
    if here.empty:
        raise ValueError(f"no runs of {_name(at)} to judge")
    value = here[name].iloc[0]
    swept = results[results[name].notna()]
    me = _value_name(results, name, value)
    on = match_columns([c for c in study.swept if c != name], at)
    standing = _Standing()
    others = sorted(v for v in swept[name].unique() if v != value)
    for other in others:
        them = _value_name(results, name, other)
        standing.add(
            other, them, _contrast(claim, here, results[results[name] == other], (me, them), on)
        )

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
    if waiting := _not_finished(swept):
        failures.append(waiting)
    if not any(o < value for o in others):
        failures.append(f"no {name} smaller than {value} was run")
    if unclear := sorted(o for o in [*standing.ahead, *standing.behind] if o < value):
        failures.append(f"{me} is not significantly lower than {named(unclear)}")
    if larger := sorted(o for o in standing.behind if o > value):
        by = and_list([f"{standing.behind[o]:.3f}" for o in larger])
        failures.append(
            f"{named(larger)} {are(larger)} lower than {me} in the mean (by {by}), "
            "not significantly"
        )
    if standing.unknown:
        failures.append(f"too few finished runs to compare {me} with {named(standing.unknown)}")
    numbers = {
        **standing.numbers,
        "lower than": ", ".join(map(str, standing.beaten)) or "none",
        "higher than": ", ".join(map(str, [*standing.lower, *standing.outtrained])) or "none",
        "runs not finished": int((swept["outcome"] == "").sum()),
    }
    said = f"final val loss of {me} minus each other {name}: {'; '.join(standing.notes)}"
    if failures:
        verdict = "contradicted" if standing.lower or standing.outtrained else "inconclusive"
        why = "; ".join(failures)
        why = why[0].upper() + why[1:]
    else:
        verdict = "supported"
        why = (
            f"{me} is lower than every smaller {name}, no larger one is lower in the mean, "
            "and every run finished"
        )
    return Verdict(claim, verdict, f"{said}. {why}.", numbers, tuple(standing.comparisons))


def _param_share(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
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


RULES: dict[str, Callable[[Claim, pd.DataFrame, StudyDef], Verdict]] = {
    "converges": _converges,
    "fails_often": _fails_often,
    "lower_loss": _lower_loss,
    "not_worse": _not_worse,
    "less_sensitive": _less_sensitive,
    "lower_max_stable_lr": _lower_max_stable,
    "fails_deep": _fails_deep,
    "sweet_spot": _sweet_spot,
    "param_share": _param_share,
}


def judge(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    """The claim's rule applied to the study's results."""
    if claim.rule not in RULES:
        raise ValueError(f"claim rule {claim.rule!r} is not one of {', '.join(RULES)}")
    if results.empty and claim.rule != "param_share":
        return Verdict(claim, "inconclusive", "No run has finished yet", {})
    try:
        verdict = RULES[claim.rule](claim, results, study)
    except KeyError as exc:
        raise ValueError(f"claim rule {claim.rule!r} needs the argument {exc}") from None
    # A reason is shown as a sentence: it starts with a capital, whatever the rule wrote.
    reason = verdict.reason[:1].upper() + verdict.reason[1:]
    return dataclasses.replace(verdict, reason=reason)


def verdicts(study: StudyDef, results: pd.DataFrame) -> list[Verdict]:
    """Every claim of the study, judged."""
    return [judge(claim, results, study) for claim in study.claims]


__all__: Sequence[str] = (
    "FAILED",
    "RULES",
    "Verdict",
    "judge",
    "select",
    "verdicts",
)
