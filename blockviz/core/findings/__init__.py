"""Findings: what a run's stored series show, in words, each from a documented rule.

A finding is a function of the numbers a run stored and of the thresholds below, never
prose written for a run: each rule reads the series it needs, decides, and states what it
found with the step, the layer or head and the values that show it, the Live tab and
series that draw it, and, where the research literature knows a fix, a suggestion that
names a config field to change (labelled as the literature's, not as a measurement).

Two kinds of rule:

- events: `diverged`, `loss_spike`; and streaks that are still going at the newest step:
  `stalled`, `overfitting`;
- states, read at the newest probe steps: a state rule fires only when its condition holds
  at each of the last PERSIST probe steps, so one noisy probe does not make a finding;
  its "since" is the first probe step of that unbroken streak.

When no warning or error fires, the `healthy` finding says so explicitly. Every threshold is
a constant here and a row of README's findings table; the calibration numbers quoted next
to them were measured on runs of this code (README names each config). Pure and torch-free:
frames in, dataclasses out. The views turn findings into Markdown or plain text.
"""

from __future__ import annotations

from collections.abc import Callable

from blockviz.core.findings import internals, training
from blockviz.core.findings.base import (
    SEVERITIES,
    Finding,
    RunSeries,
    Suggestion,
    run_series,
    series_tab,
)
from blockviz.core.findings.thresholds import *  # noqa: F403 (the thresholds, by name)
from blockviz.core.findings.training import headline

# Every rule, in the order README's table lists them (healthy comes last, from the others).
RULES: dict[str, Callable[[RunSeries], Finding | None]] = {
    "diverged": training.diverged,
    "stalled": training.stalled,
    "loss_spike": training.loss_spikes,
    "gradient_depth": internals.gradient_depth,
    "slow_updates": internals.slow_updates,
    "large_updates": internals.large_updates,
    "dead_units": internals.dead_units,
    "attention_collapse": internals.attention_collapse,
    "attention_logit_growth": internals.attention_logits,
    "rank_collapse": internals.rank_collapse,
    "massive_activations": internals.massive_activations,
    "output_logit_growth": internals.output_logits,
    "overfitting": training.overfitting,
}


def evaluate(series: RunSeries) -> list[Finding]:
    """Every finding about the run, newest step first; `healthy` when no warning fired."""
    found = [finding for rule in RULES.values() if (finding := rule(series)) is not None]
    if not any(f.severity in ("error", "warning") for f in found):
        found.append(training.healthy(series, len(RULES)))
    return sorted(found, key=lambda f: -1 if f.step is None else f.step, reverse=True)


def severity_rank(severity: str) -> int:
    """0 for the most serious severity (error), up to len(SEVERITIES) - 1 (ok)."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


__all__ = [
    "RULES",
    "SEVERITIES",
    "Finding",
    "RunSeries",
    "Suggestion",
    "evaluate",
    "headline",
    "run_series",
    "series_tab",
    "severity_rank",
]
