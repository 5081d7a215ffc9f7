"""Rules over the losses: diverged, stalled, loss spikes; the headline and the healthy
finding (the plateau and overfitting, after progress, are in `progress.py`). Torch-free.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.core.divergence import render_divergence, summarize_divergence
from blockviz.core.findings.base import (
    DIVERGENCE,
    NO_DATA,
    ONE_BLOCK,
    SPIKE,
    Finding,
    RunSeries,
    blocks,
    finite_rows,
    layer_name,
    layer_names,
    num,
    replay_found,
    step_text,
)
from blockviz.core.findings.gradients import update_sizes
from blockviz.core.findings.suggestions import (
    clip,
    probe_every_step,
    probe_more,
    stability,
    unstall,
)
from blockviz.core.findings.thresholds import (
    GROWTH_FACTOR,
    SPIKE_FACTOR,
    SPIKE_WINDOW,
    STALL_MARGIN,
    STALL_MIN_STEPS,
    STALL_NEAR,
    STALL_WINDOW,
)
from blockviz.core.probe_schedule import probe_steps


def diverged(series: RunSeries) -> Finding | None:
    """The step, the last finite loss, the first non-finite quantity and which layer's
    gradient grew first (from the probe steps before the divergence)."""
    loss = series.scalar(spec.TRAIN_LOSS)
    nonfinite = loss[~np.isfinite(loss["value"].to_numpy(dtype=float))]
    if series.status != "diverged" and nonfinite.empty:
        return None
    facts = summarize_divergence(
        series.scalars, diverged_step=series.diverged_step, error=series.error
    )
    step = facts.step
    words = [render_divergence(facts)]
    grads = blocks(series.table("component", spec.GRAD_NORM, "block"), series.n_layer)
    evidence: dict[str, Any] = {
        "step": step,
        "last_finite_loss": facts.last_finite_loss,
        "last_finite_step": facts.last_finite_step,
        "nonfinite": dict(facts.nonfinite),
    }
    bad_layers = (
        grads[~np.isfinite(grads.to_numpy(dtype=float)).all(axis=1)] if len(grads) else grads
    )
    if len(bad_layers):
        first = bad_layers.iloc[0]
        broken = [int(c) for c, v in first.items() if not math.isfinite(float(v))]
        words.append(
            f"The first non-finite gradient norm: {layer_names(broken, series.n_layer)} at "
            f"{step_text(int(bad_layers.index[0]))}."
        )
        evidence["first_nonfinite_gradients"] = {"step": int(bad_layers.index[0]), "layers": broken}
    finite = finite_rows(grads)
    if step is not None:
        finite = finite[finite.index <= step]
    suggestion = None
    every_step = series.config is not None and series.config.train.probe_interval == 1
    if len(finite) < 2:
        probed = ", ".join(step_text(int(s)) for s in finite.index) or "no step"
        if grads.empty:
            words.append("No block gradient norm was recorded before it diverged.")
        elif every_step and len(bad_layers):
            words.append(
                f"Probed at every step, its gradients were finite only at {probed} and went "
                "non-finite at the next: none grew before the others."
            )
        else:
            words.append(
                f"Its gradients were probed at {probed} before it diverged, too few to tell "
                "which layer's gradient grew first."
            )
            if not every_step:
                suggestion = probe_every_step()
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            growth = finite / finite.iloc[0]  # a block at 0 at first has no growth factor
        growth = growth.where(np.isfinite(growth))
        grew = growth[(growth >= GROWTH_FACTOR).any(axis=1)]
        if len(grew):
            at = int(grew.index[0])
            layer = int(grew.iloc[0].idxmax())
            factor = float(grew.iloc[0].max())
            first_probe = step_text(int(finite.index[0]))
            words.append(
                f"The first gradient to grow {GROWTH_FACTOR:g}× its {first_probe} "
                f"value was {layer_name(layer, series.n_layer)}'s, at {step_text(at)} "
                f"({num(factor)}×: {num(float(finite.loc[at, layer]))})."
            )
            evidence["grew_first"] = {"layer": layer, "step": at, "factor": factor}
        elif growth.iloc[-1].notna().any():
            last = growth.iloc[-1]
            layer = int(last.idxmax())
            words.append(
                f"No block's gradient grew {GROWTH_FACTOR:g}× before it diverged; the most, "
                f"{layer_name(layer, series.n_layer)}'s, {num(float(last.max()))}× by "
                f"{step_text(int(growth.index[-1]))}."
            )
            evidence["grew_most"] = {"layer": layer, "factor": float(last.max())}
    if suggestion is None:
        suggestion = stability(series)
    replayed = replay_found(series, DIVERGENCE, [step] if step is not None else [])
    if replayed:
        words.append(replayed)
        evidence["replay"] = replayed
    title = f"Diverged at step {step:,}" if step is not None else "Diverged"
    return Finding(
        "diverged", "error", title, " ".join(words), step, spec.TRAIN_LOSS, evidence, suggestion
    )


def stalled(series: RunSeries) -> Finding | None:
    """The train loss's running median has sat at or above the unigram entropy for
    STALL_MIN_STEPS steps and fell by less than STALL_MARGIN over the last of them."""
    if series.unigram is None or not math.isfinite(series.unigram):
        return None
    loss = series.scalar(spec.TRAIN_LOSS)
    values = loss["value"].to_numpy(dtype=float)
    if len(loss) < STALL_WINDOW or not np.isfinite(values).all():
        return None
    median = pd.Series(values).rolling(STALL_WINDOW, min_periods=1).median().to_numpy()
    low = series.unigram - STALL_MARGIN
    level = float(median[-1])
    near = level <= series.unigram + STALL_NEAR
    # At the unigram entropy: within the band since; above it: never below its floor.
    inside = (median >= low) & (median <= series.unigram + STALL_NEAR) if near else median >= low
    if not inside[-1]:
        return None
    outside = np.flatnonzero(~inside)
    start = int(outside[-1]) + 1 if outside.size else 0
    steps = loss["step"].to_numpy()
    since, newest = int(steps[start]), int(steps[-1])
    if newest - since < STALL_MIN_STEPS:
        return None
    # A loss still coming down (a low learning rate, a long warm-up) is slow, not stalled.
    before = int(np.searchsorted(steps, newest - STALL_MIN_STEPS, side="right")) - 1
    if median[before] - level >= STALL_MARGIN:
        return None
    at = level <= series.unigram + STALL_MARGIN
    where = "at the unigram entropy" if at else "above the unigram entropy"
    text = (
        f"Since {step_text(since)} the train loss (running median of {STALL_WINDOW} logged values) "
        f"has stayed {where}: {num(level)} at {step_text(newest)}, against "
        f"{num(series.unigram)} for predicting each character by its frequency alone"
    )
    text += ". " if at else f" ({num(level - series.unigram)} nats above it). "
    if at:
        text += "It has learned the characters' frequencies and nothing more."
    elif worse_than_uniform(series, level):
        text += (
            f"That is worse than the loss at initialisation, {num(series.init_loss)} "
            "(a uniform guess over the vocabulary)."
        )
    else:
        text += "It has not even learned the characters' frequencies."
    val = series.scalar(spec.VAL_LOSS)
    if len(val):
        evaluated, value = int(val["step"].iloc[-1]), float(val["value"].iloc[-1])
        text += f" Val loss at {step_text(evaluated)}: {num(value)}."
    sizes = update_sizes(series)
    if sizes is not None and sizes.size == "normal":
        text += (
            f" At {step_text(sizes.step)} every block's weight matrices move by "
            f"{num(float(sizes.per_lr.min()))} to {num(float(sizes.per_lr.max()))} × lr of "
            f"their norm per step (lr {num(sizes.lr)}): normal-sized steps for the lr, not "
            "blocks that barely learn."
        )
    return Finding(
        "stalled",
        "warning",
        f"Stalled {where} since step {since:,}",
        text,
        since,
        spec.TRAIN_LOSS,
        {"since": since, "median_loss": level, "unigram": series.unigram, "step": newest},
        unstall(series, None if sizes is None else sizes.size),
    )


def worse_than_uniform(series: RunSeries, level: float) -> bool:
    """Whether a loss level lies above the loss at initialisation (ln V) plus the margin."""
    return series.init_loss is not None and level > series.init_loss + STALL_MARGIN


def median_before(values: np.ndarray) -> np.ndarray:
    """Each logged loss's baseline in the spike test: the median of the SPIKE_WINDOW logged
    losses before it (NaN while fewer came before). The flight recorder's replay start
    (`core.flight_start`) reads the loss's onset with the same test."""
    return pd.Series(values).rolling(SPIKE_WINDOW).median().shift(1).to_numpy()


