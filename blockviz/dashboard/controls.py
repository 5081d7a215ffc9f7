"""The chart controls Live and Compare share: smoothing, log scale and a metric to plot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import streamlit as st

SMOOTHING_DEFAULT = 0.6  # TensorBoard's default weight: noise damped, trends still sharp
SMOOTHING_LABEL = "Smoothing (EMA, as in TensorBoard)"


@dataclass(frozen=True)
class ChartControls:
    """What the controls are set to."""

    smoothing: float
    log_scale: bool
    metric: str | None  # None when there is no metric to choose


def chart_controls(
    key_prefix: str,
    metrics: Sequence[str],
    *,
    preferred: Sequence[str],
    metric_label: str = "Metric",
    widths: Sequence[int] = (3, 1, 3),
    gap: Literal["small", "medium", "large"] = "small",
) -> ChartControls:
    """One row: smoothing slider, log-scale toggle, metric picker; state under `key_prefix.*`.

    Each page passes its own prefix, so its controls keep their own values. The metric
    falls back to the first of `preferred` on offer (else the first metric) whenever the
    chosen one is not among `metrics`.
    """
    smoothing_key, log_key, metric_key = (
        f"{key_prefix}.smoothing",
        f"{key_prefix}.log_scale",
        f"{key_prefix}.metric",
    )
    # Defaults go into session state rather than the widgets' `value`: a page may have
    # set the key already (to keep it while the controls are not drawn), and Streamlit
    # logs a warning for a widget given both.
    st.session_state.setdefault(smoothing_key, SMOOTHING_DEFAULT)
    st.session_state.setdefault(log_key, False)
    if metrics and st.session_state.get(metric_key) not in metrics:
        offered = [name for name in preferred if name in metrics]
        st.session_state[metric_key] = (offered or list(metrics))[0]
    columns = st.columns(list(widths), vertical_alignment="bottom", gap=gap)
    smoothing = columns[0].slider(SMOOTHING_LABEL, 0.0, 0.99, step=0.01, key=smoothing_key)
    log_scale = columns[1].toggle("Log scale", key=log_key)
    metric = columns[2].selectbox(metric_label, metrics, key=metric_key) if metrics else None
    return ChartControls(float(smoothing), bool(log_scale), metric)
