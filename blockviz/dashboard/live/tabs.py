"""Live's six tabs: loss, gradients, activations, updates, attention, samples. Each draws
from the series the page read this refresh and marks the step a finding's Show chose."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from blockviz.core import spec
from blockviz.core.findings.induction import formation_threshold
from blockviz.core.findings.thresholds import PERSIST, PREFIX_Z
from blockviz.core.induction import repeat_half, uniform_prefix_score
from blockviz.core.spec import (
    ABOVE_RANGE,
    ACTIVATION_STATS,
    ACTIVE_STATUSES,
    BELOW_RANGE,
    COMPONENTS,
    FFN_TAP,
    FFN_UNIT_STATS,
    HEAD_STATS,
    HIST_BINS,
    HIST_RANGE,
    STREAM_STATS,
    STREAM_TAP,
    TAPS,
    WEIGHTS_COMPONENT,
    and_list,
    number_label,
)
from blockviz.dashboard import ui
from blockviz.dashboard.controls import XChoice, chart_controls
from blockviz.dashboard.findings_panel import pick_step
from blockviz.dashboard.live.state import (
    NOT_PLOTTED,
    SAMPLES_SHOWN,
    colors,
    has_attention,
    has_loss,
    marked,
    reader,
    run_depth,
)
from blockviz.store import RunRecord, RunStore
from blockviz.views import charts, run_facts
from blockviz.views.charts.marks import STEP_PICK, picked_step, with_step_picker


def _answer_caption(scalars: pd.DataFrame) -> str | None:
    """ops only: the latest answer accuracy beside the trivial baseline's on the same answers."""
    latest = scalars[scalars["name"] == spec.VAL_ANSWER_ACC].sort_values("step").tail(1)
    if latest.empty:
        return None
    step, value = int(latest["step"].iloc[0]), float(latest["value"].iloc[0])
    if value != value:  # NaN: the evaluation scored no answer
        return f"Answer accuracy at step {step:,}: no whole question fell in a validation window."
    text = f"Answer accuracy at step {step:,}: {value:.1%}"
    same_step = (scalars["name"] == spec.VAL_ANSWER_BASELINE) & (scalars["step"] == step)
    baseline = scalars.loc[same_step, "value"]
    if baseline.empty:
        return text + "."
    # A model that only copies first/last's argument and guesses gets this much for free.
    return (
        f"{text}; the trivial baseline on the same answers: {float(baseline.iloc[0]):.1%} "
        "(first/last copy their argument, other ops guess their most frequent training answer)."
    )


def loss_tab(run: RunRecord, scalars: pd.DataFrame, x: XChoice) -> None:
    name = str(run.name)
    others = [n for n in sorted(set(scalars["name"])) if n not in NOT_PLOTTED]
    chosen = chart_controls(
        "live",
        others,
        preferred=(spec.TRAIN_GRAD_NORM, spec.VAL_BPC),
        metric_label="Another metric",
        widths=(3, 1, 2),
        gap="large",
    )
    smoothing, log_scale, metric = chosen.smoothing, chosen.log_scale, chosen.metric
    placed = x.place(scalars)
    with ui.guard("Loss chart"):
        if not has_loss(scalars):  # just launched: a placeholder, nothing to click or export
            message = charts.WAITING_FIRST_STEP if run.status in ACTIVE_STATUSES else None
            waiting = charts.no_data(pd.DataFrame(), "Loss", message or charts.NO_DATA)
            ui.chart_with_downloads(waiting, pd.DataFrame(), f"{name} loss", "live.loss")
            return
        step = run.diverged_step
        diverged = {name: int(step)} if step is not None else None
        chart = charts.loss_chart(
            placed, smoothing, log_scale, colors=colors(run), diverged=diverged, x_axis=x.axis
        )
        chart = with_step_picker(marked(chart, run, x), x.axis)
        event = ui.chart_with_downloads(
            chart, charts.chart_data(chart), f"{name} loss", "live.loss", STEP_PICK
        )
        pick_step(int(run.id), picked_step(event))
    lr_col, metric_col = st.columns(2, gap="large")
    with lr_col, ui.guard("Learning-rate chart"):
        chart = charts.metric_chart(
            placed, spec.TRAIN_LR, colors=colors(run), title="Learning rate", x_axis=x.axis
        )
        chart = marked(chart, run, x)
        ui.chart_with_downloads(chart, charts.chart_data(chart), f"{name} lr", "live.lr")
    if metric is not None:
        with metric_col, ui.guard("Metric chart"):
            chart = charts.metric_chart(
                placed, metric, smoothing, log_scale, colors=colors(run), x_axis=x.axis
            )
            chart = marked(chart, run, x)
            ui.chart_with_downloads(chart, charts.chart_data(chart), f"{name} {metric}", "live.m")
    answers = _answer_caption(scalars)
    if answers is not None:
        st.caption(answers)


