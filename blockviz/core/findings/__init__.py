"""Findings: what a run's stored series show, in words, each from a documented rule.

A finding is a function of the numbers a run stored and of the thresholds (`thresholds.py`),
never prose written for a run: each rule reads the series it needs, decides, and states
what it found with the step, the layer or head and the values that show it, the Live tab
and series that draw it, and, where there is one, a suggestion that names config fields to
change and where the idea comes from (a paper, or a rule of thumb; never a measurement).

Three kinds of rule:

- events: `diverged`, `loss_spike`;
- the loss over time: `stalled` (a streak still going at the newest step), `plateau` (a
  loss that went below the unigram entropy and stopped just below it) and `overfitting`
  (the val loss since its lowest evaluation);
- states, read at the newest probe steps (`gradients.py`: gradients and updates;
  `activations.py`: FFN units, attention, the residual stream, output logits): a state rule
  fires only when its condition holds at each of the last PERSIST probe steps, so one noisy
  probe does not make a finding; its "since" is the step from which it has held for
  everything it names;
- a timeline (`induction.py`): when induction heads formed and whether the loss bent
  there, or the largest prefix-matching score so far (always informational).

When no warning or error fires, the `healthy` finding says so explicitly, with what could
not be checked. Every threshold is a row of the findings table (docs/findings.md); the calibration
numbers quoted beside them were measured on runs of this code (docs/findings.md and BENCHMARKS.md
name each config). Pure and torch-free: frames in, dataclasses out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blockviz.core import spec
from blockviz.core.findings import activations, gradients, induction, progress, training
from blockviz.core.findings.base import (
    NO_DATA,
    ONE_BLOCK,
    Finding,
    RunSeries,
)
from blockviz.core.findings.suggestions import labelled
from blockviz.core.findings.thresholds import (
    OVERFIT_EVALS,
    PERSIST,
    PLATEAU_STEPS,
    SPIKE_WINDOW,
    STALL_MIN_STEPS,
)

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    """A rule: what it checks (in words), the function, the steps at which the run recorded
    what it reads, and whether it is a state rule (it needs PERSIST probes in a row)."""

    label: str
    find: Callable[[RunSeries], Finding | None]
    steps: Callable[[RunSeries], Sequence[int]]
    state: bool = False
    # What else the rule needs before it can fire: the shortfall in words, or None.
    needs: Callable[[RunSeries, Sequence[int]], str | None] | None = None

    def gap(self, series: RunSeries) -> str | None:
        """Why this rule could not check the run, as a clause (no data; too few probes
        after step 0, on which a state rule cannot fire; too few logged losses or
        evaluations for what the rule compares), or None when it could."""
        steps = self.steps(series)
        if len(steps) == 0:
            return NO_DATA
        if self.needs is not None and (short := self.needs(series, steps)) is not None:
            return short
        after = sum(int(step) > 0 for step in steps)
        if not self.state or after >= PERSIST:
            return None
        probes = "no probe" if after == 0 else f"only {after} probe{'s' if after > 1 else ''}"
        return f"{probes} after step 0, and a state needs {PERSIST} probes in a row after it"


def _at_least(count: int, what: str, rule: str) -> Callable[[RunSeries, Sequence[int]], str | None]:
    """A `needs` check: at least `count` recorded steps of `what` (logged losses, ...)."""

    def needs(series: RunSeries, steps: Sequence[int]) -> str | None:
        if len(steps) >= count:
            return None
        return f"only {len(steps)} {what}, and {rule} needs {count}"

    return needs


def _span(count: int, rule: str) -> Callable[[RunSeries, Sequence[int]], str | None]:
    """A `needs` check: the logged steps reach step `count - 1` (a streak of `count`)."""

    def needs(series: RunSeries, steps: Sequence[int]) -> str | None:
        newest = int(max(steps))
        if newest + 1 >= count:
            return None
        return f"only {newest + 1} steps so far, and {rule} needs {count}"

    return needs


def _scalar(name: str) -> Callable[[RunSeries], Sequence[int]]:
    return lambda series: series.scalar(name)["step"].tolist()


def _table(
    kind: str, stat: str, component: str | None = None
) -> Callable[[RunSeries], Sequence[int]]:
    return lambda series: series.table(kind, stat, component).index.tolist()


def _one_block(series: RunSeries, steps: Sequence[int]) -> str | None:
    """A model of one block has no depth: no gradients across depth to compare, and no
    earlier layer for an induction head to compose with."""
    return ONE_BLOCK if series.n_layer <= 1 else None


def _stall_steps(series: RunSeries) -> Sequence[int]:
    """Without the text's unigram entropy there is nothing to stall at."""
    return _scalar(spec.TRAIN_LOSS)(series) if series.unigram is not None else []


