"""Per-variant summaries of a study, and the rules that turn its runs into verdicts.

A claim names a rule and its arguments (`blockviz.core.studies.Claim`); `judge` applies
the rule to the study's results frame (`blockviz.core.outcomes.results_frame`) and returns
*supported*, *contradicted* or *inconclusive* with a sentence naming the numbers used.
Nothing here knows what any configuration "should" do.

A rule's group of runs is a variant label, or a dict {results column: value} that selects
runs by their swept values ({"norm_position": "post", "warmup": "off"}). "Finished" runs
are those with an outcome (converged, diverged, blew up or stalled); "failed to train"
means diverged, blew up or stalled (`outcomes.FAILED`). Differences of mean final val
loss use Welch's 95% interval (`study_stats.difference_interval`): a difference counts
as real only when its interval excludes zero. The rules:

- converges {groups}: supported if at least 2 runs finished and all converged;
  contradicted if more than half of the finished runs failed to train; else inconclusive.
- fails_often {groups}: supported if at least half of at least 2 finished runs failed to
  train; contradicted if none did; else inconclusive.
- lower_loss {better, worse}: supported if the interval of (better − worse) lies below 0,
  contradicted if above 0, else inconclusive. When one side has no finite loss because all
  its finished runs diverged while the other side converged, the converged side is better.
- less_sensitive {better, worse, field}: per seed, the learning-rate sensitivity
  (`outcomes.lr_sensitivity`) of the group's runs across the field's values; the Welch
  interval of (better − worse) decides as in lower_loss.
- lower_max_stable_lr {lower, than, field, factor}: the largest field value at which every
  finished run of the group converged; supported if lower's is at most than's / factor
  (or lower has none while than has one), contradicted if lower's is at least than's,
  else inconclusive.
- fails_deep {deep, reference}: supported if more than half of the deep group's finished
  runs failed to train; contradicted if all converged and the interval of
  (deep − reference) does not lie above 0; else inconclusive.
- sweet_spot {at, field}: supported if `at` is lower than every smaller field value (each
  interval below 0) and no larger value is lower than it; contradicted if a larger or a
  smaller value is lower than `at`; else inconclusive.
- param_share {variant, part, low, high}: no training: the share of one block's
  parameters in `part` (a component of `core.params`: attn, ffn or norm) for the variant's
  config; supported inside [low, high], contradicted outside.

A rule with fewer than two finished runs on a side says so and is inconclusive.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from blockviz.core.outcomes import FAILED, OUTCOMES, lr_sensitivity
from blockviz.core.params import param_breakdown
from blockviz.core.spec import PARAM_GROUPS
from blockviz.core.studies import Claim, StudyDef
from blockviz.core.study_stats import Interval, difference_interval, mean_interval

VERDICTS = ("supported", "contradicted", "inconclusive")
# A summary column per outcome ("blew up" is "blew_up", a name itertuples keeps).
OUTCOME_COLUMNS = {outcome: outcome.replace(" ", "_") for outcome in OUTCOMES}
SUMMARY_COLUMNS = (
    "variant",
    "runs",
    "finished",
    *OUTCOME_COLUMNS.values(),
    "mean",
    "sd",
    "low",
    "high",
    "train_loss",
    "n_params",
    "time_s",
)


@dataclass(frozen=True)
class Verdict:
    """A claim judged on the runs: the verdict, why, and the numbers it rests on."""

    claim: Claim
    verdict: str
    reason: str
    numbers: Mapping[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------- summary


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """One row per variant (in the order its runs appear) with counts and val-loss stats."""
    rows = []
    for variant in dict.fromkeys(results["variant"]) if not results.empty else ():
        runs = results[results["variant"] == variant]
        done = runs[runs["outcome"] != ""]
        interval = mean_interval(done["val_loss"])
        rows.append(
            {
                "variant": variant,
                "runs": len(runs),
                "finished": len(done),
                **{
                    column: int((done["outcome"] == outcome).sum())
                    for outcome, column in OUTCOME_COLUMNS.items()
                },
                "mean": interval.mean if interval else math.nan,
                "sd": interval.sd if interval and interval.n > 1 else math.nan,
                "low": interval.low if interval and interval.n > 1 else math.nan,
                "high": interval.high if interval and interval.n > 1 else math.nan,
                # A diverged run's last finite train loss (thousands) says nothing typical.
                "train_loss": _mean(done.loc[done["outcome"] != "diverged", "train_loss"]),
                "n_params": _mean(runs["n_params"]),
                "time_s": _mean(done["time_s"]),
            }
        )
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def _mean(values: pd.Series) -> float:
    interval = mean_interval(values)
    return interval.mean if interval else math.nan


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


def _too_few(claim: Claim, what: str, n: int, unit: str = "finished run(s)") -> Verdict:
    return Verdict(claim, "inconclusive", f"only {n} {unit} of {what}; 2 needed", {})


def _interval_text(interval: Interval) -> str:
    return f"{interval.mean:+.3f} (95% interval {interval.low:+.3f} to {interval.high:+.3f})"


# ---------------------------------------------------------------------------- rules


def _converges(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    runs = _finished(pd.concat([select(results, g) for g in claim.args["groups"]]))
    what = "; ".join(_name(g) for g in claim.args["groups"])
    n, failed = len(runs), _failed(runs)
    numbers = {"finished": n, "failed": failed, "converged": n - failed}
    if n < 2:
        return _too_few(claim, what, n)
    said = f"{n - failed} of {n} finished runs of {what} converged"
    if failed == 0:
        return Verdict(claim, "supported", f"{said}.", numbers)
    if failed > n / 2:
        return Verdict(claim, "contradicted", f"{said}; {failed} failed to train.", numbers)
    return Verdict(claim, "inconclusive", f"{said}; {failed} failed to train.", numbers)


def _fails_often(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    runs = _finished(pd.concat([select(results, g) for g in claim.args["groups"]]))
    what = "; ".join(_name(g) for g in claim.args["groups"])
    n, failed = len(runs), _failed(runs)
    numbers = {"finished": n, "failed": failed}
    if n < 2:
        return _too_few(claim, what, n)
    said = f"{failed} of {n} finished runs of {what} failed to train"
    if failed >= n / 2:
        return Verdict(claim, "supported", f"{said}.", numbers)
    if failed == 0:
        return Verdict(claim, "contradicted", f"{said}.", numbers)
    return Verdict(claim, "inconclusive", f"{said} (fewer than half).", numbers)


def _compare(
    claim: Claim,
    better: pd.DataFrame,
    worse: pd.DataFrame,
    names: tuple[str, str],
    values: str = "val_loss",
    what: str = "final val loss",
) -> Verdict:
    """Welch's interval of mean(better) − mean(worse) on a column of two groups."""
    a, b = _finished(better), _finished(worse)
    unit = "finished run(s)" if values == "val_loss" else "seed(s) with the whole sweep finished"
    if len(a) < 2 or len(b) < 2:
        small = names[0] if len(a) < 2 else names[1]
        return _too_few(claim, small, min(len(a), len(b)), unit)
    fa, fb = a[values].dropna(), b[values].dropna()
    fa, fb = fa[fa.map(math.isfinite)], fb[fb.map(math.isfinite)]
    if len(fa) == 0 and len(fb) >= 1 and _failed(a) == len(a):
        return Verdict(
            claim,
            "contradicted",
            f"every run of {names[0]} diverged or stalled; {names[1]} did not.",
            {"finished": len(a)},
        )
    if len(fb) == 0 and len(fa) >= 1 and _failed(b) == len(b):
        return Verdict(
            claim,
            "supported",
            f"every run of {names[1]} diverged or stalled; {names[0]} did not.",
            {"finished": len(b)},
        )
    interval = difference_interval(fa, fb)
    if interval is None:
        return _too_few(claim, "a side with a finite value", min(len(fa), len(fb)))
    numbers = {
        "difference": interval.mean,
        "low": interval.low,
        "high": interval.high,
        f"mean {names[0]}": float(fa.mean()),
        f"mean {names[1]}": float(fb.mean()),
        "n": f"{len(fa)} and {len(fb)}",
    }
    said = f"{what} of {names[0]} minus {names[1]}: {_interval_text(interval)}"
    if interval.high < 0:
        return Verdict(claim, "supported", f"{said}, below zero.", numbers)
    if interval.low > 0:
        return Verdict(claim, "contradicted", f"{said}, above zero.", numbers)
    return Verdict(claim, "inconclusive", f"{said}, which includes zero.", numbers)