def gradients_tab(store: RunStore, run: RunRecord, scalars: pd.DataFrame, x: XChoice) -> None:
    name, run_id = str(run.name), int(run.id)
    controls = st.columns([3, 2])
    component = controls[0].segmented_control(
        "Component", COMPONENTS, required=True, key="live.grad.component"
    )
    stat = controls[1].segmented_control(
        "Statistic",
        spec.NORM_STATS,
        required=True,
        format_func=spec.stat_label,
        key="live.grad.stat",
    )
    stats = x.place(reader().layer_stats(store, run_id, "component"))
    n_layer = run_depth(run)
    lines_col, heat_col = st.columns(2, gap="large")
    with lines_col, ui.guard("Per-layer lines"):
        chart = charts.layer_lines(stats, stat, component, x_axis=x.axis, n_layers=n_layer)
        label = f"{name} {stat} {component} by layer"
        chart = marked(chart, run, x)
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.grad.lines")
    with heat_col, ui.guard("Layer x step heat map"):
        chart = charts.layer_heatmap(stats, stat, component, x_axis=x.axis, n_layers=n_layer)
        label = f"{name} {stat} {component} heatmap"
        chart = marked(chart, run, x)
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.grad.heat")
    with ui.guard("Global gradient norm"):
        chart = charts.metric_chart(
            x.place(scalars),
            spec.TRAIN_GRAD_NORM,
            log_scale=True,
            colors=colors(run),
            title="Global gradient norm (before clipping)",
            x_axis=x.axis,
        )
        chart = marked(chart, run, x)
        ui.chart_with_downloads(chart, charts.chart_data(chart), f"{name} grad norm", "live.gn")


def activations_tab(store: RunStore, run: RunRecord, x: XChoice) -> None:
    name, run_id = str(run.name), int(run.id)
    stat = st.segmented_control(
        "Statistic",
        ACTIVATION_STATS,
        required=True,
        key="live.act.stat",
        help=f"{and_list(STREAM_STATS)} are read at each block's output ({STREAM_TAP}), "
        f"{and_list(FFN_UNIT_STATS)} at the FFN's hidden units ({FFN_TAP}); the others at every "
        "tap.",
    )
    with ui.guard("Activation statistics"):
        taps = x.place(reader().layer_stats(store, run_id, "tap"))
        chart = charts.tap_stats_chart(taps, stat, x_axis=x.axis, n_layers=run_depth(run))
        chart = marked(chart, run, x)
        label = f"{name} activation {stat}"
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.act")
    st.markdown("**Histogram over time**")
    lo, hi = (number_label(end) for end in HIST_RANGE)
    st.caption(
        f"{HIST_BINS} equal bins over [{lo}, {hi}], counting only the values inside; the "
        "share of values below and above the range is in the subtitle and the tooltip "
        f"(statistics {BELOW_RANGE} and {ABOVE_RANGE} above)."
    )
    layers = list(range(run_depth(run)))
    layer_key = f"live.{run_id}.hist.layer"
    if st.session_state.get(layer_key) not in layers:
        st.session_state[layer_key] = layers[-1]
    controls = st.columns(2)
    layer = controls[0].selectbox("Layer", layers, key=layer_key)
    with ui.guard("Histogram"):
        hist = store.histograms(run_id, layer=layer)
        recorded = set(hist["tap"])
        taps = [t for t in TAPS if t in recorded] + sorted(recorded - set(TAPS))
        if not taps:
            st.info(f"No activation histograms for layer {layer} yet; the probes record them.")
            return
        tap_key = f"live.{run_id}.hist.tap"
        if st.session_state.get(tap_key) not in taps:
            st.session_state[tap_key] = taps[-1]
        tap = controls[1].selectbox("Tap", taps, key=tap_key)
        # Read whole (no downsampling), so the subtitle's largest share is the true one.
        outside = store.layer_stats(
            run_id, kind="tap", stat=(BELOW_RANGE, ABOVE_RANGE), layer=layer, component=tap
        )
        chart = charts.histogram_over_time(
            x.place(hist), layer, tap, tap_stats=outside, x_axis=x.axis
        )
        label = f"{name} histogram layer {layer} {tap}"
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.hist")


def updates_tab(store: RunStore, run: RunRecord, x: XChoice) -> None:
    name, run_id = str(run.name), int(run.id)
    component = st.segmented_control(
        "Component", COMPONENTS, required=True, key="live.upd.component"
    )
    st.caption(
        "‖Δθ‖/‖θ‖ per step: the norm of one optimizer step's change to the chosen tensors "
        "over the norm of those tensors, at each probe step. **weights** sums the layer's "
        "weight matrices only; **block** sums every tensor of the layer, where the norm gains "
        "(ones at initialization, ‖γ‖² = d_model) and biases dilute the ratio. The dashed "
        "1e-3 line is a rule of thumb for another quantity, std(lr·grad)/std(θ): a landmark, "
        "not a target."
    )
    with ui.guard("Update-to-data ratio"):
        stats = x.place(reader().layer_stats(store, run_id, "component"))
        # None: the weight matrices, or the whole layer for a run recorded before the
        # probes summed the matrices alone (the chart's title says which it shows).
        chosen = None if component == WEIGHTS_COMPONENT else component
        chart = charts.update_ratio_chart(stats, chosen, x_axis=x.axis, n_layers=run_depth(run))
        chart = marked(chart, run, x)
        label = f"{name} update ratio {component}"
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.upd")


