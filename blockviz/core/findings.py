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

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.core.config import RunConfig
from blockviz.core.divergence import format_nonfinite, render_divergence, summarize_divergence
from blockviz.core.outcomes import STALL_MARGIN

SEVERITIES = ("error", "warning", "info", "ok")  # most serious first

# --------------------------------------------------------------------------- thresholds

# A state rule must hold at this many probe steps in a row, ending at the newest.
PERSIST = 2
# diverged: a layer's gradient "grew" once its norm is this many times its first probe's.
GROWTH_FACTOR = 10.0
# stalled: the running median of the last STALL_WINDOW logged train losses has stayed at or
# above the unigram entropy minus STALL_MARGIN (the study outcome's margin, 0.1 nat) for at
# least STALL_MIN_STEPS steps, up to the newest. (A healthy baby-cpu run with its 100-step
# warm-up spends 39 steps there on its way down; the Post-LN starter 281 of its 300.)
STALL_WINDOW = 20
STALL_MIN_STEPS = 100
# "at the unigram entropy" while the median is at most this far above it, else "above".
STALL_NEAR = 0.5
# loss_spike: a logged train loss above SPIKE_FACTOR times the median of the SPIKE_WINDOW
# logged losses before it (as Lightning's SpikeDetection compares a loss with a running
# mean over a window; a median is not dragged up by the spike's neighbours). The largest
# ratio in a healthy 2,000-step baby-cpu run was 1.31.
SPIKE_WINDOW = 50
SPIKE_FACTOR = 1.5
# gradient_depth: first block's gradient norm / last block's beyond this either way.
# (Healthy baby-cpu: 0.7 to 2.0; the Post-LN starter: 1e-5; Pre-LN at lr 3e-2: up to 183
# at single probes, under 50 at most.)
GRAD_DEPTH_RATIO = 100.0
# slow_updates: a block's weight matrices move less than UPDATE_LOW × lr of their norm per
# step. AdamW moves each weight by about lr·m̂/√v̂ plus lr·weight_decay·θ, so weight decay
# alone gives ‖Δθ‖/‖θ‖ = lr·weight_decay (0.1·lr at the default): a layer at about that
# level learns nothing from its gradient. (Healthy runs here: 1 to 9 × lr.)
UPDATE_LOW = 0.2
# large_updates: ‖Δθ‖/‖θ‖ above this at a step other than step 0 (AdamW's first update
# moves every weight by exactly lr, whatever the gradient). Healthy runs here stay below
# 0.03; Pre-LN tiny at lr 0.3 reaches 0.09 while it stalls.
UPDATE_HIGH = 0.05
# dead_units: more than this fraction of a layer's FFN units zero on every probe token.
DEAD_FRAC = 0.25
# attention_collapse: every head of a layer below this mean entropy (nats).
ENTROPY_FLOOR = 0.1
# attention_logit_growth: a head's largest logit above this and at least
# LOGIT_GROWTH times its first probe's (healthy baby-cpu at lr 1e-3: 24 at most).
ATTN_LOGIT_MAX = 50.0
LOGIT_GROWTH = 10.0
# rank_collapse: the mean cosine similarity between positions at a block's output.
RANK_COS = 0.99
# massive_activations: largest |activation| at least MASSIVE_RATIO times the median and at
# least MASSIVE_ABS in absolute value. Our reading of Sun et al. 2024, who report a few
# activations of large language models up to 100,000 times larger than the others; no
# run of this project has reached it (the largest ratio seen: 7,000, in a blow-up).
MASSIVE_RATIO = 1000.0
MASSIVE_ABS = 100.0
# output_logit_growth: largest |output logit| or |mean log Z| above these (healthy runs
# here: at most 16 and 11; Gemma 2 caps logits at 30).
OUTPUT_LOGIT_MAX = 100.0
LOG_Z_MAX = 50.0
# overfitting: the val loss has risen OVERFIT_RISE above its lowest evaluation and the
# val − train gap is larger than it was there (train: mean of the last OVERFIT_TRAIN
# logged losses up to each evaluation); needs OVERFIT_EVALS evaluations.
OVERFIT_RISE = 0.05
OVERFIT_TRAIN = 50
OVERFIT_EVALS = 3

# ---------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Suggestion:
    """Something to try: config fields and values, why, and where the idea comes from."""

    text: str
    changes: dict[str, Any] = field(default_factory=dict)
    source: str = ""


@dataclass(frozen=True)
class Finding:
    """One statement about a run: which rule, how serious, the words and the evidence.

    `series` names what draws it (a scalar such as "train/loss", or a layer statistic such
    as "grad_norm", "dead_frac", "attn_logit_max"); `step` is where a chart marks it.
    """

    rule: str
    severity: str
    title: str
    text: str
    step: int | None
    series: str
    evidence: dict[str, Any] = field(default_factory=dict)
    suggestion: Suggestion | None = None

    @property
    def tab(self) -> str:
        """The Live tab that draws `series`."""
        return series_tab(self.series)


