"""The Playground page: with Auto-run on, each settled change of the config launches a short
run (tagged `core.tags.AUTO_TAG`) and its loss joins a trail of the last few. The most-used
fields (QUICK_FIELDS) sit beside the trail chart, so the toggle and its effect are on
screen together; the rest stay in the sidebar, which leaves these out on this page.

Two fragments: the launcher looks every second whether the sidebar's config has settled
on one not launched yet (stopping the trail's still-active run first, so the new one
takes its slot), and the trail chart redraws every two seconds while a run of it is
active (a launch reruns the page, which starts that timer). Every decision is a pure
function in `views.playground`; this module holds the session state and the widgets.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import streamlit as st

from blockviz.core.config import RunConfig
from blockviz.core.spec import ACTIVE_STATUSES, LOSS_NAMES
from blockviz.core.tags import AUTO_TAG
from blockviz.dashboard import sidebar_widgets, store_access, ui
from blockviz.dashboard.config_fields import QUICK_FIELDS, SPECS
from blockviz.dashboard.sidebar import SidebarState
from blockviz.launch import runner
from blockviz.store import RunStore
from blockviz.views import charts
from blockviz.views import playground as pg

TOGGLE_KEY = "playground.on"
STEPS_KEY = "playground.steps"
TRAIL_LENGTH_KEY = "playground.trail_length"
PENDING_KEY = "playground.pending"  # views.playground.Pending: the config and since when
LAST_KEY = "playground.last"  # JSON of the last config auto-launched (never twice)
TRAIL_KEY = "playground.trail"  # list[views.playground.TrailEntry], oldest first
TICKING_KEY = "playground.ticking"  # whether the chart's timer runs (a trail run is active)
ERROR_KEY = "playground.error"  # the last launch's failure, shown until the next launch
KEPT = "kept."  # the widgets' values under keys Streamlit does not drop off the page
WIDGETS = {TOGGLE_KEY: False, STEPS_KEY: pg.DEFAULT_STEPS, TRAIL_LENGTH_KEY: pg.DEFAULT_TRAIL}
LAUNCH_EVERY_S = 1.0  # how often the launcher looks for a settled change
CHART_EVERY_S = 2.0  # how often the trail chart redraws while one of its runs is active
MAX_POINTS = 400  # per series on the trail chart


def _switched() -> None:
    """on_change of the switch: turning it on launches the current config once more."""
    st.session_state.pop(LAST_KEY, None)
    st.session_state.pop(PENDING_KEY, None)


def render(state: SidebarState, store: RunStore) -> None:
    """The Playground: a header row (the switch and its settings), then the quick fields
    beside the launcher and the trail chart."""
    writable = store_access.writable(store)
    for key, default in WIDGETS.items():
        _restore(key, default)
    with st.container(horizontal=True, vertical_alignment="bottom", gap="medium"):
        st.subheader("Playground", anchor=False, width="content")
        st.toggle(
            "Auto-run",
            key=TOGGLE_KEY,
            on_change=_switched,
            disabled=not writable,
            help="Each change of the config launches a short run of it and draws its loss "
            "here, next to the previous ones. A new change stops a still-running auto-run. "
            + ("" if writable else store_access.READONLY_NOTICE),
        )
        st.number_input(
            "Steps per auto-run",
            min_value=pg.MIN_STEPS,
            max_value=pg.MAX_STEPS,
            step=50,
            key=STEPS_KEY,
            width=170,
        )
        st.number_input(
            "Runs on the chart",
            min_value=1,
            max_value=pg.MAX_TRAIL,
            key=TRAIL_LENGTH_KEY,
            width=170,
        )
    for key in WIDGETS:
        st.session_state[KEPT + key] = st.session_state[key]
    quick, trail = st.columns([1, 3], gap="medium")
    with quick:
        _quick_fields(state)
    with trail:
        _trail_column(state, store, writable)


def _quick_fields(state: SidebarState) -> None:
    """The fields most worth flipping, with the sidebar's widgets' keys (one value); under
    each field whose flip shows no visible gap at the Playground's own preset, what was
    measured there, while the other fields hold that preset (`pg.no_gap_note`)."""
    for name in QUICK_FIELDS:
        sidebar_widgets.widget(SPECS[name], state.error, state.inert)
        note = pg.no_gap_note(name, state.run_config, tuple(QUICK_FIELDS))
        if note is not None:
            st.caption(note)
    st.caption("Every other field is in the sidebar.")


def _trail_column(state: SidebarState, store: RunStore, writable: bool) -> None:
    """The launcher (a fragment looking for a settled change) and the trail chart."""
    on = bool(st.session_state.get(TOGGLE_KEY)) and writable
    candidate: str | None = None
    if on:
        if state.can_launch and state.run_config is not None:
            steps_value = int(st.session_state[STEPS_KEY])
            candidate = pg.auto_config(state.run_config, steps_value).to_json()
        else:
            st.warning(
                f"Auto-run launches nothing until the config is valid: {ui.plain(state.problem)}",
                icon=":material/block:",
            )
    st.fragment(_launcher, run_every=LAUNCH_EVERY_S if on else None)(
        candidate, f"auto-{state.name}", state.preset, store
    )
    ticking = False
    with ui.guard("Auto-runs"):
        ticking = _any_active(_runs(store))
    st.session_state[TICKING_KEY] = ticking
    st.fragment(_trail_view, run_every=CHART_EVERY_S if ticking else None)(store)
    st.caption(
        "Auto-runs are ordinary runs tagged "
        f"{ui.literal(AUTO_TAG)}: the config with the steps above, probes and samples only "
        "at the first and last step, and a few evaluations. Open one on Live or Compare. "
        "They keep no fork points (only last.ckpt and best.ckpt): to fork or replay a "
        "config, launch it from Train."
    )


def _any_active(runs: dict[int, dict[str, Any]]) -> bool:
    return any(_status(runs, e.run_id) in ACTIVE_STATUSES for e in _trail())


def _restore(key: str, default: object) -> None:
    """A widget's value back after another page (Streamlit drops the keys of widgets a page
    did not draw), else its default."""
    if key not in st.session_state:
        st.session_state[key] = st.session_state.get(KEPT + key, default)


def _trail() -> list[pg.TrailEntry]:
    return list(st.session_state.get(TRAIL_KEY, []))


def _runs(store: RunStore) -> dict[int, dict[str, Any]]:
    """Every run's row (id -> status, step, max_steps, ...) in one read; a store error
    propagates (a locked store is not a deleted run)."""
    return _rows(store.runs_frame())


def _rows(frame: pd.DataFrame) -> dict[int, dict[str, Any]]:
    return {int(row["id"]): row for row in frame.to_dict("records")}


def _status(runs: dict[int, dict[str, Any]], run_id: int) -> str:
    run = runs.get(run_id)
    return "deleted" if run is None else str(run["status"])


def _launcher(candidate: str | None, name: str, preset: str, store: RunStore) -> None:
    """Launch the sidebar's config once it has settled and differs from the last one."""
    if candidate is None:
        st.session_state.pop(PENDING_KEY, None)
        return
    now = time.time()
    pending = pg.observe(st.session_state.get(PENDING_KEY), candidate, now)
    st.session_state[PENDING_KEY] = pending
    if not pg.should_launch(pending, now, st.session_state.get(LAST_KEY), pg.DEBOUNCE_S):
        return
    with ui.guard("Auto-run"):
        _replace_and_launch(candidate, name, preset, store)
        st.rerun(scope="app")  # the trail chart and Runs in progress start their timers


