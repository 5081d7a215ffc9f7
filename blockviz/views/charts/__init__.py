"""Altair chart builders: a tidy DataFrame from the run store in, an `alt.Chart` out.

Pure functions: no Streamlit, no torch, no store access, so the pages, the exports and the
tests build exactly the same chart. Conventions shared by every builder:

- Scalar series are EMA-smoothed only when dense (`is_smoothed`: at least
  MIN_SMOOTHED_POINTS points, never val/*); the others are drawn as they are.
- The frame the chart draws (after filtering and smoothing, with the smoothed column) is
  the chart's top-level `data`; `chart_data(chart)` reads it back for the CSV export. Extra
  layers that annotate (divergence rules, guide lines, "no data yet") carry their own data.
- Line charts have tooltips (run, step, value, plus layer / component where relevant), a
  legend that highlights the clicked run or layer, and zoom / pan on the x axis.
- Runs keep one colour everywhere: `run_color_scale` maps run id % 10 onto a fixed palette.
- Every colour a line, point, rule or text is drawn in reads on a light and on a dark page
  (`colours`: WCAG contrast >= 3:1 against both); colour scales are explicit, never the
  renderer's default scheme.
- Non-finite values (a diverged run's inf / NaN) are dropped from marks, never raised on;
  the step where they start is marked on loss and metric charts instead.
- A linear loss axis stops at twice the runs' starting loss when a value lies above it
  (a blown-up run): those values sit on the top edge and the subtitle names their runs;
  the chart's data, and so its CSV, keep them raw.
- An empty frame gives a chart that says "no data yet".
"""

from blockviz.views.charts.attention import attention_entropy_chart, attention_heatmap
from blockviz.views.charts.base import (
    DIVERGED_COLOR,
    LAYER_AXIS_TITLE,
    LAYER_SCHEME,
    MIN_SMOOTHED_POINTS,
    NO_DATA,
    STEP_AXIS,
    UPDATE_RATIO_GUIDE,
    WAITING_FIRST_STEP,
    ChartError,
    XAxis,
    chart_data,
    ema,
    is_smoothed,
    no_data,
    run_color_scale,
    with_layer_names,
    wrapped_legend,
)
from blockviz.views.charts.colours import NEUTRAL, PALETTE, depth_colours, readable
from blockviz.views.charts.init_grads import (
    init_grad_means,
    init_grad_profile_chart,
    init_grad_ratio_chart,
)
from blockviz.views.charts.layers import (
    histogram_over_time,
    layer_heatmap,
    layer_lines,
    tap_stats_chart,
    update_ratio_chart,
)
from blockviz.views.charts.marks import MARK_COLOR, with_step_mark
from blockviz.views.charts.params import param_breakdown_chart, param_layer_chart
from blockviz.views.charts.profile import grad_by_layer_chart, nearest_probe_steps
from blockviz.views.charts.series import loss_chart, metric_chart
from blockviz.views.charts.xaxis import (
    NO_TIME_NOTE,
    X_AXES,
    X_AXIS_LABELS,
    RunClocks,
    run_clocks,
    tokens_per_step,
    with_x,
)

__all__ = [
    "DIVERGED_COLOR",
    "LAYER_AXIS_TITLE",
    "LAYER_SCHEME",
    "MARK_COLOR",
    "MIN_SMOOTHED_POINTS",
    "NEUTRAL",
    "NO_DATA",
    "NO_TIME_NOTE",
    "PALETTE",
    "STEP_AXIS",
    "UPDATE_RATIO_GUIDE",
    "WAITING_FIRST_STEP",
    "X_AXES",
    "X_AXIS_LABELS",
    "ChartError",
    "RunClocks",
    "XAxis",
    "attention_entropy_chart",
    "attention_heatmap",
    "chart_data",
    "depth_colours",
    "ema",
    "grad_by_layer_chart",
    "histogram_over_time",
    "init_grad_means",
    "init_grad_profile_chart",
    "init_grad_ratio_chart",
    "is_smoothed",
    "layer_heatmap",
    "layer_lines",
    "loss_chart",
    "metric_chart",
    "nearest_probe_steps",
    "no_data",
    "param_breakdown_chart",
    "param_layer_chart",
    "readable",
    "run_clocks",
    "run_color_scale",
    "tap_stats_chart",
    "tokens_per_step",
    "update_ratio_chart",
    "with_layer_names",
    "with_step_mark",
    "with_x",
    "wrapped_legend",
]
