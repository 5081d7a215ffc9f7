"""Shared pieces of every chart: palette, constants, smoothing, tooltips, "no data yet"."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import altair as alt
import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.views.charts.colours import NEUTRAL, PALETTE

LAYER_AXIS_TITLE = spec.LAYER_AXIS_TITLE
DIVERGED_COLOR = "#d62728"
# Heat maps' cells: sequential, low to high. (Lines by depth take colours.depth_colours:
# viridis's dark and light ends vanish on one page or the other.)
LAYER_SCHEME = "viridis"
WIDTH, HEIGHT = 600, 280  # pages stretch to the container; exports use this size
SMALL_WIDTH, SMALL_HEIGHT = 150, 120  # one panel of small multiples; 4 across fit a laptop
NO_DATA = "no data yet"
WAITING_FIRST_STEP = "waiting for the first step"  # a run that trains but logged nothing yet
# Smoothing is for dense, noisy series only. A validation series is a few evaluations, each
# already an average over `eval_iters` batches; an EMA over a handful of points drags its
# last point off the real value (issue 12: 3 points at weight 0.6 ended near 2.43 where the
# real final val loss was 2.342). So val/* series and any series with fewer than MIN_SMOOTHED_POINTS
# finite points are drawn raw, whatever the slider says.
MIN_SMOOTHED_POINTS = 20
# The update-ratio chart's dashed reference line. 1e-3 is a rule of thumb for a different
# quantity: std(lr·grad) / std(θ) (Karpathy, "Building makemore Part 3"), the raw gradient
# step against the weights' spread. The chart draws ‖Δθ‖/‖θ‖, norms of the step AdamW
# actually took (momentum, per-coordinate scaling and weight decay included), so the line
# is an order-of-magnitude landmark, never a target; its label and tooltip say so.
UPDATE_RATIO_GUIDE = 1e-3
UPDATE_RATIO_GUIDE_LABEL = "1e-3: rule of thumb for std(lr·grad)/std(θ), not this ratio"
UPDATE_RATIO_GUIDE_TIP = (
    "A landmark, not a target: 1e-3 is a rule of thumb (Karpathy) for std(lr·grad)/std(θ). "
    "The lines are ‖Δθ‖/‖θ‖: the norm of the step the optimizer (AdamW) took over the norm "
    "of the weights, a different quantity."
)


class ChartError(ValueError):
    """A chart argument is out of range; the message names it, the value and what is allowed."""


# ---------------------------------------------------------------------------------------
# Small shared pieces


def check_smoothing(smoothing: float) -> None:
    """Refuse an EMA weight outside [0, 1) (a bool is not a weight)."""
    if isinstance(smoothing, bool) or not (0.0 <= float(smoothing) < 1.0):
        raise ChartError(f"smoothing: {smoothing!r} is not allowed; must be in [0, 1)")


def ema(values: pd.Series, smoothing: float) -> pd.Series:
    """TensorBoard-style debiased exponential moving average; 0 = no smoothing.

    Non-finite points pass through unchanged and do not enter the average, so one inf at
    divergence neither poisons every later point nor hides the finite ones before it.
    """
    check_smoothing(smoothing)
    numbers = pd.to_numeric(values, errors="coerce").astype(float)
    finite = np.isfinite(numbers.to_numpy())
    smoothed = numbers.copy()
    if smoothing > 0 and finite.any():
        # ewm(adjust=True) divides by the sum of the weights: exactly TensorBoard's debiasing
        # (accumulator / (1 - w**n)) without a Python loop.
        smoothed[finite] = numbers[finite].ewm(alpha=1.0 - smoothing, adjust=True).mean()
    return smoothed


def is_smoothed(name: str, n_points: int) -> bool:
    """Whether a scalar series gets the EMA: dense (>= MIN_SMOOTHED_POINTS) and not val/*."""
    return not name.startswith("val/") and n_points >= MIN_SMOOTHED_POINTS


def run_color_scale(runs: pd.DataFrame | Mapping[int, str]) -> alt.Scale:
    """Colour scale over run names: ordered by id, colour = PALETTE[run_id % 10]."""
    by_id = _run_names(runs)
    ids = sorted(by_id)
    return alt.Scale(domain=[by_id[i] for i in ids], range=[PALETTE[i % 10] for i in ids])


def category_scale(values: Sequence[object]) -> alt.Scale:
    """A colour scale over `values` in their order, PALETTE's colours in turn: explicit,
    since the renderer's default scheme has colours too pale for a white page."""
    domain = list(dict.fromkeys(values))
    return alt.Scale(domain=domain, range=[PALETTE[i % len(PALETTE)] for i in range(len(domain))])


def _run_names(runs: pd.DataFrame | Mapping[int, str]) -> dict[int, str]:
    """run id -> name from a runs frame (id, name), a tidy frame (run_id, run) or a mapping."""
    if isinstance(runs, pd.DataFrame):
        id_col, name_col = ("id", "name") if "id" in runs.columns else ("run_id", "run")
        pairs = runs[[id_col, name_col]].drop_duplicates()
        return {int(i): str(n) for i, n in zip(pairs[id_col], pairs[name_col], strict=True)}
    return {int(i): str(n) for i, n in runs.items()}


# Legend labels wrap onto lines of at most LEGEND_LINE characters, so a long run name is
# drawn whole (Vega cut it at 160 px with an ellipsis): a line ends after a "-" where one
# is near, else after "_" or ".", else at the limit. One pattern for Vega and for Python.
LEGEND_LINE = 24
LINE_PATTERN = (
    f".{{1,{LEGEND_LINE}}}$|.{{1,{LEGEND_LINE - 1}}}-|.{{1,{LEGEND_LINE - 1}}}[_.]"
    f"|.{{1,{LEGEND_LINE}}}"
)
_BROKEN = f"replace(datum.label, regexp('({LINE_PATTERN})', 'g'), '$1\\n')"
WRAPPED_LABEL = f"split(substring({_BROKEN}, 0, length({_BROKEN}) - 1), '\\n')"
# Streamlit fits a chart's title, axes and legends into its height and cuts a legend
# that is taller. There, a legend row is about ROW_PX plus LINE_PX per line of its
# label, a legend's title and the gap above it TITLE_PX, the chart's title CHART_TITLE_PX
# (measured at 1366x768 in chromium; the export's 10 px font needs less).
LEGEND_ROW_PX, LEGEND_LINE_PX, LEGEND_TITLE_PX, CHART_TITLE_PX = 16, 14, 40, 32


def wrapped_lines(label: str) -> list[str]:
    """The lines a wrapped legend draws `label` on (WRAPPED_LABEL's, in Python)."""
    return re.findall(LINE_PATTERN, label) or [label]


def wrapped_legend(**options: object) -> alt.Legend:
    """A legend with opaque symbols whose labels wrap (WRAPPED_LABEL) instead of being cut."""
    return alt.Legend(symbolOpacity=1, labelExpr=WRAPPED_LABEL, labelLimit=0, **options)


def height_for_legends(*legends: Sequence[str]) -> int:
    """The chart height (HEIGHT at least) that fits these legends, one above the other,
    each given as its labels: a taller legend than its chart was cut off on the page
    (with ten runs, the series legend under the runs' was not drawn at all)."""
    needed = CHART_TITLE_PX + sum(
        LEGEND_TITLE_PX
        + sum(LEGEND_ROW_PX + LEGEND_LINE_PX * len(wrapped_lines(str(x))) for x in labels)
        for labels in legends
        if len(labels)
    )
    return max(HEIGHT, needed)


def dash_legend() -> alt.Legend:
    """A strokeDash legend that shows the dash: each pattern drawn as a stroke in NEUTRAL
    (give the dash to line layers only: with a point layer in it, Vega-Lite drew every
    pattern as the same black dot)."""
    return alt.Legend(
        symbolType="stroke",
        symbolStrokeColor=NEUTRAL,
        symbolStrokeWidth=2,
        symbolSize=400,  # a stroke 20 px long: two dashes of a dashed line
        symbolOpacity=1,
    )


def neutral_legend_symbols(chart: alt.TopLevelMixin) -> alt.TopLevelMixin:
    """`chart` with the symbols of its legends for other channels than colour (shape,
    opacity) drawn in NEUTRAL: beside a colour encoding Vega-Lite draws them black, lost on
    a dark page. A chart-level setting: apply it to a finished chart, never to a layer."""
    return chart.configure_legend(symbolBaseFillColor=NEUTRAL, symbolBaseStrokeColor=NEUTRAL)


def chart_data(chart: alt.TopLevelMixin) -> pd.DataFrame:
    """The frame a builder attached as the chart's data (what the CSV export writes)."""
    data = getattr(chart, "data", None)
    return data.copy() if isinstance(data, pd.DataFrame) else pd.DataFrame()


def no_data(frame: pd.DataFrame, title: str, message: str = NO_DATA) -> alt.LayerChart:
    """A titled, chart-sized placeholder; its data is the (empty) frame it was given."""
    note = (
        alt.Chart(pd.DataFrame({"message": [message]}))
        .mark_text(size=14, color=NEUTRAL)
        .encode(text="message:N")
    )
    return alt.LayerChart(data=frame, layer=[note]).properties(
        title=title, width=WIDTH, height=HEIGHT
    )


def finite_values(frame: pd.DataFrame, column: str, positive: bool = False) -> pd.DataFrame:
    """Rows whose `column` is finite (and > 0 for log scales)."""
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    keep = np.isfinite(values) & ((values > 0) if positive else True)
    return frame[keep]


def sentence_case(text: str) -> str:
    """Capitalise the first letter only (titles built from lower-case axis titles)."""
    return text[:1].upper() + text[1:]


def y_scale_for(log_scale: bool) -> alt.Scale:
    return alt.Scale(type="log") if log_scale else alt.Scale(zero=False)


# About this many ticks on an x axis (Vega rounds to nice values); Vega's default, one
# tick per 40 px, put a tick every 10 steps on a 100-step chart.
X_TICKS = 7


@dataclass(frozen=True)
class XAxis:
    """What a time-series chart puts on its x axis: a column of its frame and its title."""

    field: str
    title: str
    format: str  # d3-format of the tick labels
    integer: bool  # whole numbers only (steps): no tick between two steps


# ",d": whole numbers with thousands separators. (A bare "d" lost the middle label of
# 0, 1, 2 in the browser's Vega inside Streamlit; ",d" showed all three.)
STEP_AXIS = XAxis("step", "step", ",d", integer=True)


def x_axis_encoding(
    axis: XAxis = STEP_AXIS, frame: pd.DataFrame | None = None, end: str | None = None
) -> alt.X:
    """The x encoding of a time-series chart; integer axes never get fractional ticks.

    A short integer axis (span <= X_TICKS, from `frame`'s x column and the `end` column of
    heat-map cells) gets every whole number as its ticks: Vega's tickMinStep alone still
    put ticks at 0.5 steps in vl-convert ("0, 1, 1, 2, 2" under an integer format), and in
    the browser it thins given values (0, 1, 2 drew as 0, 2), so it is left out there. A
    longer one gets about X_TICKS nice ticks, whole numbers by then, and tickMinStep 1.
    """
    options: dict[str, object] = {"format": axis.format, "tickCount": X_TICKS}
    if axis.integer:
        options["tickMinStep"] = 1
    if axis.integer and frame is not None and len(frame):
        columns = [c for c in (axis.field, end) if c and c in frame.columns]
        values = pd.to_numeric(frame[columns].stack(), errors="coerce").to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        if len(values):
            lo, hi = int(np.floor(values.min())), int(np.ceil(values.max()))
            if hi - lo <= X_TICKS:
                options = {"format": axis.format, "values": list(range(lo, hi + 1))}
    # nice=False: the axis ends at the last step drawn (a 60-step run's went on to 70)
    return alt.X(
        f"{axis.field}:Q",
        title=axis.title,
        axis=alt.Axis(**options),
        scale=alt.Scale(nice=False),
    )


def lone_points(chart: alt.Chart, groupby: list[str]) -> alt.Chart:
    """The same encoding as points, kept only for series of one point (a line of one point
    draws nothing)."""
    return (
        chart.mark_point(filled=True, size=40, opacity=1)
        .transform_joinaggregate(series_points="count()", groupby=groupby)
        .transform_filter("datum.series_points <= 1")
    )


def _head_layer(rows: pd.DataFrame) -> int | None:
    """The layer number of the final norm + head in one run's rows, when the rows show it:
    the layer of the `head` component, else the last layer when the embeddings (-1) are
    there (they come with the head)."""
    if "component" in rows.columns:
        head = rows.loc[rows["component"] == "head", "layer"]
        if len(head):
            return int(head.max())
    layers = pd.to_numeric(rows["layer"], errors="coerce")
    if (layers <= spec.EMBED_LAYER).any():
        return int(layers.max())
    return None


def with_layer_names(
    frame: pd.DataFrame, n_layers: int | Mapping[int, int] | None = None
) -> tuple[pd.DataFrame, list[str]]:
    """Add `layer_name` ('embed', '0', ..., 'head', as core.spec.layer_tick says) and return
    the names in depth order. `n_layers` is the model's n_layer (one int, or per run id);
    without it the head's layer is read from the rows (see `_head_layer`)."""
    names: dict[tuple[int, int], str] = {}
    order: dict[str, int] = {}
    for run_id, rows in frame.groupby("run_id", sort=True):
        n_layer = n_layers.get(int(run_id)) if isinstance(n_layers, Mapping) else n_layers
        if n_layer is None:
            head = _head_layer(rows)
            n_layer = head if head is not None else int(rows["layer"].max()) + 1
        for layer in rows["layer"].unique():
            name = spec.layer_tick(int(layer), int(n_layer))
            names[(int(run_id), int(layer))] = name
            # embed first, then the blocks, the head last (whatever each run's depth)
            rank = -1 if name == "embed" else (10**9 if name == "head" else int(layer))
            order[name] = rank
    keys = zip(frame["run_id"].astype(int), frame["layer"].astype(int), strict=True)
    out = frame.assign(layer_name=[names[key] for key in keys])
    return out, sorted(order, key=order.__getitem__)


def labelled_rules(
    base: alt.Chart, color: str, dash: list[int], width: float, label_y: int
) -> list[alt.Chart]:
    """A dashed vertical rule at each row of `base` (its x and tooltip encoded) and the
    row's `label` beside it, `label_y` pixels below the top of the plot."""
    rule = base.mark_rule(color=color, strokeDash=dash, strokeWidth=width)
    text = base.mark_text(
        color=color, align="left", baseline="top", dx=3, y=label_y, fontSize=11
    ).encode(text="label:N")
    return [rule, text]


def tooltips(*fields: str | alt.Tooltip) -> list[alt.Tooltip]:
    """Tooltips, with numbers shown to 4 significant digits."""
    return [alt.Tooltip(f) if isinstance(f, str) else f for f in fields]


def value_tip(field: str = "value", title: str = "value") -> alt.Tooltip:
    return alt.Tooltip(f"{field}:Q", title=title, format=".4~g")


def legend_highlight(field: str) -> alt.Parameter:
    """Click a legend entry to highlight that run / layer; click again (or empty) for all."""
    return alt.selection_point(fields=[field], bind="legend")


def x_zoom() -> alt.Parameter:
    """Drag to pan, scroll to zoom, on the x axis only (y stays fitted to the data)."""
    return alt.selection_interval(bind="scales", encodings=["x"])


def highlight_opacity(param: alt.Parameter, on: float = 1.0, off: float = 0.12) -> alt.Parameter:
    return alt.when(param).then(alt.value(on)).otherwise(alt.value(off))


def step_spans(frame: pd.DataFrame, field: str = "step") -> pd.DataFrame:
    """Add `<field>_end`: the next logged value, so heat-map cells tile the x axis."""
    steps = np.sort(frame[field].unique())
    gap = float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0
    following = dict(pairwise(steps))
    out = frame.copy()
    out[f"{field}_end"] = [following.get(s, s + gap) for s in out[field]]
    return out


def select_rows(frame: pd.DataFrame, **equals: object) -> pd.DataFrame:
    """Rows where every given column equals the given value (None = any)."""
    mask = np.ones(len(frame), dtype=bool)
    for column, wanted in equals.items():
        if wanted is not None:
            mask &= (frame[column] == wanted).to_numpy()
    return frame[mask]


def first_run(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """One-run charts show the lowest run id present; return its rows and its name."""
    run_id = frame["run_id"].min()
    rows = frame[frame["run_id"] == run_id]
    return rows, str(rows["run"].iloc[0])
