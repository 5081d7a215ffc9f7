"""The flight recorder's analysis: the first statistic of a replay to leave its healthy range.

A replay re-runs a run from a checkpoint before a loss spike or a divergence, probing every
step, and reproduces the parent exactly. The parent's own probes up to the checkpoint set
each series' healthy range (`healthy_ranges`); the replay's every-step probes are scanned in
step order for the first series to leave it (`first_break`). Torch-free.

A series is one statistic of one place: a probe scalar (SCANNED_SCALARS), or a per-layer
statistic of kind component (parameter groups), tap or head. Per-tensor rows (kind param)
are left out: each tensor belongs to a component group of its layer, whose norms move with
it, and reading both would only scan the same event several times.

How the healthy range is set (docs/flight-recorder.md quotes this):

- history: a series' last WINDOW finite probe values at steps 1 .. upto_step (step 0, the
  gradient at initialisation and AdamW's first update, is unlike any later step); fewer
  than MIN_HISTORY and the series gets no range;
- trend: the Theil–Sen line through them (the median of the pairwise slopes; one odd probe
  does not tilt it), and `level`, the line's value at upto_step;
- what the run did: the lowest and highest of its RECENT newest probes (the value at
  upto_step among them when it was probed there), and the same line moved through the
  newest probe, so a series that bends away from a straight line (rising faster and
  faster) is followed from where it got to, not from where the line says it should be;
- spread: the robust standard deviation of the residuals (1.4826 × their median absolute
  deviation); the tolerance is the largest of TOLERANCE_K spreads, REL_FLOOR × the
  series' size (the window's median |value|; for a tap's mean, the same tap's median
  RMS), and, for a fraction (unit "fraction"), FRACTION_FLOOR, for a score between -1
  and 1 (SCORE_STATS), SCORE_FLOOR;
- at a later step t the range runs from the lowest of the newest probes, the level, and
  the line and the moved line at t, each at the trend's pace and at TREND_SLACK times it,
  less the tolerance, to the highest of them plus the tolerance, and not below 0 for a
  statistic that cannot be negative (all but SIGNED_STATS): a series may go on along its
  trend (up to twice as fast), stop where it was or stay where its newest probes were, and
  none of these leaves it.

A series leaves its range at step s when its value at s is outside it (a non-finite value
always is) and stays outside for PERSIST_STEPS replay steps in a row, or until the last
step scanned. The break is the earliest such s; when several series leave at the same step,
the one furthest outside (in widths of its own range; non-finite is furthest) is named,
and equal excursions go to the first in scan order (scalars, then kinds component, tap,
head; then layer, component and statistic).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.core.findings.base import EVENTS, layer_name, num, step_text

# The healthy range's parameters (module docstring; calibration in docs/flight-recorder.md).
WINDOW = 16  # probes of history per series
MIN_HISTORY = 4  # fewer finite probes in the window: no range
RECENT = 4  # newest probes whose values the range always holds
TREND_SLACK = 2.0  # the range follows the trend at up to this many times its pace
TOLERANCE_K = 15.0  # robust spreads of the residuals
REL_FLOOR = 0.5  # of the window's median |value|
FRACTION_FLOOR = 0.01  # absolute, for statistics whose unit is "fraction"
SCORE_FLOOR = 0.05  # absolute, for the scores between -1 and 1 (SCORE_STATS)
PERSIST_STEPS = 3  # replay steps in a row outside the range
ROBUST_SIGMA = 1.4826  # MAD -> standard deviation of a normal distribution

# How often the rule named a break where nothing happened: healthy 100-step windows of the
# held-out runs of benchmarks/flight_calibration.py (docs/flight-recorder.md; a test checks
# these against benchmarks/results/flight-calibration.json). Every break an event's replay
# names says so: above 1 in 20, a named break is a lead to look at, not a found cause.
HELD_OUT_FALSE_ALARMS = 6
HELD_OUT_WINDOWS = 43

# A replay `--around` a step that is neither a divergence nor a loss spike: a window of a
# run, not an event (nothing happened at its end, so a break there leads up to nothing).
AROUND = "window"
REPLAYED = (*EVENTS, AROUND)  # what a replay may replay

# Probe scalars scanned (train/loss is the event itself; the lr follows its schedule).
SCANNED_SCALARS = (spec.TRAIN_GRAD_NORM, *spec.PROBE_SCALARS)
SCANNED_KINDS = ("component", "tap", "head")
SCALAR = "scalar"  # a Break's scope for a probe scalar
NO_LAYER = -2  # a scalar's `layer` in the frames below (never a layer number)
KEY = ["scope", "layer", "component", "stat"]
RANGE_COLUMNS = [
    *KEY,
    *("upto_step", "level", "slope", "shift", "recent_low", "recent_high"),
    *("tolerance", "nonnegative", "history"),
]
# Statistics that may take either sign; every other one (norms, ratios, RMS, max |x|,
# fractions, entropies) is never below 0, and its range stops there.
SIGNED_STATS = (spec.MEAN, spec.ATTN_LOGIT_MAX, spec.PROBE_LOG_Z, spec.TOKEN_COS, spec.COPY_SCORE)
# Scores between -1 and 1 that sit near 0 in a healthy run: their size is no scale for them.
SCORE_STATS = (spec.TOKEN_COS, spec.COPY_SCORE)
# How a component group is named after its layer ("block 3 attention's gradient L2 norm").
COMPONENT_WORDS = {
    "attn": "attention",
    "ffn": "FFN",
    "norm": "norms",
    "embed": "embedding tables",
    "head": "LM head",
    "block": "",
    "weights": "weight matrices",
}


class ShortHistory(ValueError):
    """No series had MIN_HISTORY probes before the checkpoint: no range to judge by."""


@dataclass(frozen=True)
class Break:
    """The first statistic of a replay out of its healthy range, and where.

    `scope` is "scalar" or a layer_stats kind; `layer` and `component` are None for a
    scalar (for a head, `component` is the head number as text). `low`–`high` is the range
    at `step`; `value` may be non-finite.
    """

    step: int
    event_step: int
    event: str  # "loss spike" | "divergence" | "window" (AROUND: no event at its end)
    scope: str
    layer: int | None
    component: str | None
    stat: str
    value: float
    low: float
    high: float
    n_layer: int

    @property
    def lead(self) -> int:
        """Steps from the break to the event."""
        return self.event_step - self.step

    def subject(self) -> str:
        """What left its range, in words: "block 3 head 1's largest attention logit ..."."""
        label = spec.METRICS[self.stat].label if self.stat in spec.METRICS else self.stat
        if self.scope == SCALAR or self.layer is None:
            return f"the model's {label}"
        where = layer_name(self.layer, self.n_layer)
        if self.layer >= self.n_layer:
            where = "the head end"
        if self.scope == "head":
            where = f"{where} head {self.component}"
        elif self.scope == "component":
            words = COMPONENT_WORDS.get(str(self.component), str(self.component))
            where = f"{where} {words}".rstrip()
        elif self.component:
            where = f"{where} {self.component}"
        owner = f"{where}'" if where.endswith("s") else f"{where}'s"
        return f"{owner} {label}"

    def sentence(self) -> str:
        """One plain-text sentence: what left its range, the range, the step, and for an
        event the steps before it (a window's end is no event: no lead is said)."""
        if self.event == AROUND:
            when = (
                f"in a window up to {step_text(self.event_step)} with no loss spike or divergence"
            )
        elif self.lead == 0:
            when = f"the step of the {self.event}"
        else:
            steps = "step" if abs(self.lead) == 1 else "steps"
            when = f"{abs(self.lead)} {steps} {'before' if self.lead > 0 else 'after'}"
            when += f" the {self.event}"
        text = (
            f"{self.subject()} left its range ({num(self.low)}–{num(self.high)}) at "
            f"{step_text(self.step)}, {when}: {num(self.value)}."
        )
        return text[0].upper() + text[1:]

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (JSON-ready: numbers, strings, None)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Break:
        """A Break from `to_dict`'s dict (keys it does not know are ignored)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("step", "event_step", "n_layer"):
            values[name] = int(values[name])
        for name in ("value", "low", "high"):
            values[name] = float(values[name])
        if values.get("layer") is not None:
            values["layer"] = int(values["layer"])
        return cls(**values)


def series_rows(scalars: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """The scanned series as one long frame: scope, layer, component, stat, step, value.

    `scalars` has columns step, name, value (SCALARS_FRAME's); `layers` has step, layer,
    kind, component, stat, value (LAYER_STATS_FRAME's). A scalar gets scope "scalar",
    layer NO_LAYER and component "".
    """
    parts = []
    if len(scalars):
        rows = scalars[scalars["name"].isin(SCANNED_SCALARS)]
        parts.append(
            pd.DataFrame(
                {
                    "scope": SCALAR,
                    "layer": NO_LAYER,
                    "component": "",
                    "stat": rows["name"].astype(str).to_numpy(),
                    "step": rows["step"].to_numpy(dtype=np.int64),
                    "value": rows["value"].to_numpy(dtype=float),
                }
            )
        )
    if len(layers):
        rows = layers[layers["kind"].isin(SCANNED_KINDS)]
        parts.append(
            pd.DataFrame(
                {
                    "scope": rows["kind"].astype(str).to_numpy(),
                    "layer": rows["layer"].to_numpy(dtype=np.int64),
                    "component": rows["component"].astype(str).to_numpy(),
                    "stat": rows["stat"].astype(str).to_numpy(),
                    "step": rows["step"].to_numpy(dtype=np.int64),
                    "value": rows["value"].to_numpy(dtype=float),
                }
            )
        )
    columns = [*KEY, "step", "value"]
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    return pd.concat(parts, ignore_index=True)[columns]


def theil_sen(steps: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """The median of the pairwise slopes, and the median intercept through it."""
    i, j = np.triu_indices(len(steps), k=1)
    slope = float(np.median((values[j] - values[i]) / (steps[j] - steps[i])))
    return slope, float(np.median(values - slope * steps))


def tolerance_floor(stat: str, typical: float) -> float:
    """The smallest tolerance a series gets: REL_FLOOR of its typical size, and
    FRACTION_FLOOR for a fraction, SCORE_FLOOR for a score between -1 and 1."""
    metric = spec.METRICS.get(stat)
    absolute = FRACTION_FLOOR if metric is not None and metric.unit == "fraction" else 0.0
    absolute = SCORE_FLOOR if stat in SCORE_STATS else absolute
    return max(REL_FLOOR * typical, absolute)


def healthy_ranges(scalars: pd.DataFrame, layers: pd.DataFrame, upto_step: int) -> pd.DataFrame:
    """Each scanned series' healthy range from the run's own probes at steps <= upto_step.

    One row per series that has MIN_HISTORY finite probes in its window: scope, layer,
    component, stat (as `series_rows` spells them), upto_step, level (the trend line at
    upto_step), slope (per step), shift (the newest probe's value less the line's there),
    recent_low and recent_high (the RECENT newest probes' extremes), tolerance,
    nonnegative (a statistic not in SIGNED_STATS whose window is >= 0: the range then
    stops at 0) and history (probes used). The module docstring has the rule.
    """
    rows = series_rows(scalars, layers)
    values = rows["value"].to_numpy(dtype=float)
    steps = rows["step"].to_numpy(dtype=np.int64)
    rows = rows[(steps > 0) & (steps <= upto_step) & np.isfinite(values)]
    rows = rows.drop_duplicates([*KEY, "step"], keep="last").sort_values([*KEY, "step"])
    fits = []
    for key, group in rows.groupby(KEY, sort=True):
        window = group.tail(WINDOW)
        if len(window) < MIN_HISTORY:
            continue
        x = window["step"].to_numpy(dtype=float)
        y = window["value"].to_numpy(dtype=float)
        slope, intercept = theil_sen(x, y)
        residuals = y - (intercept + slope * x)
        spread = ROBUST_SIGMA * float(np.median(np.abs(residuals - np.median(residuals))))
        typical = float(np.median(np.abs(y)))
        level = intercept + slope * upto_step
        recent = y[-RECENT:]
        nonnegative = key[3] not in SIGNED_STATS and bool((y >= 0).all())
        fits.append(
            (
                *key,
                level,
                slope,
                float(residuals[-1]),
                float(recent.min()),
                float(recent.max()),
                spread,
                typical,
                nonnegative,
                len(window),
            )
        )
    columns = [*KEY, "level", "slope", "shift", "recent_low", "recent_high"]
    columns += ["spread", "typical", "nonnegative", "history"]
    fitted = pd.DataFrame(fits, columns=columns)
    if fitted.empty:
        return pd.DataFrame(columns=RANGE_COLUMNS)
    # A tap's mean wanders about zero: its size is the tap's RMS, not its own |value|.
    rms = fitted[fitted["stat"] == spec.RMS].set_index(KEY[:3])["typical"]
    means = fitted["stat"] == spec.MEAN
    scale = rms.reindex(pd.MultiIndex.from_frame(fitted.loc[means, KEY[:3]])).to_numpy()
    fitted.loc[means, "typical"] = np.where(np.isnan(scale), fitted.loc[means, "typical"], scale)
    floors = [tolerance_floor(s, t) for s, t in zip(fitted["stat"], fitted["typical"], strict=True)]
    tolerance = np.maximum(TOLERANCE_K * fitted["spread"].to_numpy(dtype=float), floors)
    fitted = fitted.assign(upto_step=upto_step, tolerance=tolerance)
    return fitted[RANGE_COLUMNS]


def bounds_at(ranges: pd.DataFrame, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The low and high ends of each range row at the matching step."""
    level = ranges["level"].to_numpy(dtype=float)
    ahead = ranges["slope"].to_numpy(dtype=float) * (steps - ranges["upto_step"].to_numpy())
    shift = ranges["shift"].to_numpy(dtype=float)
    # The line, and the line moved through the newest probe, at the trend's pace and at
    # TREND_SLACK times it (a drift that quickens is a healthy run's, too).
    ends = [level + pace * ahead + moved for pace in (1.0, TREND_SLACK) for moved in (0, shift)]
    recent = [
        ranges["recent_low"].to_numpy(dtype=float),
        ranges["recent_high"].to_numpy(dtype=float),
    ]
    low = np.minimum.reduce([level, *ends, *recent])
    high = np.maximum.reduce([level, *ends, *recent])
    tolerance = ranges["tolerance"].to_numpy(dtype=float)
    low = low - tolerance
    low = np.where(ranges["nonnegative"].to_numpy(dtype=bool), np.maximum(low, 0.0), low)
    return low, high + tolerance


def first_break(
    ranges: pd.DataFrame,
    replay_scalars: pd.DataFrame,
    replay_layers: pd.DataFrame,
    event_step: int,
    event: str,
    n_layer: int,
) -> Break | None:
    """The first series of the replay to leave its healthy range before the event, or None.

    Scans the replay's rows at steps after the ranges' upto_step up to event_step, in step
    order (the rule and the tie rule: module docstring). Raises ShortHistory when `ranges`
    is empty (no series had the history to judge by) and ValueError for an unknown event.
    """
    if event not in REPLAYED:
        raise ValueError(f"event: {event!r} is not one of {', '.join(REPLAYED)}")
    if ranges.empty:
        raise ShortHistory(f"no series had {MIN_HISTORY} probes after step 0 before the checkpoint")
    upto = int(ranges["upto_step"].min())
    rows = series_rows(replay_scalars, replay_layers)
    steps = rows["step"].to_numpy(dtype=np.int64)
    rows = rows[(steps > upto) & (steps <= event_step)]
    rows = rows.drop_duplicates([*KEY, "step"], keep="last").merge(ranges, on=KEY)
    if rows.empty:
        return None
    rows = rows.sort_values([*KEY, "step"], kind="stable").reset_index(drop=True)
    low, high = bounds_at(rows, rows["step"].to_numpy(dtype=np.int64))
    value = rows["value"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        inside = np.isfinite(value) & (value >= low) & (value <= high)
        width = np.maximum(high - low, np.finfo(float).tiny)
        excursion = np.where(
            np.isfinite(value), np.maximum(low - value, value - high) / width, np.inf
        )
    rows = rows.assign(low=low, high=high, outside=~inside, excursion=excursion)
    starts = persisting(rows)
    if starts.empty:
        return None
    first = starts[starts["step"] == starts["step"].min()]
    scope_order = {SCALAR: 0, **{kind: i + 1 for i, kind in enumerate(SCANNED_KINDS)}}
    first = first.assign(order=first["scope"].map(scope_order))
    first = first.sort_values(
        ["excursion", "order", "layer", "component", "stat"],
        ascending=[False, True, True, True, True],
        kind="stable",
    )
    top = first.iloc[0]
    scalar = top["scope"] == SCALAR
    return Break(
        step=int(top["step"]),
        event_step=int(event_step),
        event=event,
        scope=str(top["scope"]),
        layer=None if scalar else int(top["layer"]),
        component=None if scalar else str(top["component"]),
        stat=str(top["stat"]),
        value=float(top["value"]),
        low=float(top["low"]),
        high=float(top["high"]),
        n_layer=int(n_layer),
    )


def persisting(rows: pd.DataFrame) -> pd.DataFrame:
    """Each series' first row outside its range that stays outside for PERSIST_STEPS rows
    in a row, or up to the series' last row (`rows` sorted by series, then step)."""
    codes = rows.groupby(KEY, sort=False).ngroup().to_numpy()
    outside = rows["outside"].to_numpy(dtype=bool)
    edges = np.flatnonzero(np.diff(codes)) + 1
    picked = []
    for start, stop in zip(np.r_[0, edges], np.r_[edges, len(rows)], strict=True):
        flags = outside[start:stop]
        for at in np.flatnonzero(flags):
            if flags[at : at + PERSIST_STEPS].all():
                picked.append(start + at)
                break
    return rows.iloc[picked]
