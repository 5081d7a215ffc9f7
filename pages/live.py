"""Live: one run as it trains — findings, status, loss, gradients, activations, updates,
attention, samples.

While the run is queued or running, everything below the run picker is a fragment that
reruns every 1.5 s on its own (the rest of the page and the sidebar stay put). Only the open
tab reads and draws; the per-step series are kept in session state and extended with the
rows logged since the last refresh instead of being read whole every time. When any run's
status changes (queued -> running, a dead run reaped as failed) the whole page reruns once,
so the picker's labels and the header always show the same status.

Under the header, the findings panel says in words what the series show (core.findings),
evaluated again at most every 5 s while it trains; Show opens the tab that draws a finding and
marks its step on every chart of the page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pandas as pd
import streamlit as st

from blockviz.core import spec
from blockviz.core.findings import Finding
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
from blockviz.dashboard import relaunch, store_access, ui
from blockviz.dashboard.code_download import code_download_button
from blockviz.dashboard.controls import (
    SMOOTHING_DEFAULT,
    XChoice,
    chart_controls,
    x_axis_choice,
    x_axis_widget,
)
from blockviz.dashboard.findings_panel import current_mark, findings_panel, take_scroll
from blockviz.launch import runner
from blockviz.store import RunRecord, RunStore, StoreError
from blockviz.views import charts, run_findings, summary
from blockviz.views.incremental import IncrementalReader

REFRESH_S = 1.5
FIRST_POINT_REFRESH_S = 0.5  # while an active run has no loss yet: the first point sooner
FIRST_SEEN_KEY = "live.first_point_seen"  # run ids whose first loss point this session saw
SAMPLES_SHOWN = 20
CACHE_KEY = "live.cache"  # the series read so far (IncrementalReader's state)
TAB_KEY = "live.tab"
CHARTS_KEY = "live-charts"  # the container of the tabs, which Show scrolls to
TABS = ("Loss", "Gradients", "Activations", "Updates", "Attention", "Samples")
STATUS_COLORS = {
    "queued": "gray",
    spec.STARTING: "blue",
    "running": "blue",
    "completed": "green",
    "diverged": "orange",
    "failed": "red",
    "stopped": "violet",
}
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
NOT_PLOTTED = (spec.TRAIN_LOSS, spec.TRAIN_LR, charts.ELAPSED_SCALAR)


# ---------------------------------------------------------------------------- reading


def _reader() -> IncrementalReader:
    """The run's series as read so far, kept in session state across refreshes."""
    return IncrementalReader(st.session_state, CACHE_KEY)


def _n_layer(run: RunRecord) -> int:
    model = summary.stored_model_config(run)
    return model.n_layer if model is not None else 1  # a damaged config: the one layer all have


def _has_attention(run: RunRecord) -> bool:
    model = summary.stored_model_config(run)
    return model.attention if model is not None else True


# ---------------------------------------------------------------------------- header


def _format_params(n_params: Any) -> str:
    if n_params is None or pd.isna(n_params):
        return "—"
    count = int(n_params)
    return f"{count / 1e6:.2f} M" if count >= 1e6 else f"{count / 1e3:.1f} k"


def newest_step(run: RunRecord, scalars: pd.DataFrame) -> int | None:
    """The run's step as this refresh read it: the newest logged step, or the row's step
    when that is further on (one read per refresh: the header and the charts agree)."""
    steps = [int(scalars["step"].max())] if not scalars.empty else []
    if run.step is not None and not pd.isna(run.step):
        steps.append(int(run.step))
    return max(steps) if steps else None


