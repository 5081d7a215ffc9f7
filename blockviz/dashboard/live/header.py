"""Live's header: the run's name, status, step and pace on one line, its fixed facts for the
sidebar, what its status means, and the findings panel under it."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from blockviz.core import replicas, spec
from blockviz.core.findings.base import Finding
from blockviz.core.spec import (
    ACTIVATION_STATS,
    ACTIVE_STATUSES,
    HEAD_STATS,
    WEIGHTS_COMPONENT,
)
from blockviz.dashboard import store_access, ui
from blockviz.dashboard.findings_panel import findings_panel
from blockviz.dashboard.live.state import TAB_KEY, has_loss
from blockviz.launch import runner
from blockviz.store import RunRecord, RunStore
from blockviz.views import run_facts, run_findings

STATUS_COLORS = {  # the badge of each state of spec.RUN_STATES
    spec.STARTING: "blue",
    "queued": "gray",
    "running": "blue",
    "completed": "green",
    "diverged": "orange",
    "failed": "red",
    "stopped": "violet",
}


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


def header(store: RunStore, run: RunRecord, scalars: pd.DataFrame, shown: str) -> None:
    """One row: name, status badge (`shown`: the status as the picker words it), the numbers
    a glance needs, Stop; then the progress bar while the run trains. The run's fixed facts
    and actions sit in the sidebar."""
    run_id, status = int(run.id), str(run.status)
    step, max_steps = newest_step(run, scalars), run.max_steps
    writable = store_access.writable(store)
    tokens_per_sec = run_facts.recent_tokens_per_sec(scalars, window=spec.RECENT_LOGS)
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
            help=_stop_help(store, run) if writable else store_access.READONLY_NOTICE,
            disabled=not writable,
        ):
            st.toast(ui.plain(f"Run #{run_id}: {runner.stop(store, run_id)}"))
    if status in ACTIVE_STATUSES and step is not None and max_steps:
        st.progress(min(max(step / int(max_steps), 0.0), 1.0))


def _stop_help(store: RunStore, run: RunRecord) -> str:
    batch = replicas.read_batch_file(store.run_dir(int(run.id)))
    if batch is None:
        return "Checkpoint and stop"
    runs = ", ".join(f"#{i}" for i in batch["runs"])
    return f"Checkpoint and stop its whole batch of replicas (runs {runs}: one process)"


def batch_text(store: RunStore, run: RunRecord) -> str | None:
    """For a run that trains as a replica: which batch, and that Stop and Resume act on all
    of it (one process); None for a run trained alone."""
    batch = replicas.read_batch_file(store.run_dir(int(run.id)))
    if batch is None:
        return None
    runs = ", ".join(f"#{i}" for i in batch["runs"])
    index = int(batch.get("index", 0))
    return (
        f"replica {index + 1} of {len(batch['runs'])} (runs {runs}), one process: "
        "Stop and Resume act on the whole batch"
    )


def facts_sidebar(run: RunRecord, store: RunStore | None = None) -> None:
    """The run's fixed facts, in the sidebar under its actions."""
    rows = {
        "Parameters": _format_params(run.n_params),
        "Device": run.device or "—",
        "Precision": run.precision or "—",
    }
    batch = batch_text(store, run) if store is not None else None
    if batch is not None:
        rows["Batch"] = batch
    st.caption("  \n".join(f"{label}: **{ui.plain(value)}**" for label, value in rows.items()))


def status_message(store: RunStore, run: RunRecord, scalars: pd.DataFrame, shown: str) -> None:
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
    elif status == "queued":  # starting or queued, as the badge says
        st.info(f"{shown.capitalize()}: {spec.RUN_STATES[shown]}.")
    elif status == "running" and scalars.empty:
        st.info("Starting up: the charts fill in from the first logged step.")


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


def findings_block(run: RunRecord, store: RunStore, scalars: pd.DataFrame) -> None:
    """The findings panel: the same findings as `show` and Compare (whole series, not the
    charts' downsampled ones), read again at most every 5 s while the run trains."""
    found = run_findings.cached_findings(store, run, logged=has_loss(scalars))
    active = run.status in ACTIVE_STATUSES
    findings_panel(run, found, _show_finding, as_of=found.step if active else None)