def series_tab(series: str) -> str:
    """The Live tab of a scalar or layer statistic."""
    if "/" in series:
        return "Loss"
    if series in ("grad_norm", "param_norm"):
        return "Gradients"
    if series == "update_ratio":
        return "Updates"
    if series in spec.HEAD_STATS:
        return "Attention"
    return "Activations"


@dataclass(frozen=True)
class RunSeries:
    """What the rules read of one run: its row's facts and its stored series.

    `scalars` has columns step, name, value; `layers` has step, layer, kind, component,
    stat, value (the rows a rule needs: component grad_norm / update_ratio, tap and head
    statistics). Either may hold more; rules select.
    """

    status: str
    diverged_step: int | None
    config: RunConfig | None
    unigram: float | None
    init_loss: float | None
    scalars: pd.DataFrame
    layers: pd.DataFrame
    error: str | None = None  # what the run recorded when it stopped

    @property
    def n_layer(self) -> int:
        """The model's blocks (1 when the config could not be read)."""
        return self.config.model.n_layer if self.config is not None else 1


def run_series(run: Mapping[str, Any], scalars: pd.DataFrame, layers: pd.DataFrame) -> RunSeries:
    """A RunSeries from a run's stored row (as `RunStore.get_run` gives it) and frames."""
    try:
        config = RunConfig.from_dict(run["config"]) if run.get("config") else None
    except (ValueError, TypeError, KeyError):
        config = None
    dataset = run.get("dataset") if isinstance(run.get("dataset"), Mapping) else {}
    unigram, init_loss = dataset.get("unigram_nats"), dataset.get("init_loss")
    diverged = run.get("diverged_step")
    return RunSeries(
        status=str(run.get("status") or ""),
        diverged_step=None if diverged is None else int(diverged),
        config=config,
        unigram=float(unigram) if isinstance(unigram, int | float) else None,
        init_loss=float(init_loss) if isinstance(init_loss, int | float) else None,
        scalars=scalars,
        layers=layers,
        error=str(run["error"]) if run.get("error") else None,
    )


# ---------------------------------------------------------------------------- helpers


def _num(value: float) -> str:
    """A number as findings write it: three significant digits."""
    if not math.isfinite(value):
        return format_nonfinite(value)
    return f"{value:.3g}"


def _steps(value: int) -> str:
    return f"step {value:,}"


def _layer(layer: int, n_layer: int) -> str:
    return spec.layer_label(layer, n_layer)


def _layers(layers: list[int], n_layer: int) -> str:
    """'block 2', 'blocks 0–3', 'blocks 0–2 and 5', 'embeddings and blocks 1 and 3'."""
    blocks = sorted(layer for layer in layers if 0 <= layer < n_layer)
    parts = [_layer(layer, n_layer) for layer in sorted(set(layers) - set(blocks))]
    runs: list[list[int]] = []
    for layer in blocks:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    spans = [f"{r[0]}–{r[-1]}" if len(r) > 2 else " and ".join(map(str, r)) for r in runs]
    if spans:
        word = "block" if len(blocks) == 1 else "blocks"
        joined = spans[0] if len(spans) == 1 else ", ".join(spans[:-1]) + " and " + spans[-1]
        parts.insert(0, f"{word} {joined}")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _series(scalars: pd.DataFrame, name: str) -> pd.DataFrame:
    rows = scalars[scalars["name"] == name]
    return rows.sort_values("step").drop_duplicates("step", keep="last")[["step", "value"]]


def _stat(layers: pd.DataFrame, kind: str, stat: str, component: str | None = None) -> pd.DataFrame:
    """step x layer (x head for kind head) table of one statistic: rows are steps."""
    rows = layers[(layers["kind"] == kind) & (layers["stat"] == stat)]
    if component is not None:
        rows = rows[rows["component"] == component]
    if rows.empty:
        return pd.DataFrame()
    columns = ["layer", "component"] if kind == "head" else ["layer"]
    # dropna=False: a NaN gradient of a diverged step is a value to report, not a gap
    table = rows.pivot_table(
        index="step", columns=columns, values="value", aggfunc="last", dropna=False
    )
    return table.sort_index()


def _streak(condition: pd.Series) -> int | None:
    """The first index of the unbroken run of True that ends at the last entry, if that run
    holds at least PERSIST entries; else None."""
    values = condition.to_numpy(dtype=bool)
    if len(values) < PERSIST or not values[-PERSIST:].all():
        return None
    falses = np.flatnonzero(~values)
    start = falses[-1] + 1 if falses.size else 0
    return int(condition.index[start])


def _lr_at(series: RunSeries, steps: pd.Index) -> pd.Series:
    """The logged learning rate at each step (the nearest logged step at or before it)."""
    lr = _series(series.scalars, "train/lr")
    if lr.empty:
        return pd.Series(np.nan, index=steps)
    positions = np.searchsorted(lr["step"].to_numpy(), steps.to_numpy(), side="right") - 1
    values = lr["value"].to_numpy(dtype=float)
    picked = np.where(positions >= 0, values[np.clip(positions, 0, None)], np.nan)
    return pd.Series(picked, index=steps)