def attention_tab(store: RunStore, run: RunRecord, x: XChoice) -> None:
    name, run_id = str(run.name), int(run.id)
    if not has_attention(run):
        st.info("This run's blocks have no attention (attention is off in its config).")
        return
    stat = st.segmented_control(
        "Statistic",
        HEAD_STATS,
        required=True,
        key="live.attn.stat",
        format_func=spec.stat_label,
        help="Per head, on the fixed probe batch: the mean entropy of its attention rows, "
        "its largest logit q·k/√d before the softmax, or its largest |q·k/√d|. Of induction: "
        "the prefix-matching score (on repeated random text, its attention to the token "
        "after the current token's previous occurrence) and the copying score (whether "
        "attending to a token raises that token's logit, −1 to 1).",
    )
    with ui.guard("Attention per head"):
        heads = x.place(reader().layer_stats(store, run_id, "head"))
        log_scale = stat in spec.LOG_HEAD_STATS
        chart = charts.attention_entropy_chart(heads, x_axis=x.axis, stat=stat, log_scale=log_scale)
        chart = marked(chart, run, x)
        label = f"{name} {stat}"
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.entropy")
        if stat in spec.INDUCTION_STATS:
            st.caption(induction_caption(stat, run))
    st.markdown("**Attention maps**")
    steps = store.attention_steps(run_id)
    if not steps:
        st.info("No attention maps yet: they are recorded with every generated sample.")
        return
    newest_first = steps[::-1]
    step_key, layer_key = f"live.{run_id}.attn.step", f"live.{run_id}.attn.layer"
    if st.session_state.get(step_key) not in newest_first:
        st.session_state[step_key] = newest_first[0]
    layers = list(range(run_depth(run)))
    if st.session_state.get(layer_key) not in layers:
        st.session_state[layer_key] = 0
    controls = st.columns(3)
    step = controls[0].selectbox("Logged step", newest_first, key=step_key)
    layer = controls[1].selectbox("Layer", layers, key=layer_key)
    with ui.guard("Attention map"):
        attention = store.attention(run_id, step, layer=layer)
        heads = sorted(int(h) for h in set(attention["head"]))
        head = controls[2].selectbox(
            "Head",
            [None, *heads],
            format_func=lambda h: "all heads" if h is None else f"head {h}",
            key=f"live.{run_id}.attn.head",
        )
        if head is not None:
            attention = attention[attention["head"] == head]
        chart = charts.attention_heatmap(attention, layer)
        label = f"{name} attention step {step} layer {layer}"
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.attn")
        st.caption(
            "Rows are queries, columns keys, each labelled with its character of the probe "
            "text (␣ a space, ⏎ a newline, ⇥ a tab); hover a cell for its weight."
        )


def induction_caption(stat: str, run: RunRecord) -> str:
    """What an induction score measures, with this run's uniform-attention baseline."""
    if stat == spec.COPY_SCORE:
        return (
            "Copying score: Σ Re λ / Σ |λ| over the eigenvalues of the head's OV circuit from "
            "the token embedding to the logits, W_U·W_O·W_V·W_E (Elhage et al. 2021). 1: "
            "attending to a token raises that token's logit; −1: lowers it. Norms, biases "
            "and the other layers are left out."
        )
    if stat == spec.PREFIX_SCORE_SE:
        return (
            "Standard error of the prefix-matching score: the sample standard deviation of "
            "the repeated batch's rows' scores over the square root of their number. The "
            f"findings read the score less {PREFIX_Z:g} standard errors when a head forms."
        )
    model = run_facts.stored_model_config(run)
    block_size = model.block_size if model is not None else None
    half = repeat_half(block_size) if block_size is not None else None
    baseline = f" Attending uniformly scores {uniform_prefix_score(half):.3f} here." if half else ""
    threshold = formation_threshold(block_size)
    return (
        "Prefix-matching score (Olsson et al. 2022): on a fixed batch of random text whose "
        "second half repeats its first, the head's mean attention from each query of the "
        "repeat to the token just after the query token's previous occurrence: an induction "
        f"head's pattern. The findings call a head formed once its score less {PREFIX_Z:g} "
        f"standard errors is at or above {threshold:.3g} at {PERSIST} probes in a row, until it "
        f"falls clearly below.{baseline}"
    )


def samples_tab(store: RunStore, run: RunRecord) -> None:
    samples = store.samples(int(run.id), limit=SAMPLES_SHOWN)
    if samples.empty:
        st.info("No samples yet: the model writes one every sample_interval steps.")
        return
    for row in samples.itertuples(index=False):
        st.markdown(f"**step {int(row.step):,}** · prompt {ui.literal(repr(row.prompt))}")
        st.code(row.text, language=None, wrap_lines=True)