def loss_spikes(series: RunSeries) -> Finding | None:
    """Logged train losses far above the median of the window before them."""
    loss = series.scalar(spec.TRAIN_LOSS)
    values = loss["value"].to_numpy(dtype=float)
    if len(values) <= SPIKE_WINDOW:
        return None
    before = median_before(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = values / before
    spiking = np.isfinite(values) & np.isfinite(ratio) & (ratio > SPIKE_FACTOR)
    hits = np.flatnonzero(spiking)
    if not hits.size:
        return None
    steps = loss["step"].to_numpy()
    worst = int(hits[np.argmax(ratio[hits])])
    first = int(steps[hits[0]])
    count = len(hits)
    spikes = "a loss spike" if count == 1 else f"{count} loss spikes"
    text = (
        f"{spikes.capitalize()}: the train loss rose above {SPIKE_FACTOR:g}× the median of the "
        f"{SPIKE_WINDOW} logged values before it"
        + (f", first at {step_text(first)}" if count > 1 else "")
        + f". The largest at {step_text(int(steps[worst]))}: {num(values[worst])} against a "
        f"median of {num(before[worst])} ({num(ratio[worst])}×)."
    )
    replayed = replay_found(series, SPIKE, steps[hits])
    if replayed:
        text += " " + replayed
    suggestion = None
    if series.config is not None and series.config.train.grad_clip == 0:
        suggestion = clip()
    return Finding(
        "loss_spike",
        "warning",
        f"{spikes.capitalize()}, the largest at step {int(steps[worst]):,}",
        text,
        int(steps[worst]),
        spec.TRAIN_LOSS,
        {
            "steps": [int(s) for s in steps[hits][:20]],
            "count": count,
            "largest": {
                "step": int(steps[worst]),
                "loss": float(values[worst]),
                "median": float(before[worst]),
            },
        },
        suggestion,
    )


def healthy(series: RunSeries, total: int, gaps: dict[str, list[str]]) -> Finding:
    """None of the rules that could check the run fired: said in words, with how far they
    reached and every check that could not be made and why (`gaps`: {reason: labels}; no
    data: a run recorded before a statistic existed, a model without attention or an FFN;
    too few probes after step 0 for a state rule). It never says a check passed that could
    not run: with too few probes it is an info finding that names what it could not check."""
    loss = series.scalar(spec.TRAIN_LOSS)
    probes = series.table("component", spec.GRAD_NORM, "block")
    newest = int(loss["step"].iloc[-1]) if len(loss) else None
    probe = int(probes.index[-1]) if len(probes) else None
    reach = f" up to {step_text(newest)}" if newest is not None else ""
    if probe is not None:
        reach += f" (latest probe: {step_text(probe)})"
    unmade = [label for labels in gaps.values() for label in labels]
    checked = total - len(unmade)
    few = {reason: labels for reason, labels in gaps.items() if reason not in (NO_DATA, ONE_BLOCK)}
    if not unmade:
        text = f"None of the {checked} checks found a problem{reach}."
    elif few:
        text = f"None of the {checked} checks that could be made found a problem{reach}."
    else:
        text = f"None of the {checked} checks this run has the data for found a problem{reach}."
    for reason, labels in few.items():
        text += (
            f" Could not check {', '.join(labels)}: {reason}, so a problem there would not show."
        )
    if NO_DATA in gaps:
        text += " Not checked, no data recorded: " + ", ".join(gaps[NO_DATA]) + "."
    if ONE_BLOCK in gaps:
        text += f" Not checked, {ONE_BLOCK}: " + ", ".join(gaps[ONE_BLOCK]) + "."
    upcoming = next_probe(series, probe)
    if few and upcoming is not None:
        text += f" The next probe is at {step_text(upcoming)}."
    not_made = sum(len(labels) for labels in few.values())
    kinds = (
        ("probe", "probes"),
        ("logged losses", "logged losses"),
        ("evaluations", "evaluations"),
    )
    kinds += (("steps so far", "steps"),)
    lacking = ", ".join(
        dict.fromkeys("too few " + kind for reason in few for mark, kind in kinds if mark in reason)
    )
    title = f"{not_made} of {total} checks could not be made" + (f": {lacking}" if lacking else "")
    title = title if few else "Healthy"
    return Finding(
        "healthy",
        "info" if few else "ok",
        title,
        text,
        newest,
        spec.TRAIN_LOSS,
        {
            "checks": checked,
            "unchecked": unmade,
            "gaps": gaps,
            "step": newest,
            "probe_step": probe,
        },
        probe_more(series) if any("probe" in reason for reason in few) else None,
    )


def next_probe(series: RunSeries, newest: int | None) -> int | None:
    """The step of a running run's next probe (None when it has finished or none is due)."""
    if series.status not in ("running", "queued") or series.config is None:
        return None
    train = series.config.train
    after = -1 if newest is None else newest
    upcoming = [s for s in probe_steps(train.max_steps, train.probe_interval) if s > after]
    return upcoming[0] if upcoming else None


def worse_than_initial(series: RunSeries) -> bool:
    """Whether the train loss's recent running median is worse than a uniform guess."""
    loss = series.scalar(spec.TRAIN_LOSS)
    values = loss["value"].to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    return bool(len(values)) and worse_than_uniform(
        series, float(np.median(values[-STALL_WINDOW:]))
    )


def headline(series: RunSeries, findings: list[Finding]) -> Finding:
    """What the run is doing, in one line: diverged, stalled, or whether its loss falls.

    A diverged, stalled or plateau finding is the headline; otherwise the loss speaks: "Trains"
    once the train loss's running median is below the unigram entropy (minus the stall
    margin), else how far it has come.
    """
    for rule in ("diverged", "stalled", "plateau"):
        for finding in findings:
            if finding.rule == rule:
                return finding
    loss = series.scalar(spec.TRAIN_LOSS)
    loss = loss[np.isfinite(loss["value"].to_numpy(dtype=float))]
    if loss.empty:
        return Finding(
            "state", "info", "No loss yet", "No train loss logged yet.", None, spec.TRAIN_LOSS
        )
    level = float(loss["value"].tail(STALL_WINDOW).median())
    first, newest = float(loss["value"].iloc[0]), int(loss["step"].iloc[-1])
    trained = series.unigram is not None and level < series.unigram - STALL_MARGIN
    worse = worse_than_uniform(series, level)
    text = (
        f"Train loss {num(level)} at {step_text(newest)} (running median of the last "
        f"{min(STALL_WINDOW, len(loss))} logged values), from {num(first)} at "
        f"{step_text(int(loss['step'].iloc[0]))}"
    )
    if worse:
        text += f"; above the loss at initialisation, {num(series.init_loss)} (a uniform guess)"
    elif series.unigram is not None:
        relation = "below" if trained else "not yet below"
        text += f"; {relation} the unigram entropy, {num(series.unigram)}"
    title = "Worse than a uniform guess" if worse else "Trains" if trained else "Learning"
    return Finding(
        "state",
        "warning" if worse else "ok" if trained else "info",
        title,
        text + ".",
        newest,
        spec.TRAIN_LOSS,
        {"loss": level, "step": newest, "first_loss": first},
    )