def _state(
    label: str,
    find: Callable[[RunSeries], Finding | None],
    steps: Callable[[RunSeries], Sequence[int]],
) -> Rule:
    return Rule(label, find, steps, state=True)


# Every rule, in the order docs/findings.md lists them (healthy comes last, from the others).
RULES: dict[str, Rule] = {
    "diverged": Rule("divergence", training.diverged, _scalar(spec.TRAIN_LOSS)),
    "stalled": Rule(
        "a stall at the unigram entropy",
        training.stalled,
        _stall_steps,
        needs=_span(STALL_MIN_STEPS, "a stall"),
    ),
    "plateau": Rule(
        "a plateau below the unigram entropy",
        progress.plateau,
        _stall_steps,
        needs=_span(PLATEAU_STEPS, "a plateau"),
    ),
    "loss_spike": Rule(
        "loss spikes",
        training.loss_spikes,
        _scalar(spec.TRAIN_LOSS),
        # A spike is measured against the median of the SPIKE_WINDOW losses before it.
        needs=_at_least(SPIKE_WINDOW + 1, "logged losses", "a spike"),
    ),
    "gradient_depth": Rule(
        "gradients across depth",
        gradients.gradient_depth,
        _table("component", spec.GRAD_NORM, "block"),
        state=True,
        needs=_one_block,
    ),
    "slow_updates": _state(
        "slow updates",
        gradients.slow_updates,
        _table("component", spec.UPDATE_RATIO, spec.WEIGHTS_COMPONENT),
    ),
    "large_updates": _state(
        "large updates",
        gradients.large_updates,
        _table("component", spec.UPDATE_RATIO, spec.WEIGHTS_COMPONENT),
    ),
    "dead_units": _state(
        "dead FFN units", activations.dead_units, _table("tap", spec.DEAD_FRAC, spec.FFN_TAP)
    ),
    "attention_collapse": _state(
        "attention entropy collapse",
        activations.attention_collapse,
        _table("head", spec.ATTN_ENTROPY),
    ),
    "attention_logit_growth": _state(
        "attention-logit growth",
        activations.attention_logits,
        lambda series: activations.logit_table(series)[0].index.tolist(),
    ),
    "rank_collapse": _state(
        "rank collapse", activations.rank_collapse, _table("tap", spec.TOKEN_COS, spec.STREAM_TAP)
    ),
    "residual_growth": _state(
        "residual-stream growth",
        activations.residual_growth,
        _table("tap", spec.RMS, spec.STREAM_TAP),
    ),
    "massive_activations": _state(
        "massive activations",
        activations.massive_activations,
        _table("tap", spec.MAX_OVER_MEDIAN, spec.STREAM_TAP),
    ),
    "output_logit_growth": _state(
        "output-logit growth", activations.output_logits, _scalar(spec.PROBE_LOG_Z)
    ),
    "induction_heads": Rule(
        "induction heads",
        induction.induction_heads,
        _table("head", spec.PREFIX_SCORE),
        state=True,
        needs=_one_block,
    ),
    "overfitting": Rule(
        "overfitting",
        progress.overfitting,
        _scalar(spec.VAL_LOSS),
        needs=_at_least(OVERFIT_EVALS, "evaluations", "overfitting"),
    ),
}


def _run(name: str, rule: Rule, series: RunSeries) -> Finding | None:
    """One rule's finding; a rule that fails on data it did not expect says so (as an info
    finding), rather than taking the page, `show` or the report down with it."""
    try:
        found = rule.find(series)
    except Exception as exc:
        LOG.warning("findings rule %s failed", name, exc_info=True)
        return Finding(
            name,
            "info",
            f"Could not check {rule.label}",
            f"The {name} rule failed on this run's data ({type(exc).__name__}: {exc}).",
            None,
            spec.TRAIN_LOSS,
        )
    return None if found is None else labelled(name, found)


def gaps(series: RunSeries) -> dict[str, list[str]]:
    """The checks that could not be made on the run, by why: {reason: [label, ...]}."""
    missing: dict[str, list[str]] = {}
    for rule in RULES.values():
        reason = rule.gap(series)
        if reason is not None:
            missing.setdefault(reason, []).append(rule.label)
    return missing


def evaluate(series: RunSeries) -> list[Finding]:
    """Every finding about the run, newest step first; `healthy` when no warning or error
    fired (and the loss is not worse than at initialisation), naming the checks that could
    not be made and why (no data, too few probes)."""
    found = [f for name, rule in RULES.items() if (f := _run(name, rule, series)) is not None]
    serious = any(f.severity in ("error", "warning") for f in found)
    if not serious and not training.worse_than_initial(series):
        found.append(labelled("healthy", training.healthy(series, len(RULES), gaps(series))))
    return sorted(found, key=lambda f: -1 if f.step is None else f.step, reverse=True)