def _blocks(table: pd.DataFrame, n_layer: int) -> pd.DataFrame:
    """The columns of a step x layer table that are blocks (not embeddings or head)."""
    if table.empty:
        return table
    keep = [c for c in table.columns if 0 <= (c[0] if isinstance(c, tuple) else c) < n_layer]
    return table[keep]


def _finite_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The steps at which every value of the table is finite."""
    if table.empty:
        return table
    return table[np.isfinite(table.to_numpy(dtype=float)).all(axis=1)]


# ------------------------------------------------------------------------------ rules


def _diverged(series: RunSeries) -> Finding | None:
    """The step, the last finite loss, the first non-finite quantity and which layer's
    gradient grew first (from the probe steps before the divergence)."""
    loss = _series(series.scalars, "train/loss")
    nonfinite = loss[~np.isfinite(loss["value"].to_numpy(dtype=float))]
    if series.status != "diverged" and nonfinite.empty:
        return None
    facts = summarize_divergence(
        {"diverged_step": series.diverged_step, "error": series.error}, series.scalars
    )
    step = facts.step
    words = [render_divergence(facts)]
    grads = _blocks(_stat(series.layers, "component", "grad_norm", "block"), series.n_layer)
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
            f"The first non-finite gradient norm: {_layers(broken, series.n_layer)} at "
            f"{_steps(int(bad_layers.index[0]))}."
        )
        evidence["first_nonfinite_gradients"] = {"step": int(bad_layers.index[0]), "layers": broken}
    finite = _finite_rows(grads)
    if step is not None:
        finite = finite[finite.index <= step]
    suggestion = None
    every_step = series.config is not None and series.config.train.probe_interval == 1
    if len(finite) < 2:
        probed = ", ".join(_steps(int(s)) for s in finite.index) or "no step"
        if every_step:
            words.append(
                f"Its gradients were finite only at {probed}, so no block's grew before the "
                "others: they went non-finite together."
            )
        else:
            words.append(
                f"Its gradients were probed at {probed} before it diverged, too few to tell "
                "which layer's gradient grew first."
            )
            suggestion = Suggestion(
                "Rerun with probe_interval 1 to record every step's gradients.",
                {"probe_interval": 1},
            )
    else:
        growth = finite / finite.iloc[0]
        grew = growth[(growth >= GROWTH_FACTOR).any(axis=1)]
        if len(grew):
            at = int(grew.index[0])
            layer = int(grew.iloc[0].idxmax())
            factor = float(grew.iloc[0].max())
            words.append(
                f"The first gradient to grow {GROWTH_FACTOR:g}× its {_steps(int(finite.index[0]))} "
                f"value was {_layer(layer, series.n_layer)}'s, at {_steps(at)} "
                f"({_num(factor)}×: {_num(float(finite.loc[at, layer]))})."
            )
            evidence["grew_first"] = {"layer": layer, "step": at, "factor": factor}
        else:
            last = growth.iloc[-1]
            layer = int(last.idxmax())
            words.append(
                f"No block's gradient grew {GROWTH_FACTOR:g}× before it diverged; the most, "
                f"{_layer(layer, series.n_layer)}'s, {_num(float(last.max()))}× by "
                f"{_steps(int(growth.index[-1]))}."
            )
            evidence["grew_most"] = {"layer": layer, "factor": float(last.max())}
    if suggestion is None:
        suggestion = _stability_suggestion(series)
    title = f"Diverged at step {step:,}" if step is not None else "Diverged"
    return Finding(
        "diverged", "error", title, " ".join(words), step, "train/loss", evidence, suggestion
    )


def _stability_suggestion(series: RunSeries) -> Suggestion | None:
    """What the literature tries first against a blow-up, given what the run had."""
    if series.config is None:
        return None
    train, model = series.config.train, series.config.model
    if train.grad_clip == 0:
        return Suggestion("Clip the gradient norm at 1.", {"grad_clip": 1.0}, "Pascanu et al. 2013")
    if model.norm_position == "post" and train.warmup_steps == 0:
        return _warmup(series.config, "Xiong et al. 2020: Post-LN needs a warm-up")
    if model.norm_position != "pre":
        return Suggestion(
            "Put the norms before each sublayer (Pre-LN).",
            {"norm_position": "pre"},
            "Xiong et al. 2020",
        )
    return Suggestion("Lower the learning rate 3×.", {"lr": train.lr / 3})


def _warmup(config: RunConfig, source: str) -> Suggestion:
    steps = max(1, min(config.train.max_steps, max(100, config.train.max_steps // 10)))
    return Suggestion(
        f"Warm the learning rate up over {steps:,} steps.", {"warmup_steps": steps}, source
    )


def _stalled(series: RunSeries) -> Finding | None:
    """The train loss's running median has sat at or above the unigram entropy."""
    if series.unigram is None or not math.isfinite(series.unigram):
        return None
    loss = _series(series.scalars, "train/loss")
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
    where = "at the unigram entropy" if near else "above the unigram entropy"
    text = (
        f"Since {_steps(since)} the train loss (running median of {STALL_WINDOW} logged values) "
        f"has stayed {where}: {_num(level)} at {_steps(newest)}, against "
        f"{_num(series.unigram)} for predicting each character by its frequency alone. "
    )
    if near:
        text += "It has learned the characters' frequencies and nothing more."
    elif series.init_loss is not None and level > series.init_loss:
        text += (
            f"That is worse than the loss at initialisation, {_num(series.init_loss)} "
            "(a uniform guess over the vocabulary)."
        )
    else:
        text += "It has not even learned the characters' frequencies."
    val = _series(series.scalars, "val/loss")
    if len(val):
        at, value = int(val["step"].iloc[-1]), float(val["value"].iloc[-1])
        text += f" Val loss at {_steps(at)}: {_num(value)}."
    return Finding(
        "stalled",
        "warning",
        f"Stalled {where} since step {since:,}",
        text,
        since,
        "train/loss",
        {"since": since, "median_loss": level, "unigram": series.unigram, "step": newest},
        _stall_suggestion(series),
    )