def _lower_loss(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    better, worse = claim.args["better"], claim.args["worse"]
    return _compare(
        claim, select(results, better), select(results, worse), (_name(better), _name(worse))
    )


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
    return _compare(
        claim, sa, sb, (_name(better), _name(worse)), "sensitivity", "learning-rate sensitivity"
    )


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
    said = f"{failed} of {n} finished runs of {_name(deep)} failed to train"
    numbers: dict[str, Any] = {"finished": n, "failed": failed}
    if failed > n / 2:
        return Verdict(claim, "supported", f"{said}.", numbers)
    compared = _compare(claim, runs, select(results, reference), (_name(deep), _name(reference)))
    numbers.update(compared.numbers)
    if failed == 0 and compared.verdict in ("supported", "inconclusive"):
        # Not above zero: the deep runs trained no worse than the reference.
        return Verdict(claim, "contradicted", f"{said}; {compared.reason}", numbers)
    return Verdict(claim, "inconclusive", f"{said}; {compared.reason}", numbers)


def _sweet_spot(claim: Claim, results: pd.DataFrame, study: StudyDef) -> Verdict:
    at, name = claim.args["at"], claim.args["field"]
    here = select(results, at)
    if here.empty:
        raise ValueError(f"no runs of {_name(at)} to judge")
    value = here[name].iloc[0]
    others = sorted(v for v in results[name].dropna().unique() if v != value)
    beats, loses, notes = [], [], []
    for other in others:
        verdict = _compare(
            claim, here, results[results[name] == other], (_name(at), f"{name} {other}")
        )
        notes.append(f"vs {other}: {verdict.numbers.get('difference', math.nan):+.3f}")
        if verdict.verdict == "supported":
            beats.append(other)
        elif verdict.verdict == "contradicted":
            loses.append(other)
    smaller = [o for o in others if o < value]
    numbers = {
        "lower than": ", ".join(map(str, beats)) or "none",
        "higher than": ", ".join(map(str, loses)) or "none",
    }
    said = (
        f"final val loss of {_name(at)} minus each other {name} (mean): {'; '.join(notes)}; "
        f"its interval lies below zero against {name} {numbers['lower than']} and above zero "
        f"against {numbers['higher than']}"
    )
    if loses:
        return Verdict(claim, "contradicted", f"{said}.", numbers)
    if set(smaller) <= set(beats) and smaller:
        return Verdict(claim, "supported", f"{said}.", numbers)
    return Verdict(claim, "inconclusive", f"{said}.", numbers)


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
        return Verdict(claim, "inconclusive", "no run has finished yet", {})
    try:
        return RULES[claim.rule](claim, results, study)
    except KeyError as exc:
        raise ValueError(f"claim rule {claim.rule!r} needs the argument {exc}") from None


def verdicts(study: StudyDef, results: pd.DataFrame) -> list[Verdict]:
    """Every claim of the study, judged."""
    return [judge(claim, results, study) for claim in study.claims]


__all__: Sequence[str] = (
    "FAILED",
    "RULES",
    "Verdict",
    "judge",
    "select",
    "summarize",
    "verdicts",
)
