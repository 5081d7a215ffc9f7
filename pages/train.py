"""Train (home): the block as wired now, its parameters, Launch, and the runs in progress."""

import streamlit as st

import blockviz.dashboard.code_download as code_download
from blockviz.core import params
from blockviz.dashboard import sidebar, store_access, ui
from blockviz.launch import runner
from blockviz.store import RunStore
from blockviz.views import charts, diagram
from blockviz.views.breakdown import block_shares, breakdown_frames, share_sentence

state = sidebar.state()
store = store_access.get_store()

st.title("Train")
st.caption(
    "Set up a block in the sidebar, press Launch, and watch it on the Live page. Runs keep "
    "training when you close the tab."
)
ui.show_flashes()
store_access.store_notice(store)

model_cfg = state.model_for_params


def _launch() -> None:
    """Run name, Launch and its outcome: first on the page, so it is above the fold."""
    slots = runner.default_max_running()
    if store is None:
        st.error(
            f"Cannot open the run store at {ui.literal(store_access.store_where())}; set "
            "`BLOCKVIZ_STORE` to a writable file path or a postgresql:// URL and restart the "
            "app."
        )
        return
    name_col, button_col = st.columns([3, 1], vertical_alignment="center")
    name_col.markdown(f"Run name: {ui.literal(state.name)}")
    clicked = button_col.button(
        "Launch",
        type="primary",
        disabled=not (state.can_launch and store_access.writable(store)),
        key="launch",
        icon=":material/rocket_launch:",
        help=None if store_access.writable(store) else store_access.READONLY_NOTICE,
        width="stretch",
    )
    if state.problem is not None and not (model_cfg is None and state.error is not None):
        st.error(ui.plain(state.problem), icon=":material/block:")  # else show_invalid says it
    st.caption(
        f"Up to {slots} run(s) train at once (set BLOCKVIZ_MAX_RUNNING to change it); "
        "more wait as queued and start when a slot frees."
    )
    if clicked and state.run_config is not None and store_access.writable(store):
        try:
            launched = runner.launch(state.run_config, state.name, store, max_running=slots)
        except runner.LaunchError as exc:
            st.session_state["train.launch"] = ("error", str(exc), exc.log_tail)
        except ValueError as exc:  # ConfigError, StoreError: already worded for users
            st.session_state["train.launch"] = ("error", str(exc), "")
        else:
            ui.select_run(launched)
            st.session_state["train.launch"] = ("ok", launched, "")
    outcome = st.session_state.get("train.launch")
    if outcome is not None and outcome[0] == "ok":
        run_id = outcome[1]
        log_path = store.run_dir(run_id) / "train.log"
        st.success(f"Launched run #{run_id}. Its log is {ui.literal(log_path)}.")
        if st.button("Open in Live", key="train.open_live", icon=":material/monitoring:"):
            ui.open_in_live(run_id)
    elif outcome is not None:
        st.error(f"Launch failed: {ui.plain(outcome[1])}")
        if outcome[2]:
            st.code(outcome[2], language=None)


def _wiring() -> None:
    st.subheader("One block, as wired now")
    with ui.guard("Block diagram"):
        st.graphviz_chart(diagram.block_dot(model_cfg))
        st.caption("Grey labels name the taps the probes record; dashed edges are the skip paths.")
    with st.expander("The whole model"), ui.guard("Model diagram"):
        # Top to bottom at its own size: a left-to-right strip shrank to unreadable text.
        st.graphviz_chart(diagram.model_dot(model_cfg, rankdir="TB"), width="content")


def _parameters() -> None:
    st.subheader("Parameters")
    with ui.guard("Parameter breakdown"):
        breakdown = params.param_breakdown(model_cfg)
        by_component, _, _ = breakdown_frames(breakdown, model_cfg.n_layer)
        block = block_shares(breakdown)
        # The total alone on its row: three metrics side by side cut it ("2,216,…").
        st.metric("Total", f"{breakdown.total:,}")
        ffn_col, attn_col = st.columns(2)
        ffn_col.metric(
            "FFN / block",
            f"{block['ffn']:.1%}",
            help="share of each block's parameters in its FFN",
        )
        attn_col.metric(
            "Attn / block",
            f"{block['attn']:.1%}",
            help="share of each block's parameters in its attention",
        )
        st.caption(share_sentence(model_cfg, breakdown))
        ui.chart_with_downloads(
            charts.param_breakdown_chart(by_component),
            by_component,
            f"parameters-{state.name}",
            key="train.params",
        )


st.subheader("Launch")
_launch()
st.caption(
    "To watch each change as you make it, turn on Auto-run on the Playground page: the "
    "most-used toggles sit beside the loss curves they make."
)
if model_cfg is None:
    sidebar.show_invalid(state, "to see the block and its parameters")
else:
    wiring, summary = st.columns([5, 4], gap="large")
    with wiring:
        _wiring()
    with summary:
        _parameters()


def _progress(run_store: RunStore) -> None:
    """Queued and running runs with progress bars, ETA and Stop."""
    with ui.guard("Runs in progress"):
        _progress_rows(run_store)


def _progress_rows(run_store: RunStore) -> None:
    store_access.reap_dead(run_store)
    active = runner.active(run_store)
    if not active:
        st.caption("No runs in progress.")
        if st.session_state.get("train.was_active"):
            st.session_state["train.was_active"] = False
            st.rerun(scope="app")  # drop the timer: nothing left to refresh
        return
    st.session_state["train.was_active"] = True
    for run in active:
        text = f"#{run.id} {ui.plain(run.name)} · {run.label}"
        if run.status == "running":
            text += f" · step {run.step:,}/{run.max_steps:,} · ETA {ui.format_duration(run.eta_s)}"
        bar, stop = st.columns([6, 1], vertical_alignment="bottom")
        bar.progress(run.fraction, text=text)
        if stop.button(
            "Stop",
            key=f"train.stop.{run.id}",
            icon=":material/stop:",
            disabled=not store_access.writable(run_store),
            help=None if store_access.writable(run_store) else store_access.READONLY_NOTICE,
        ):
            with ui.guard(f"Stopping run #{run.id}"):
                st.toast(ui.plain(f"Run #{run.id}: {runner.stop(run_store, run.id)}"))


code_download.code_download_button(state.run_config, state.name, key="train.code")
st.subheader("Runs in progress")
if store is not None:
    with ui.guard("Runs in progress"):
        store_access.reap_dead(store)
        any_active = bool(runner.active(store))
        st.session_state["train.was_active"] = any_active
        st.fragment(_progress, run_every=2 if any_active else None)(store)