def _stall_suggestion(series: RunSeries) -> Suggestion | None:
    if series.config is None:
        return None
    model, train = series.config.model, series.config.train
    if not model.residual:
        return Suggestion("Turn the residual connections on.", {"residual": True}, "He et al. 2016")
    if model.norm_position == "post" and train.warmup_steps == 0:
        return _warmup(series.config, "Xiong et al. 2020: Post-LN needs a warm-up")
    if model.norm_position == "post":
        return Suggestion(
            "Put the norms before each sublayer (Pre-LN).",
            {"norm_position": "pre"},
            "Xiong et al. 2020",
        )
    return Suggestion("Lower the learning rate 3×.", {"lr": train.lr / 3})


def _loss_spikes(series: RunSeries) -> Finding | None:
    """Logged train losses far above the median of the window before them."""
    loss = _series(series.scalars, "train/loss")
    values = loss["value"].to_numpy(dtype=float)
    if len(values) <= SPIKE_WINDOW:
        return None
    before = pd.Series(values).rolling(SPIKE_WINDOW).median().shift(1).to_numpy()
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
        + (f", first at {_steps(first)}" if count > 1 else "")
        + f". The largest at {_steps(int(steps[worst]))}: {_num(values[worst])} against a "
        f"median of {_num(before[worst])} ({_num(ratio[worst])}×)."
    )
    suggestion = None
    if series.config is not None and series.config.train.grad_clip == 0:
        suggestion = Suggestion(
            "Clip the gradient norm at 1.", {"grad_clip": 1.0}, "Pascanu et al. 2013"
        )
    return Finding(
        "loss_spike",
        "warning",
        f"{spikes.capitalize()}, the largest at step {int(steps[worst]):,}",
        text,
        int(steps[worst]),
        "train/loss",
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


def _gradient_depth(series: RunSeries) -> Finding | None:
    """First block's gradient norm against the last's, beyond GRAD_DEPTH_RATIO."""
    n = series.n_layer
    if n < 2:
        return None
    grads = _finite_rows(_blocks(_stat(series.layers, "component", "grad_norm", "block"), n))
    if grads.empty or 0 not in grads.columns or n - 1 not in grads.columns:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = grads[0] / grads[n - 1]
    for direction, condition in (
        ("vanish", ratio < 1 / GRAD_DEPTH_RATIO),
        ("grow", ratio > GRAD_DEPTH_RATIO),
    ):
        since = _streak(condition)
        if since is None:
            continue
        newest = int(ratio.index[-1])
        first, last = float(grads[0].iloc[-1]), float(grads[n - 1].iloc[-1])
        value = float(ratio.iloc[-1])
        if direction == "vanish":
            title = "Gradients vanish towards the input"
            how = f"{_num(1 / value)}× smaller than"
        else:
            title = "Gradients grow towards the input"
            how = f"{_num(value)}× larger than"
        text = (
            f"At {_steps(newest)} the first block's gradient norm ({_num(first)}) is {how} the "
            f"last block's ({_num(last)}), beyond the bound of {GRAD_DEPTH_RATIO:g}× either "
            f"way at every probe since {_steps(since)}."
        )
        suggestion = None
        if series.config is not None:
            model = series.config.model
            if not model.residual:
                suggestion = Suggestion(
                    "Turn the residual connections on.", {"residual": True}, "He et al. 2016"
                )
            elif model.norm_position != "pre":
                suggestion = Suggestion(
                    "Put the norms before each sublayer (Pre-LN).",
                    {"norm_position": "pre"},
                    "Xiong et al. 2020",
                )
        return Finding(
            "gradient_depth",
            "warning",
            title,
            text,
            since,
            "grad_norm",
            {
                "since": since,
                "step": newest,
                "first_block": first,
                "last_block": last,
                "ratio": value,
            },
            suggestion,
        )
    return None


def _update_tables(series: RunSeries) -> tuple[pd.DataFrame, pd.Series]:
    """Block weight matrices' update ratios by step (step 0 left out) and the lr there."""
    table = _blocks(
        _stat(series.layers, "component", "update_ratio", spec.WEIGHTS_COMPONENT), series.n_layer
    )
    if table.empty:
        return table, pd.Series(dtype=float)
    table = table[table.index > 0]
    return table, _lr_at(series, table.index)


def _slow_updates(series: RunSeries) -> Finding | None:
    """Blocks whose weight matrices move less than UPDATE_LOW × lr per step."""
    table, lr = _update_tables(series)
    if table.empty:
        return None
    per_lr = table.div(lr, axis=0)
    slow = per_lr < UPDATE_LOW
    layers = [int(c) for c in slow.columns if _streak(slow[c]) is not None]
    if not layers:
        return None
    since = min(_streak(slow[c]) for c in layers)  # type: ignore[type-var]
    newest = int(table.index[-1])
    worst = min(layers, key=lambda c: per_lr[c].iloc[-1])
    decay = series.config.train.weight_decay if series.config is not None else None
    text = (
        f"The weight matrices of {_layers(layers, series.n_layer)} move by less than "
        f"{UPDATE_LOW:g} × lr of their norm per step at every probe since {_steps(since)}: at "
        f"{_steps(newest)} {_layer(worst, series.n_layer)}'s ‖Δθ‖/‖θ‖ is "
        f"{_num(float(table[worst].iloc[-1]))} at lr {_num(float(lr.iloc[-1]))} "
        f"({_num(float(per_lr[worst].iloc[-1]))} × lr)."
    )
    if decay:
        text += f" Weight decay alone moves them by {_num(decay)} × lr: they barely learn."
    suggestion = None
    if series.config is not None and series.config.model.norm_position == "post":
        suggestion = Suggestion(
            "Put the norms before each sublayer (Pre-LN).",
            {"norm_position": "pre"},
            "Xiong et al. 2020",
        )
    elif series.config is not None and not series.config.model.residual:
        suggestion = Suggestion(
            "Turn the residual connections on.", {"residual": True}, "He et al. 2016"
        )
    return Finding(
        "slow_updates",
        "warning",
        f"{_layers(layers, series.n_layer).capitalize()} barely learning",
        text,
        since,
        "update_ratio",
        {
            "layers": layers,
            "since": since,
            "step": newest,
            "per_lr": {c: float(per_lr[c].iloc[-1]) for c in layers},
        },
        suggestion,
    )


def _large_updates(series: RunSeries) -> Finding | None:
    """Blocks whose weight matrices change by more than UPDATE_HIGH of their norm per step."""
    table, lr = _update_tables(series)
    if table.empty:
        return None
    large = table > UPDATE_HIGH
    layers = [int(c) for c in large.columns if _streak(large[c]) is not None]
    if not layers:
        return None
    since = min(_streak(large[c]) for c in layers)  # type: ignore[type-var]
    newest = int(table.index[-1])
    worst = max(layers, key=lambda c: table[c].iloc[-1])
    text = (
        f"Each step changes the weight matrices of {_layers(layers, series.n_layer)} by more "
        f"than {UPDATE_HIGH:g} of their norm, at every probe since {_steps(since)}: "
        f"{_layer(worst, series.n_layer)}'s ‖Δθ‖/‖θ‖ is {_num(float(table[worst].iloc[-1]))} at "
        f"{_steps(newest)} (lr {_num(float(lr.iloc[-1]))}). The learning rate is large for "
        "these weights."
    )
    suggestion = (
        Suggestion("Lower the learning rate 3×.", {"lr": series.config.train.lr / 3})
        if series.config is not None
        else None
    )
    return Finding(
        "large_updates",
        "warning",
        f"Large updates in {_layers(layers, series.n_layer)}",
        text,
        since,
        "update_ratio",
        {
            "layers": layers,
            "since": since,
            "step": newest,
            "ratio": {c: float(table[c].iloc[-1]) for c in layers},
        },
        suggestion,
    )


def _dead_units(series: RunSeries) -> Finding | None:
    """More than DEAD_FRAC of a layer's FFN units zero on every probe token."""
    table = _blocks(_stat(series.layers, "tap", "dead_frac", spec.FFN_TAP), series.n_layer)
    if table.empty:
        return None
    dead = table > DEAD_FRAC
    layers = [int(c) for c in dead.columns if _streak(dead[c]) is not None]
    if not layers:
        return None
    since = min(_streak(dead[c]) for c in layers)  # type: ignore[type-var]
    newest = int(table.index[-1])
    shares = ", ".join(f"{_layer(c, series.n_layer)} {table[c].iloc[-1]:.0%}" for c in layers)
    text = (
        f"At {_steps(newest)} more than {DEAD_FRAC:.0%} of the FFN's hidden units are zero for "
        f"every token of the probe batch ({shares}), at every probe since {_steps(since)}: "
        "those units pass no signal and get no gradient."
    )
    suggestion = None
    if series.config is not None:
        if series.config.model.activation == "relu":
            suggestion = Suggestion(
                "Use GELU, which has no flat zero region.",
                {"activation": "gelu"},
                "Hendrycks & Gimpel 2016",
            )
        else:
            suggestion = Suggestion(
                "Lower the learning rate 3×.", {"lr": series.config.train.lr / 3}
            )
    return Finding(
        "dead_units",
        "warning",
        f"Dead FFN units in {_layers(layers, series.n_layer)}",
        text,
        since,
        "dead_frac",
        {
            "layers": layers,
            "since": since,
            "step": newest,
            "dead_frac": {c: float(table[c].iloc[-1]) for c in layers},
        },
        suggestion,
    )


def _qk_norm_suggestion(series: RunSeries) -> Suggestion | None:
    if series.config is None:
        return None
    if not series.config.model.qk_norm:
        return Suggestion(
            "Normalize queries and keys (qk_norm).",
            {"qk_norm": True},
            "Dehghani et al. 2023; Wortsman et al. 2023",
        )
    return Suggestion("Lower the learning rate 3×.", {"lr": series.config.train.lr / 3})


def _attention_collapse(series: RunSeries) -> Finding | None:
    """A layer whose every head attends almost to one position (entropy below the floor)."""
    table = _stat(series.layers, "head", "attn_entropy")
    if table.empty:
        return None
    by_layer = table.T.groupby(level=0).max().T  # step x layer: the layer's largest entropy
    collapsed = by_layer < ENTROPY_FLOOR
    layers = [int(c) for c in collapsed.columns if _streak(collapsed[c]) is not None]
    if not layers:
        return None
    since = min(_streak(collapsed[c]) for c in layers)  # type: ignore[type-var]
    newest = int(by_layer.index[-1])
    text = (
        f"At {_steps(newest)} every head of {_layers(layers, series.n_layer)} has a mean "
        f"attention entropy below {ENTROPY_FLOOR:g} nats (largest: "
        + ", ".join(f"{_num(float(by_layer[c].iloc[-1]))}" for c in layers)
        + f"), at every probe since {_steps(since)}: each query attends to about one position."
    )
    return Finding(
        "attention_collapse",
        "warning",
        f"Attention entropy collapsed in {_layers(layers, series.n_layer)}",
        text,
        since,
        "attn_entropy",
        {"layers": layers, "since": since, "step": newest},
        _qk_norm_suggestion(series),
    )


def _attention_logits(series: RunSeries) -> Finding | None:
    """A head's largest pre-softmax logit above ATTN_LOGIT_MAX and LOGIT_GROWTH × its first."""
    table = _stat(series.layers, "head", "attn_logit_max")
    if table.empty:
        return None
    grown = (table > ATTN_LOGIT_MAX) & (table >= LOGIT_GROWTH * table.iloc[0].abs())
    heads = [c for c in grown.columns if _streak(grown[c]) is not None]
    if not heads:
        return None
    since = min(_streak(grown[c]) for c in heads)  # type: ignore[type-var]
    newest = int(table.index[-1])
    layer, head = max(heads, key=lambda c: table[c].iloc[-1])
    value, start = float(table[(layer, head)].iloc[-1]), float(table[(layer, head)].iloc[0])
    others = f" ({len(heads)} heads over {ATTN_LOGIT_MAX:g})" if len(heads) > 1 else ""
    text = (
        f"At {_steps(newest)} the largest attention logit of {_layer(int(layer), series.n_layer)} "
        f"head {head} is {_num(value)}, against {_num(start)} at "
        f"{_steps(int(table.index[0]))}{others}; above {ATTN_LOGIT_MAX:g} at every probe since "
        f"{_steps(since)}. Logits this large make the softmax close to one-hot."
    )
    return Finding(
        "attention_logit_growth",
        "warning",
        f"Attention logits grew to {_num(value)}",
        text,
        since,
        "attn_logit_max",
        {
            "layer": int(layer),
            "head": int(head),
            "value": value,
            "first": start,
            "since": since,
            "heads": len(heads),
        },
        _qk_norm_suggestion(series),
    )


def _rank_collapse(series: RunSeries) -> Finding | None:
    """Positions at a block's output nearly parallel (mean cosine similarity ≥ RANK_COS)."""
    table = _blocks(_stat(series.layers, "tap", "token_cos", spec.STREAM_TAP), series.n_layer)
    if table.empty:
        return None
    parallel = table >= RANK_COS
    layers = [int(c) for c in parallel.columns if _streak(parallel[c]) is not None]
    if not layers:
        return None
    since = min(_streak(parallel[c]) for c in layers)  # type: ignore[type-var]
    newest = int(table.index[-1])
    values = ", ".join(f"{_layer(c, series.n_layer)} {table[c].iloc[-1]:.3f}" for c in layers)
    text = (
        f"At {_steps(newest)} the vectors of different positions leaving "
        f"{_layers(layers, series.n_layer)} point the same way: mean cosine similarity "
        f"{values} (at least {RANK_COS:g}), at every probe since {_steps(since)}. The stream "
        "there carries almost nothing that tells one position from another."
    )
    suggestion = None
    if series.config is not None and not series.config.model.residual:
        suggestion = Suggestion(
            "Turn the residual connections on.",
            {"residual": True},
            "Dong et al. 2021; Noci et al. 2022",
        )
    return Finding(
        "rank_collapse",
        "warning",
        f"Rank collapse in {_layers(layers, series.n_layer)}",
        text,
        since,
        "token_cos",
        {"layers": layers, "since": since, "step": newest},
        suggestion,
    )


def _massive_activations(series: RunSeries) -> Finding | None:
    """An activation at a block's output far larger than the median (Sun et al. 2024)."""
    ratio = _blocks(_stat(series.layers, "tap", "max_over_median", spec.STREAM_TAP), series.n_layer)
    largest = _blocks(_stat(series.layers, "tap", "max_abs", spec.STREAM_TAP), series.n_layer)
    if ratio.empty or largest.empty:
        return None
    steps = ratio.index.intersection(largest.index)
    columns = ratio.columns.intersection(largest.columns)
    ratio, largest = ratio.loc[steps, columns], largest.loc[steps, columns]
    massive = (ratio >= MASSIVE_RATIO) & (largest >= MASSIVE_ABS)
    layers = [int(c) for c in massive.columns if _streak(massive[c]) is not None]
    if not layers:
        return None
    since = min(_streak(massive[c]) for c in layers)  # type: ignore[type-var]
    newest = int(steps[-1])
    worst = max(layers, key=lambda c: ratio[c].iloc[-1])
    text = (
        f"At {_steps(newest)} the stream leaving {_layer(worst, series.n_layer)} holds an "
        f"activation of {_num(float(largest[worst].iloc[-1]))}, "
        f"{_num(float(ratio[worst].iloc[-1]))}× the median |activation| there "
        f"(layers: {_layers(layers, series.n_layer)}; since {_steps(since)}). Sun et al. 2024 "
        "find such activations in large trained models, where they act like fixed biases."
    )
    return Finding(
        "massive_activations",
        "info",
        f"Massive activations in {_layers(layers, series.n_layer)}",
        text,
        since,
        "max_over_median",
        {"layers": layers, "since": since, "step": newest},
    )


def _output_logits(series: RunSeries) -> Finding | None:
    """The output logits' largest |logit| or |mean log Z| beyond their bounds."""
    largest = _series(series.scalars, "probe/logit_max_abs").set_index("step")["value"]
    log_z = _series(series.scalars, "probe/log_z").set_index("step")["value"]
    if largest.empty or log_z.empty:
        return None
    steps = largest.index.intersection(log_z.index)
    largest, log_z = largest.loc[steps], log_z.loc[steps]
    grown = (largest > OUTPUT_LOGIT_MAX) | (log_z.abs() > LOG_Z_MAX)
    since = _streak(grown)
    if since is None:
        return None
    newest = int(steps[-1])
    text = (
        f"At {_steps(newest)} the output logits on the probe batch reach |logit| "
        f"{_num(float(largest.iloc[-1]))} with a mean log Z of {_num(float(log_z.iloc[-1]))} "
        f"(bounds {OUTPUT_LOGIT_MAX:g} and ±{LOG_Z_MAX:g}), at every probe since "
        f"{_steps(since)}."
    )
    suggestion = None
    if series.config is not None:
        if series.config.train.z_loss == 0:
            suggestion = Suggestion(
                "Add a z-loss of 1e-4 (it pulls log Z towards 0).",
                {"z_loss": 1e-4},
                "Chowdhery et al. 2022; Wortsman et al. 2023",
            )
        elif series.config.model.logit_softcap == 0:
            suggestion = Suggestion(
                "Cap the output logits at 30 (logit_softcap).",
                {"logit_softcap": 30.0},
                "Gemma Team 2024",
            )
    return Finding(
        "output_logit_growth",
        "warning",
        f"Output logits grew to {_num(float(largest.iloc[-1]))}",
        text,
        since,
        "probe/log_z",
        {
            "since": since,
            "step": newest,
            "logit_max_abs": float(largest.iloc[-1]),
            "log_z": float(log_z.iloc[-1]),
        },
        suggestion,
    )


def _overfitting(series: RunSeries) -> Finding | None:
    """Val loss rising above its lowest evaluation while the val − train gap widens."""
    val = _series(series.scalars, "val/loss")
    val = val[np.isfinite(val["value"].to_numpy(dtype=float))]
    train = _series(series.scalars, "train/loss")
    if len(val) < OVERFIT_EVALS or train.empty:
        return None
    train_values = train["value"].to_numpy(dtype=float)
    means = pd.Series(train_values).rolling(OVERFIT_TRAIN, min_periods=1).mean().to_numpy()
    positions = np.searchsorted(train["step"].to_numpy(), val["step"].to_numpy(), side="right") - 1
    valid = positions >= 0
    val, positions = val[valid], positions[valid]
    if len(val) < OVERFIT_EVALS:
        return None
    trained = means[positions]
    gap = val["value"].to_numpy(dtype=float) - trained
    best = int(np.argmin(val["value"].to_numpy(dtype=float)))
    last = len(val) - 1
    best_loss, last_loss = float(val["value"].iloc[best]), float(val["value"].iloc[last])
    # Val rose, the gap widened by as much, and the train loss did not rise with it (a
    # train loss that rises too is a run getting worse, not one memorising its text), and
    # it is below the unigram entropy: a model that knows only character frequencies has
    # nothing of its training text to memorise.
    memorising = series.unigram is None or trained[last] < series.unigram - STALL_MARGIN
    if (
        best == last
        or last_loss < best_loss + OVERFIT_RISE
        or not gap[last] >= gap[best] + OVERFIT_RISE
        or trained[last] > trained[best]
        or not memorising
    ):
        return None
    since = int(val["step"].iloc[best])
    newest = int(val["step"].iloc[last])
    text = (
        f"The val loss has risen from its lowest, {_num(best_loss)} at {_steps(since)}, to "
        f"{_num(last_loss)} at {_steps(newest)}, while the val − train gap widened from "
        f"{_num(gap[best])} to {_num(gap[last])}: the model is learning its training text "
        f"rather than the language. best.ckpt holds the weights of {_steps(since)}."
    )
    suggestion = None
    if series.config is not None and series.config.model.dropout == 0:
        suggestion = Suggestion("Add dropout 0.1.", {"dropout": 0.1}, "Srivastava et al. 2014")
    return Finding(
        "overfitting",
        "warning",
        f"Overfitting since step {since:,}",
        text,
        since,
        "val/loss",
        {
            "since": since,
            "step": newest,
            "best_val": best_loss,
            "val": last_loss,
            "gap_then": float(gap[best]),
            "gap_now": float(gap[last]),
        },
        suggestion,
    )


# Every rule, in the order README's table lists them (healthy comes last, from the others).
RULES: dict[str, Callable[[RunSeries], Finding | None]] = {
    "diverged": _diverged,
    "stalled": _stalled,
    "loss_spike": _loss_spikes,
    "gradient_depth": _gradient_depth,
    "slow_updates": _slow_updates,
    "large_updates": _large_updates,
    "dead_units": _dead_units,
    "attention_collapse": _attention_collapse,
    "attention_logit_growth": _attention_logits,
    "rank_collapse": _rank_collapse,
    "massive_activations": _massive_activations,
    "output_logit_growth": _output_logits,
    "overfitting": _overfitting,
}


def _healthy(series: RunSeries) -> Finding:
    """None of the warning rules fired: said in words, with how far the checks reached."""
    loss = _series(series.scalars, "train/loss")
    probes = _stat(series.layers, "component", "grad_norm", "block")
    newest = int(loss["step"].iloc[-1]) if len(loss) else None
    probe = int(probes.index[-1]) if len(probes) else None
    reach = f" up to {_steps(newest)}" if newest is not None else ""
    if probe is not None:
        reach += f" (latest probe: {_steps(probe)})"
    return Finding(
        "healthy",
        "ok",
        "Healthy",
        f"None of the {len(RULES)} checks found a problem{reach}.",
        newest,
        "train/loss",
        {"checks": len(RULES), "step": newest, "probe_step": probe},
    )


def evaluate(series: RunSeries) -> list[Finding]:
    """Every finding about the run, newest step first; `healthy` when no warning fired."""
    found = [finding for rule in RULES.values() if (finding := rule(series)) is not None]
    if not any(f.severity in ("error", "warning") for f in found):
        found.append(_healthy(series))
    return sorted(found, key=lambda f: -1 if f.step is None else f.step, reverse=True)


def headline(series: RunSeries, findings: list[Finding]) -> Finding:
    """What the run is doing, in one line: diverged, stalled, or whether its loss falls.

    A diverged or stalled finding is the headline; otherwise the loss speaks: "Trains"
    once the train loss's running median is below the unigram entropy (minus the stall
    margin), else how far it has come.
    """
    for rule in ("diverged", "stalled"):
        for finding in findings:
            if finding.rule == rule:
                return finding
    loss = _series(series.scalars, "train/loss")
    loss = loss[np.isfinite(loss["value"].to_numpy(dtype=float))]
    if loss.empty:
        return Finding(
            "state", "info", "No loss yet", "No train loss logged yet.", None, "train/loss"
        )
    level = float(loss["value"].tail(STALL_WINDOW).median())
    first, newest = float(loss["value"].iloc[0]), int(loss["step"].iloc[-1])
    trained = series.unigram is not None and level < series.unigram - STALL_MARGIN
    worse = series.init_loss is not None and level > series.init_loss + STALL_MARGIN
    text = (
        f"Train loss {_num(level)} at {_steps(newest)} (running median of the last "
        f"{min(STALL_WINDOW, len(loss))} logged values), from {_num(first)} at "
        f"{_steps(int(loss['step'].iloc[0]))}"
    )
    if worse:
        text += f"; above the loss at initialisation, {_num(series.init_loss)} (a uniform guess)"
    elif series.unigram is not None:
        relation = "below" if trained else "not yet below"
        text += f"; {relation} the unigram entropy, {_num(series.unigram)}"
    title = "Worse than a uniform guess" if worse else "Trains" if trained else "Learning"
    return Finding(
        "state",
        "warning" if worse else "ok" if trained else "info",
        title,
        text + ".",
        newest,
        "train/loss",
        {"loss": level, "step": newest, "first_loss": first},
    )


def severity_rank(severity: str) -> int:
    """0 for the most serious severity (error), up to len(SEVERITIES) - 1 (ok)."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)
