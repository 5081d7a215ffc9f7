"""The findings panel at the top of Live: what the charts show, in words, with links.

The headline says what the run is doing (diverged, stalled, trains); below it each finding
(newest first) gives its title, its sentences with the numbers, **Show** (opens the tab
that draws it and marks its step on the charts) and, where the rule suggests a change,
**Try** (the run's config with that change in the sidebar, on Train, ready to launch); the
suggestion names its source, a paper or "a rule of thumb", and what runs here showed of it
("untested here" when none did).
The words come from `core.findings`; the page decides what Show selects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from blockviz.core.findings.base import Finding
from blockviz.core.spec import ACTIVE_STATUSES
from blockviz.dashboard import relaunch, ui
from blockviz.store import RunRecord
from blockviz.views.run_findings import ACTIVE_EVERY_S, RunFindings, suggestion_text, unsure

MARK_KEY = "live.mark"  # {"run": id, "step": step, "label": text}: the marked step
PICK_KEY = "live.picked"  # (run, step) of the last click on the loss chart, once taken
SCROLL_KEY = "live.scroll_to_charts"  # Show's count: each new one scrolls to the charts once
ICONS = {
    "error": ":material/error:",
    "warning": ":material/warning:",
    "info": ":material/info:",
    "ok": ":material/check_circle:",
}
BOXES = {"error": st.error, "warning": st.warning, "info": st.info, "ok": st.success}


def current_mark(run_id: int) -> dict[str, Any] | None:
    """The step marked for this run (by a Show click), or None."""
    mark = st.session_state.get(MARK_KEY)
    return mark if isinstance(mark, dict) and mark.get("run") == run_id else None


def _mark(run_id: int, finding: Finding, show: Callable[[Finding], None]) -> None:
    if finding.step is not None:
        label = f"{finding.title} (step {finding.step:,})"
        st.session_state[MARK_KEY] = {"run": run_id, "step": finding.step, "label": label}
    st.session_state[SCROLL_KEY] = int(st.session_state.get(SCROLL_KEY, 0)) + 1
    show(finding)


def pick_step(run_id: int, step: int | None) -> None:
    """Mark the step a click on the loss chart picked (Fork starts from the kept step at or
    before it); a pick already taken is not taken again, so a later Show keeps its mark."""
    if step is None or st.session_state.get(PICK_KEY) == (run_id, step):
        return
    st.session_state[PICK_KEY] = (run_id, step)
    st.session_state[MARK_KEY] = {"run": run_id, "step": step, "label": f"step {step:,}"}
    st.rerun(scope="app")  # the sidebar's Fork follows the new mark


def scroll_token() -> int | None:
    """How many Shows were clicked this session (None: none). The page sends its scroll with
    this number on every run and the browser scrolls once per number: a run that a refresh
    cut short before the browser drew it no longer loses the click's scroll."""
    token = st.session_state.get(SCROLL_KEY)
    return int(token) if token else None


def _clear_mark() -> None:
    st.session_state.pop(MARK_KEY, None)


def _value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value).lower()


def _buttons(run: RunRecord, finding: Finding, index: int, show: Callable[[Finding], None]) -> None:
    run_id = int(run.id)
    where = f"the {finding.tab} tab" + (
        f", step {finding.step:,} marked" if finding.step is not None else ""
    )
    with st.container(horizontal=True, gap="small"):
        st.button(
            "Show",
            key=f"live.finding.show.{index}",
            icon=":material/visibility:",
            help=f"Open {where}",
            on_click=_mark,
            args=(run_id, finding, show),
        )
        tip = finding.suggestion
        if tip is not None and tip.changes:
            changes = ", ".join(f"{name} = {_value(value)}" for name, value in tip.changes.items())
            relaunch.try_button(
                run,
                tip.changes,
                key=f"live.finding.try.{index}",
                label=f"Try {changes}",
                help_text=f"{suggestion_text(tip)}; something to try, not measured here. Loads "
                "this run's config with that change into the sidebar and opens Train.",
            )


def findings_panel(
    run: RunRecord,
    found: RunFindings,
    show: Callable[[Finding], None],
    as_of: int | None = None,
) -> None:
    """The headline in a coloured box, then every finding with Show and Try. `as_of`, for
    a run still training, is the step the findings read up to: the headline says it, since
    they are read less often than the charts."""
    head = found.headline
    text = f"**{ui.plain(head.title)}.** {ui.plain(head.text)}"
    if as_of is not None:
        text += f" *(Findings as of step {as_of:,}, read every {ACTIVE_EVERY_S:g} s.)*"
    # The headline and its buttons on one row: the charts below start higher.
    box, buttons = st.columns([5, 1], vertical_alignment="center", gap="small")
    with box:
        BOXES.get(head.severity, st.info)(text, icon=ICONS.get(head.severity))
    with buttons:
        _buttons(run, head, 0, show)
    rest = [f for f in found.findings if f is not head]  # a diverged or stalled headline
    if not rest:
        return
    serious = sum(f.severity in ("error", "warning") for f in rest)
    # Open too when checks could not be made: a finished run is not called healthy out of
    # sight. While it trains, a young run cannot make them yet; the label says so, and the
    # charts keep their place on the screen.
    unmade = any(unsure(f) for f in rest)
    icon = ICONS["warning" if serious else "info" if unmade else "ok"]
    label = f"Findings ({len(rest)}, newest first)"
    training = str(run.status) in ACTIVE_STATUSES
    if unmade and training:
        label += ": some checks cannot be made yet"
    with st.expander(label, expanded=serious > 0 or (unmade and not training), icon=icon):
        for index, finding in enumerate(rest, start=1):
            icon = ICONS.get(finding.severity, "")
            st.markdown(f"{icon} **{ui.plain(finding.title)}**")
            text = ui.plain(finding.text)
            if finding.suggestion is not None:
                text += f" *Try:* {ui.plain(suggestion_text(finding.suggestion))}"
            st.caption(text)
            _buttons(run, finding, index, show)
    if current_mark(int(run.id)) is not None:
        st.button("Clear the marked step", key="live.finding.clear", on_click=_clear_mark)