def _header(store: RunStore, run: RunRecord, scalars: pd.DataFrame, shown: str) -> None:
    """One row: name, status badge (`shown`: the status as the picker words it), the numbers
    a glance needs, Stop; then the progress bar while the run trains. The run's fixed facts
    and actions sit in the sidebar."""
    run_id, status = int(run.id), str(run.status)
    step, max_steps = newest_step(run, scalars), run.max_steps
    writable = store_access.writable(store)
    tokens_per_sec = summary.recent_tokens_per_sec(scalars, window=spec.RECENT_LOGS)
    facts = ["Step —" if step is None else f"Step {step:,}"]
    if max_steps:
        facts[0] += f" of {int(max_steps):,}"
    if tokens_per_sec is not None:
        facts.append(f"{tokens_per_sec:,.0f} tokens/s")
    if status in ACTIVE_STATUSES:
        eta = runner.eta_s(store, run_id, step, int(max_steps)) if step and max_steps else None
        if eta is not None:
            facts.append(f"ETA {ui.format_duration(eta)}")
    else:
        started, ended = run.started, run.ended
        if started and ended:
            facts.append(f"took {ui.format_duration(ended - started)}")
    with st.container(horizontal=True, vertical_alignment="center", gap="small"):
        st.subheader(f"#{run_id} {ui.plain(run.name)}", anchor=False, width="content")
        st.badge(shown, color=STATUS_COLORS.get(shown, STATUS_COLORS.get(status, "gray")))
        tokens_help = f"{spec.RECENT_TOKENS_PER_SEC}: {spec.RECENT_TOKENS_PER_SEC_HELP}"
        st.caption(" · ".join(facts), help=tokens_help)
        if status in ACTIVE_STATUSES and st.button(
            "Stop",
            key="live.stop",
            icon=":material/stop_circle:",
            help="Checkpoint and stop" if writable else store_access.READONLY_NOTICE,
            disabled=not writable,
        ):
            st.toast(ui.plain(f"Run #{run_id}: {runner.stop(store, run_id)}"))
    if status in ACTIVE_STATUSES and step is not None and max_steps:
        st.progress(min(max(step / int(max_steps), 0.0), 1.0))


def _facts_sidebar(run: RunRecord) -> None:
    """The run's fixed facts, in the sidebar under its actions."""
    rows = {
        "Parameters": _format_params(run.n_params),
        "Device": run.device or "—",
        "Precision": run.precision or "—",
    }
    st.caption("  \n".join(f"{label}: **{ui.plain(value)}**" for label, value in rows.items()))


def _status_message(store: RunStore, run: RunRecord, scalars: pd.DataFrame, shown: str) -> None:
    """What the status means, for the statuses the findings do not cover (a diverged
    run's story is the findings panel's headline)."""
    status = run.status
    step = run.step
    if status == "failed":
        at = f" at step {int(step):,}" if step is not None else ""
        error = ui.plain(run.error or "no error was recorded.")
        st.error(f"**This run failed{at}:** {error}")
        with st.expander("Log tail (last 40 lines of train.log)", expanded=True):
            tail = runner.log_tail(store, int(run.id))
            st.code(tail or "(the run wrote no log)", language=None)
    elif status == "stopped":
        st.info(f"Stopped at step {step if step is not None else 0:,}.")
    elif status == "queued" and shown == spec.STARTING:
        st.info("Starting: the run's process is getting ready; it has a free slot.")
    elif status == "queued":
        st.info(f"Queued: {spec.WAITING_FOR_SLOT}. It starts when a running run ends.")
    elif status == "running" and scalars.empty:
        st.info("Starting up: the charts fill in from the first logged step.")


# ---------------------------------------------------------------------------- tabs


def _colors(run: RunRecord) -> Any:
    return charts.run_color_scale({int(run.id): str(run.name)})


def _marked(chart: Any, run: RunRecord, x: XChoice) -> Any:
    """The chart with the step a finding's Show marked, if one is marked for this run."""
    mark = current_mark(int(run.id))
    if mark is None:
        return chart
    return charts.with_step_mark(chart, int(mark["step"]), str(mark["label"]), x.axis)


def _show_finding(finding: Finding) -> None:
    """Open the tab that draws the finding, with the controls set to its series."""
    st.session_state[TAB_KEY] = finding.tab
    series = finding.series
    if series in spec.NORM_STATS:
        st.session_state["live.grad.component"] = "block"
        st.session_state["live.grad.stat"] = series
    elif series == spec.UPDATE_RATIO:
        st.session_state["live.upd.component"] = WEIGHTS_COMPONENT
    elif series in HEAD_STATS:
        st.session_state["live.attn.stat"] = series
    elif series in ACTIVATION_STATS:
        st.session_state["live.act.stat"] = series
    elif series not in spec.LOSS_NAMES:
        st.session_state["live.metric"] = series


