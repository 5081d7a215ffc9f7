"""Live's Fork and Replay: a twin of the run from a kept step, or the flight recorder.

Fork starts `python -m blockviz fork` from the kept checkpoint nearest before the marked
step (a finding's Show marks one) or one the user picks, changed in the fields edited here;
Replay starts `python -m blockviz replay` around the run's divergence or largest loss spike.
The start waits until the twin registers, so the page then names it (id and name), links
it (`?run=ID`, as every page links a run) and offers to open it, above Live's header
(`started_notice`); Compare draws a twin's differences.
"""

from __future__ import annotations

import contextlib
from typing import Any

import streamlit as st

from blockviz.core import config as cfg
from blockviz.core import forks
from blockviz.dashboard import ui
from blockviz.dashboard.config_fields import (
    FINAL_NORM_CHOICES,
    SPECS,
    from_widget,
    to_widget,
    widget_range,
)
from blockviz.dashboard.findings_panel import current_mark
from blockviz.launch import forking
from blockviz.launch.runner import LaunchError
from blockviz.store import RunStore, StoreError
from blockviz.store.records import RunRecord
from blockviz.views import run_findings

EVENT_FINDINGS = ("diverged", "loss_spike")
STARTED_KEY = "live.twin_started"  # session_state: {parent, twin, text} of the last start


def _field_input(name: str, value: Any, key: str) -> Any:
    """One forkable field's widget, starting at the run's value; the value it holds."""
    spec = SPECS[name]
    if spec.kind == "select":
        return st.selectbox(spec.label, spec.choices, index=spec.choices.index(value), key=key)
    if spec.kind == "bool":
        return st.toggle(spec.label, value, key=key, help=spec.help)
    if spec.kind == "tristate":
        shown = st.selectbox(
            spec.label,
            FINAL_NORM_CHOICES,
            index=FINAL_NORM_CHOICES.index(to_widget(name, value)),
            key=key,
            help=spec.help,
        )
        return from_widget(name, shown)
    low, high = widget_range(name, spec.kind)
    number = to_widget(name, value)
    if spec.kind == "int":
        return st.number_input(
            spec.label, low, high, number, step=int(spec.step or 1), key=key, help=spec.help
        )
    step = float(spec.step or 0.1)
    return st.number_input(
        spec.label, low, high, number, step=step, format=spec.fmt, key=key, help=spec.help
    )


def _changes(run: RunRecord, prefix: str) -> dict[str, Any]:
    """The forkable fields as edited, those that differ from the run's config."""
    config = cfg.RunConfig.from_dict(run.config or {})
    changes: dict[str, Any] = {}
    for name in forks.OFFERED_FIELDS:  # drawn as the sidebar draws them
        value = getattr(getattr(config, cfg.section_of(name)), name)
        edited = _field_input(name, value, f"{prefix}.{name}")
        if edited != value:
            changes[name] = edited
    return changes


def default_step(steps: list[int], max_steps: int | None) -> int:
    """The newest kept step a fork can train on from (before max_steps), else the newest."""
    before = [step for step in steps if max_steps is None or step < max_steps]
    return (before or steps)[-1]


def fork_caption(store: RunStore, run: RunRecord) -> None:
    """Under Live's header: whose twin this run is, from which step, changed in what."""
    if run.fork_step is None:
        return
    parent = "a deleted run"
    if run.parent_id is not None:
        with contextlib.suppress(StoreError):
            parent = f"#{run.parent_id} {store.get_run(int(run.parent_id)).name}"
    info = run.fork_info or {}
    if run.fork_kind == "replay":
        what = info.get("sentence") or "probing every step; its result comes when it ends."
        st.caption(ui.plain(f"A replay of {parent} from step {run.fork_step:,}: {what}"))
        return
    changes = forks.changes_text(info.get("changes") or {})
    st.caption(
        ui.plain(
            f"A fork of {parent} from step {run.fork_step:,} ({changes}): "
            "its rows before that step are its parent's. Compare draws the difference."
        )
    )


def _event(store: RunStore, run: RunRecord) -> tuple[str, int] | None:
    """The run's divergence or largest loss spike: (its finding's title, step)."""
    found = run_findings.cached_findings(store, run)
    for finding in found.findings:
        if finding.rule in EVENT_FINDINGS and finding.step is not None:
            return finding.title, int(finding.step)
    return None