def _replace_and_launch(candidate: str, name: str, preset: str, store: RunStore) -> None:
    """Stop the trail's active runs, launch `candidate`, and add it to the trail."""
    trail = _trail()
    runs = _runs(store)
    for entry in trail:
        if _status(runs, entry.run_id) in ACTIVE_STATUSES:
            runner.stop_run(store, entry.run_id)
    # Set once the old runs are stopped (a locked store above retries on the next tick);
    # from here on never twice, even when the launch fails.
    st.session_state[LAST_KEY] = candidate
    run_config = RunConfig.from_json(candidate)
    previous = RunConfig.from_json(trail[-1].config_json) if trail else None
    label = pg.change_label(previous, run_config, preset)
    short = pg.change_label(previous, run_config, preset, short=True)
    st.session_state.pop(ERROR_KEY, None)
    try:
        run_id = runner.launch(
            run_config, name, store, max_running=runner.default_max_running(), tags=(AUTO_TAG,)
        )
    except runner.LaunchError as exc:
        st.session_state[ERROR_KEY] = str(exc)
        if exc.run_id is None:
            return
        run_id = exc.run_id  # a failed run is still a point of the trail: it says so
    except ValueError as exc:  # ConfigError, StoreError: already worded for users
        st.session_state[ERROR_KEY] = str(exc)
        return
    length = int(st.session_state.get(TRAIL_LENGTH_KEY, pg.DEFAULT_TRAIL))
    entry = pg.TrailEntry(run_id, label, short, candidate)
    st.session_state[TRAIL_KEY] = pg.add_to_trail(trail, entry, length)


def _trail_view(store: RunStore) -> None:
    """The trail's loss curves (newest marked) and one line per run with its status."""
    with ui.guard("Playground chart"):
        error = st.session_state.get(ERROR_KEY)
        if error:
            st.error(f"Auto-run failed to launch: {ui.plain(error)}")
        length = int(st.session_state.get(TRAIL_LENGTH_KEY, pg.DEFAULT_TRAIL))
        trail = _trail()[-length:]
        if not trail:
            st.caption("No auto-runs yet: turn Auto-run on, then change a field.")
            return
        store_access.reap_dead(store)
        frame = store.runs_frame()
        runs = _rows(frame)
        if st.session_state.get(TICKING_KEY) and not _any_active(runs):
            st.session_state[TICKING_KEY] = False
            st.rerun(scope="app")  # drop the timer: the trail's runs have all ended
        known = [e for e in trail if e.run_id in runs]
        ids = [e.run_id for e in known]
        if not ids:
            st.caption("The auto-runs of this trail have been deleted.")
            return
        scalars = store.scalars(ids, names=LOSS_NAMES, max_points=MAX_POINTS)
        chart = pg.trail_chart(scalars, known)
        ui.chart_with_downloads(chart, charts.chart_data(chart), "auto-runs loss", "playground")
        lines = pg.trail_lines(trail)
        shown = runner.shown_in(frame)  # queued -> starting, as every page words it
        for entry in reversed(trail):
            _trail_line(runs.get(entry.run_id), lines[entry.run_id], shown)


def _trail_line(run: dict[str, Any] | None, label: str, shown: dict[int, str]) -> None:
    """'#2 norm_position: pre → post (newest) · running · step 120/300' (plain text); the
    status as every page words it (`runner.shown_in`: a queued run with a slot is starting)."""
    if run is None:
        st.markdown(f"{ui.plain(label)} · deleted")
        return
    text = f"{ui.plain(label)} · {shown.get(int(run['id']), run['status'])}"
    step, max_steps = run.get("step"), run.get("max_steps")
    if not pd.isna(step) and not pd.isna(max_steps) and max_steps:
        text += f" · step {int(step):,}/{int(max_steps):,}"
    st.markdown(text)