def _findings(run: RunRecord, store: RunStore, scalars: pd.DataFrame) -> None:
    """The findings panel: the same findings as `show` and Compare (whole series, not the
    charts' downsampled ones), read again at most every 5 s while the run trains."""
    found = run_findings.cached_findings(store, run, logged=_has_loss(scalars))
    active = run.status in ACTIVE_STATUSES
    findings_panel(run, found, _show_finding, as_of=found.step if active else None)


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


def _loss_tab(run: RunRecord, scalars: pd.DataFrame, x: XChoice) -> None:
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
        step = run.diverged_step
        diverged = {name: int(step)} if step is not None else None
        chart = charts.loss_chart(
            placed, smoothing, log_scale, colors=_colors(run), diverged=diverged, x_axis=x.axis
        )
        chart = _marked(chart, run, x)
        ui.chart_with_downloads(chart, charts.chart_data(chart), f"{name} loss", "live.loss")
    lr_col, metric_col = st.columns(2, gap="large")
    with lr_col, ui.guard("Learning-rate chart"):
        chart = charts.metric_chart(
            placed, spec.TRAIN_LR, colors=_colors(run), title="Learning rate", x_axis=x.axis
        )
        chart = _marked(chart, run, x)
        ui.chart_with_downloads(chart, charts.chart_data(chart), f"{name} lr", "live.lr")
    if metric is not None:
        with metric_col, ui.guard("Metric chart"):
            chart = charts.metric_chart(
                placed, metric, smoothing, log_scale, colors=_colors(run), x_axis=x.axis
            )
            chart = _marked(chart, run, x)
            ui.chart_with_downloads(chart, charts.chart_data(chart), f"{name} {metric}", "live.m")
    answers = _answer_caption(scalars)
    if answers is not None:
        st.caption(answers)


def _gradients_tab(store: RunStore, run: RunRecord, scalars: pd.DataFrame, x: XChoice) -> None:
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
    stats = x.place(_reader().layer_stats(store, run_id, "component"))
    n_layer = _n_layer(run)
    lines_col, heat_col = st.columns(2, gap="large")
    with lines_col, ui.guard("Per-layer lines"):
        chart = charts.layer_lines(stats, stat, component, x_axis=x.axis, n_layers=n_layer)
        label = f"{name} {stat} {component} by layer"
        chart = _marked(chart, run, x)
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.grad.lines")
    with heat_col, ui.guard("Layer x step heat map"):
        chart = charts.layer_heatmap(stats, stat, component, x_axis=x.axis, n_layers=n_layer)
        label = f"{name} {stat} {component} heatmap"
        chart = _marked(chart, run, x)
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.grad.heat")
    with ui.guard("Global gradient norm"):
        chart = charts.metric_chart(
            x.place(scalars),
            spec.TRAIN_GRAD_NORM,
            log_scale=True,
            colors=_colors(run),
            title="Global gradient norm (before clipping)",
            x_axis=x.axis,
        )
        chart = _marked(chart, run, x)
        ui.chart_with_downloads(chart, charts.chart_data(chart), f"{name} grad norm", "live.gn")


def _activations_tab(store: RunStore, run: RunRecord, x: XChoice) -> None:
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
        taps = x.place(_reader().layer_stats(store, run_id, "tap"))
        chart = charts.tap_stats_chart(taps, stat, x_axis=x.axis, n_layers=_n_layer(run))
        chart = _marked(chart, run, x)
        label = f"{name} activation {stat}"
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.act")
    st.markdown("**Histogram over time**")
    lo, hi = (number_label(end) for end in HIST_RANGE)
    st.caption(
        f"{HIST_BINS} equal bins over [{lo}, {hi}], counting only the values inside; the "
        "share of values below and above the range is in the subtitle and the tooltip "
        f"(statistics {BELOW_RANGE} and {ABOVE_RANGE} above)."
    )
    layers = list(range(_n_layer(run)))
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