def fork_panel(store: RunStore, run: RunRecord, writable: bool) -> None:
    """The sidebar's "Fork or replay" expander of the run shown on Live."""
    run_id = int(run.id)
    prefix = f"live.{run_id}.fork"
    with st.expander("Fork or replay", expanded=False):
        steps = forks.kept_steps(store.run_dir(run_id))
        if not steps:
            st.caption(
                "No kept checkpoints to fork from yet: a run keeps one every ckpt_interval "
                "steps (Train page, Cadence)."
            )
        else:
            mark = current_mark(run_id)
            wanted = forks.nearest_kept(steps, int(mark["step"])) if mark else None
            start = wanted if wanted is not None else default_step(steps, run.max_steps)
            step = st.selectbox(
                "From the kept step",
                steps,
                index=steps.index(start),
                format_func=lambda kept: f"{kept:,}",
                key=f"{prefix}.step.{start}",
                help="The kept checkpoint at or before the step marked on the loss chart (a "
                "click, or a finding's Show), else the newest one before max_steps.",
            )
            changes = _changes(run, prefix)
            if st.button("Fork", key=f"{prefix}.go", disabled=not writable):
                changed = forks.changes_text(changes)
                what = f"Fork of #{run_id} {run.name} from step {step:,} ({changed})"
                _start(store, run_id, forking.fork_command(store, run_id, step, changes), what)
        event = _event(store, run)
        if event is not None:
            title, around = event
            st.caption(ui.plain(f"{title}."))
            if st.button(
                f"Replay around step {around:,}", key=f"{prefix}.replay", disabled=not writable
            ):
                what = f"Replay of #{run_id} {run.name} around step {around:,}"
                _start(store, run_id, forking.replay_command(store, run_id, around), what)
        refusal = forking.last_refusal(store, run_id)
        if refusal:
            st.caption(ui.plain(f"The last fork or replay was refused: {refusal}"))
        for replay in store.twins_of(run_id, "replay"):
            sentence = (replay.fork_info or {}).get("sentence")
            if sentence:
                st.markdown(ui.plain(f"Replay {replay.id}: {sentence}"))


def _start(store: RunStore, run_id: int, command: list[str], what: str) -> None:
    """Start a fork or replay of `run_id` and wait for it to register; a refusal shows here,
    a start reruns the page, which then names the twin (`started_notice`)."""
    try:
        with st.spinner("Starting (a refusal shows here; the new run is named once it registers)…"):
            twin = forking.start(store, run_id, command)
    except LaunchError as exc:
        st.error(ui.plain(str(exc)))
        return
    st.session_state[STARTED_KEY] = {"parent": run_id, "twin": twin, "text": what}
    st.rerun()


def started_notice(store: RunStore, run_id: int) -> None:
    """Above Live's header, while it shows the parent: the twin a Fork or Replay just
    started, by id and name, its link and a button that opens it here."""
    started = st.session_state.get(STARTED_KEY)
    if not started or started["parent"] != run_id:
        st.session_state.pop(STARTED_KEY, None)  # another run is shown: the news is old
        return
    twin_id = started["twin"]
    if twin_id is None:  # said once: nothing here learns when it registers
        st.session_state.pop(STARTED_KEY, None)
        later = "it appears in the run picker once its process registers it"
        st.info(ui.plain(f"{started['text']} started; {later}."))
        return
    try:
        twin = store.get_run(int(twin_id))
    except StoreError:  # deleted meanwhile
        st.session_state.pop(STARTED_KEY, None)
        return
    named = f"#{twin_id} {twin.name}"
    st.success(ui.plain(f"{started['text']} started as run {named}."))
    with st.container(horizontal=True, vertical_alignment="center"):
        st.page_link(
            ui.LIVE_PAGE,
            label=ui.plain(named),
            query_params={"run": str(int(twin_id))},
            icon=":material/link:",
            help="A link to the new run on Live (open it in a new tab, or copy it).",
        )
        if st.button("Open in Live", key="live.twin_started.open", icon=":material/monitoring:"):
            st.session_state.pop(STARTED_KEY, None)
            ui.select_run(int(twin_id))
            st.rerun()
