"""Live's shared state: refresh timings, session keys, the tabs, and what every tab reads
(the run's series read so far, its depth, its colour, the step a finding marked)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from blockviz.core import spec
from blockviz.core.spec import WEIGHTS_COMPONENT
from blockviz.dashboard.controls import SMOOTHING_DEFAULT, XChoice
from blockviz.dashboard.findings_panel import current_mark
from blockviz.store import RunRecord
from blockviz.views import charts, run_facts
from blockviz.views.incremental import IncrementalReader

REFRESH_S = 1.5
FIRST_POINT_REFRESH_S = 0.5  # while an active run has no loss yet: the first point sooner
FIRST_SEEN_KEY = "live.first_point_seen"  # run ids whose first loss point this session saw
SAMPLES_SHOWN = 20
CACHE_KEY = "live.cache"  # the series read so far (IncrementalReader's state)
TAB_KEY = "live.tab"
CHARTS_KEY = "live-charts"  # the container of the tabs, which Show scrolls to
TABS = ("Loss", "Gradients", "Activations", "Updates", "Attention", "Samples")
# Controls that keep their value across tab switches and refreshes (key -> default).
PREFERENCES: dict[str, Any] = {
    "live.smoothing": SMOOTHING_DEFAULT,
    "live.log_scale": False,
    "live.metric": spec.TRAIN_GRAD_NORM,  # spikes in it come before a divergence
    "live.grad.component": "block",
    "live.grad.stat": spec.GRAD_NORM,
    "live.act.stat": spec.RMS,
    "live.attn.stat": spec.ATTN_ENTROPY,
    "live.upd.component": WEIGHTS_COMPONENT,  # norm gains would dilute a whole layer's
}
# Scalars that are no chart of their own (train/elapsed_s places steps in time).
NOT_PLOTTED = (spec.TRAIN_LOSS, spec.TRAIN_LR, spec.TRAIN_ELAPSED_S)


def reader() -> IncrementalReader:
    """The run's series as read so far, kept in session state across refreshes."""
    return IncrementalReader(st.session_state, CACHE_KEY)


def run_depth(run: RunRecord) -> int:
    model = run_facts.stored_model_config(run)
    return model.n_layer if model is not None else 1  # a damaged config: the one layer all have


def has_attention(run: RunRecord) -> bool:
    model = run_facts.stored_model_config(run)
    return model.attention if model is not None else True


def has_loss(scalars: pd.DataFrame | None) -> bool:
    return scalars is not None and bool((scalars["name"] == spec.TRAIN_LOSS).any())


def colors(run: RunRecord) -> Any:
    return charts.run_color_scale({int(run.id): str(run.name)})


def marked(chart: Any, run: RunRecord, x: XChoice) -> Any:
    """The chart with the step a finding's Show marked, if one is marked for this run."""
    mark = current_mark(int(run.id))
    if mark is None:
        return chart
    return charts.with_step_mark(chart, int(mark["step"]), str(mark["label"]), x.axis)