def _updates_tab(store: RunStore, run: RunRecord, x: XChoice) -> None:
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
        stats = x.place(_reader().layer_stats(store, run_id, "component"))
        # None: the weight matrices, or the whole layer for a run recorded before the
        # probes summed the matrices alone (the chart's title says which it shows).
        chosen = None if component == WEIGHTS_COMPONENT else component
        chart = charts.update_ratio_chart(stats, chosen, x_axis=x.axis, n_layers=_n_layer(run))
        chart = _marked(chart, run, x)
        label = f"{name} update ratio {component}"
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.upd")


def _attention_tab(store: RunStore, run: RunRecord, x: XChoice) -> None:
    name, run_id = str(run.name), int(run.id)
    if not _has_attention(run):
        st.info("This run's blocks have no attention (attention is off in its config).")
        return
    stat = st.segmented_control(
        "Statistic",
        HEAD_STATS,
        required=True,
        key="live.attn.stat",
        format_func=spec.stat_label,
        help="Per head, on the fixed probe batch: the mean entropy of its attention rows, "
        "its largest logit q·k/√d before the softmax, or its largest |q·k/√d|.",
    )
    with ui.guard("Attention per head"):
        heads = x.place(_reader().layer_stats(store, run_id, "head"))
        logits = stat != spec.ATTN_ENTROPY
        chart = charts.attention_entropy_chart(heads, x_axis=x.axis, stat=stat, log_scale=logits)
        chart = _marked(chart, run, x)
        label = f"{name} {stat}"
        ui.chart_with_downloads(chart, charts.chart_data(chart), label, "live.entropy")
    st.markdown("**Attention maps**")
    steps = store.attention_steps(run_id)
    if not steps:
        st.info("No attention maps yet: they are recorded with every generated sample.")
        return
    newest_first = steps[::-1]
    step_key, layer_key = f"live.{run_id}.attn.step", f"live.{run_id}.attn.layer"
    if st.session_state.get(step_key) not in newest_first:
        st.session_state[step_key] = newest_first[0]
    layers = list(range(_n_layer(run)))
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


def _samples_tab(store: RunStore, run: RunRecord) -> None:
    samples = store.samples(int(run.id), limit=SAMPLES_SHOWN)
    if samples.empty:
        st.info("No samples yet: the model writes one every sample_interval steps.")
        return
    for row in samples.itertuples(index=False):
        st.markdown(f"**step {int(row.step):,}** · prompt {ui.literal(repr(row.prompt))}")
        st.code(row.text, language=None, wrap_lines=True)


# ---------------------------------------------------------------------------- the page


def _has_loss(scalars: pd.DataFrame | None) -> bool:
    return scalars is not None and bool((scalars["name"] == spec.TRAIN_LOSS).any())


