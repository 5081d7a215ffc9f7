"""Findings: what a run's stored series show, in words, each from a documented rule.

A finding is a function of the numbers a run stored and of the thresholds (`thresholds.py`),
never prose written for a run: each rule reads the series it needs, decides, and states
what it found with the step, the layer or head and the values that show it, the Live tab
and series that draw it, and, where there is one, a suggestion that names config fields to
change and where the idea comes from (a paper, or a rule of thumb; never a measurement).

Three kinds of rule:

- events: `diverged`, `loss_spike`;
- the loss over time: `stalled` (a streak still going at the newest step) and
  `overfitting` (the val loss since its lowest evaluation);
- states, read at the newest probe steps (`internals.py`): a state rule fires only when its
  condition holds at each of the last PERSIST probe steps, so one noisy probe does not make
  a finding; its "since" is the step from which it has held for everything it names.

When no warning or error fires, the `healthy` finding says so explicitly, with what could
not be checked. Every threshold is a row of README's findings table; the calibration
numbers quoted beside them were measured on runs of this code (README and BENCHMARKS.md
name each config). Pure and torch-free: frames in, dataclasses out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from blockviz.core import spec
from blockviz.core.findings import internals, training
from blockviz.core.findings.base import (
    Finding,
    RunSeries,
    Suggestion,
    run_series,
    series_tab,
)
from blockviz.core.findings.thresholds import *  # noqa: F403 (the thresholds, by name)
from blockviz.core.findings.training import headline

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    """A rule: what it checks (in words), the function, and whether a run has its data."""

    label: str
    find: Callable[[RunSeries], Finding | None]
    has_data: Callable[[RunSeries], bool]


def _scalar(name: str) -> Callable[[RunSeries], bool]:
    return lambda series: not series.scalar(name).empty


def _table(kind: str, stat: str, component: str | None = None) -> Callable[[RunSeries], bool]:
    return lambda series: not series.table(kind, stat, component).empty


# Every rule, in the order README's table lists them (healthy comes last, from the others).
RULES: dict[str, Rule] = {
    "diverged": Rule("divergence", training.diverged, _scalar("train/loss")),
    "stalled": Rule(
        "a stall at the unigram entropy",
        training.stalled,
        lambda series: series.unigram is not None and not series.scalar("train/loss").empty,
    ),
    "loss_spike": Rule("loss spikes", training.loss_spikes, _scalar("train/loss")),
    "gradient_depth": Rule(
        "gradients across depth",
        internals.gradient_depth,
        lambda series: (
            series.n_layer > 1 and not series.table("component", "grad_norm", "block").empty
        ),
    ),
    "slow_updates": Rule(
        "slow updates",
        internals.slow_updates,
        _table("component", "update_ratio", spec.WEIGHTS_COMPONENT),
    ),
    "large_updates": Rule(
        "large updates",
        internals.large_updates,
        _table("component", "update_ratio", spec.WEIGHTS_COMPONENT),
    ),
    "dead_units": Rule(
        "dead FFN units", internals.dead_units, _table("tap", "dead_frac", spec.FFN_TAP)
    ),
    "attention_collapse": Rule(
        "attention entropy collapse", internals.attention_collapse, _table("head", "attn_entropy")
    ),
    "attention_logit_growth": Rule(
        "attention-logit growth",
        internals.attention_logits,
        lambda series: not internals.logit_table(series)[0].empty,
    ),
    "rank_collapse": Rule(
        "rank collapse", internals.rank_collapse, _table("tap", "token_cos", spec.STREAM_TAP)
    ),
    "massive_activations": Rule(
        "massive activations",
        internals.massive_activations,
        _table("tap", "max_over_median", spec.STREAM_TAP),
    ),
    "output_logit_growth": Rule(
        "output-logit growth", internals.output_logits, _scalar("probe/log_z")
    ),
    "overfitting": Rule("overfitting", training.overfitting, _scalar("val/loss")),
}


def _run(name: str, rule: Rule, series: RunSeries) -> Finding | None:
    """One rule's finding; a rule that fails on data it did not expect says so (as an info
    finding), rather than taking the page, `show` or the report down with it."""
    try:
        return rule.find(series)
    except Exception as exc:
        LOG.warning("findings rule %s failed", name, exc_info=True)
        return Finding(
            name,
            "info",
            f"Could not check {rule.label}",
            f"The {name} rule failed on this run's data ({type(exc).__name__}: {exc}).",
            None,
            "train/loss",
        )


def evaluate(series: RunSeries) -> list[Finding]:
    """Every finding about the run, newest step first; `healthy` when no warning or error
    fired (and the loss is not worse than at initialisation), naming what could not be
    checked for lack of data."""
    found = [f for name, rule in RULES.items() if (f := _run(name, rule, series)) is not None]
    serious = any(f.severity in ("error", "warning") for f in found)
    if not serious and not training.worse_than_initial(series):
        unchecked = [rule.label for rule in RULES.values() if not rule.has_data(series)]
        found.append(training.healthy(series, len(RULES) - len(unchecked), unchecked))
    return sorted(found, key=lambda f: -1 if f.step is None else f.step, reverse=True)


__all__ = [
    "RULES",
    "Finding",
    "Rule",
    "RunSeries",
    "Suggestion",
    "evaluate",
    "headline",
    "run_series",
    "series_tab",
]