def _live(store: RunStore, run_id: int, seen: dict[int, str], waiting_first: bool = False) -> None:
    """Everything that changes while the run trains; a fragment while it is active.

    `seen` is the status of every run as the picker above shows it. When the store says
    otherwise, the whole page reruns, so the picker's labels, the header and the refresh
    timer follow the change.
    """
    store_access.reap_dead(store)
    try:
        run = store.get_run(run_id)
    except StoreError:
        ui.flash("warning", f"Run #{run_id} was deleted while it was open here.")
        ui.select_run(None)
        st.rerun()
    runs = store.runs_frame()
    fresh = ui.run_statuses(runs)
    if fresh != seen:
        st.rerun()
    run = replace(run, status=fresh[run_id])  # what the picker shows, unchanged since read
    shown = runner.shown_in(runs).get(run_id, run.status)  # queued -> starting
    for key, default in PREFERENCES.items():
        # Re-assigning keeps a control's value while its tab is closed (Streamlit would
        # otherwise forget the state of widgets that were not drawn).
        st.session_state[key] = st.session_state.get(key, default)
    scalars: pd.DataFrame | None = None
    with ui.guard("Run header"):
        scalars = _reader().scalars(store, run_id)
        _header(store, run, scalars, shown)
        _status_message(store, run, scalars, shown)
    if scalars is not None:
        with ui.guard("Findings"):
            _findings(run, store, scalars)
    if scalars is None:
        return  # the store could not be read; the message above says why
    if waiting_first and _has_loss(scalars):
        # The first loss is here: once per run, rerun at the ordinary refresh.
        st.session_state.setdefault(FIRST_SEEN_KEY, set()).add(run_id)
        st.rerun()
    x = x_axis_choice("live", [run], scalars)
    if x.note:
        st.caption(ui.plain(x.note))
    charts_box = st.container(key=CHARTS_KEY)
    if take_scroll():  # a finding's Show: its tab is open; bring it into view
        ui.scroll_into_view(CHARTS_KEY)
    tabs = charts_box.tabs(TABS, key=TAB_KEY, on_change="rerun")
    renderers: dict[str, Callable[[], None]] = {
        "Loss": lambda: _loss_tab(run, scalars, x),
        "Gradients": lambda: _gradients_tab(store, run, scalars, x),
        "Activations": lambda: _activations_tab(store, run, x),
        "Updates": lambda: _updates_tab(store, run, x),
        "Attention": lambda: _attention_tab(store, run, x),
        "Samples": lambda: _samples_tab(store, run),
    }
    for label, tab in zip(TABS, tabs, strict=True):
        if tab.open is False:
            continue  # only the open tab reads and draws
        with tab, ui.guard(f"{label} tab"):
            renderers[label]()


def _pick_run(store: RunStore) -> tuple[int, dict[int, str]] | None:
    """The run to show (picked in the sidebar) and every run's status as the picker shows
    it; a word when there is none."""
    store_access.reap_dead(store)
    runs = store.runs_frame()
    if runs.empty:
        st.title("Live")
        st.info(
            "No runs yet — set up a block in the sidebar and press Launch on the Train page. "
            "The run appears here and updates as it trains."
        )
        return None
    notice = ui.selection_notice(runs)
    if notice:
        st.warning(ui.plain(notice))
    with st.sidebar:
        selected = ui.run_picker(store, "Run", multi=False, key="live.run", runs=runs)
    if selected is None:
        st.title("Live")
        st.info("Pick a run in the sidebar.")
        return None
    if runs.loc[runs["id"] == selected, "train_loss"].notna().any():
        st.session_state.setdefault(FIRST_SEEN_KEY, set()).add(selected)
    return selected, ui.run_statuses(runs)


def _sidebar(store: RunStore, run_id: int) -> None:
    """Under the picker: Edit & relaunch, Resume, Export as code, the run's fixed facts and
    the x axis, so the page itself opens on the run's charts."""
    x_axis_widget("live")
    # Edit & relaunch / Resume (as on Runs); a just-resumed run refreshes until it starts.
    with ui.guard("Run actions"):
        relaunch.action_row(store, run_id, "live", store_access.writable(store))
        run = store.get_run(run_id)
        code_download_button(run.config, str(run.name), key="live.code")
        _facts_sidebar(run)


store = store_access.store_or_stop()
ui.show_flashes()
store_access.store_notice(store)
picked: tuple[int, dict[int, str]] | None = None
with ui.guard("Reading the run store"):
    picked = _pick_run(store)
if picked is not None:
    run_id, seen = picked
    active = seen.get(run_id) in ACTIVE_STATUSES
    with st.sidebar:
        _sidebar(store, run_id)
    active = active or relaunch.recently_resumed()
    # Quick looks until the first loss arrives (then `_live` reruns the page at REFRESH_S).
    waiting_first = active and run_id not in st.session_state.get(FIRST_SEEN_KEY, set())
    every = FIRST_POINT_REFRESH_S if waiting_first else REFRESH_S
    st.fragment(_live, run_every=every if active else None)(store, run_id, seen, waiting_first)
