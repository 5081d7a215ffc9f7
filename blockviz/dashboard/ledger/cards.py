"""The Ledger page's cards: each claim with every measurement of it, as the offline
export shows them (`views.ledger`), user text always as text."""

from __future__ import annotations

import streamlit as st

from blockviz.core import ledger as ldg
from blockviz.dashboard import ui
from blockviz.dashboard.studies.view import VERDICT_ICONS
from blockviz.views.ledger import page, text

NOT_RUN_ICON = ":violet[:material/radio_button_unchecked:]"


def _icon(word: str) -> str:
    return VERDICT_ICONS.get(word.split(" ", 1)[0], NOT_RUN_ICON)


def _measurement(measurement: ldg.Measurement, key: str) -> None:
    st.markdown(
        f"Size **{ui.plain(measurement.size)}**, grid {ui.plain(measurement.grid())}, "
        "measured in "
        f"{ui.plain(measurement.origin.text())}. Replication: {_icon(measurement.replication)} "
        f"**{ui.plain(measurement.replication)}**: {ui.plain(measurement.replication_reason)}"
    )
    for seed_set in measurement.sets:
        word = text.verdict_word(seed_set)
        lines = [
            f"{_icon(word)} {ui.plain(text.set_label(seed_set))}: **{ui.plain(word)}** — "
            f"{ui.plain(seed_set.reason)}",
            *(ui.plain(line) for line in seed_set.intervals),
            *(ui.plain(line) for line in seed_set.sensitivity),
            f"{seed_set.runs} runs, {ui.plain(seed_set.machine())}; "
            f"{ui.plain(seed_set.date or 'date not recorded')}",
        ]
        st.markdown("  \n".join(lines))
    if measurement.rerun:
        st.caption("Re-run on fresh seeds:")
        st.code(measurement.rerun, language="bash")
    else:
        st.caption("No command re-runs this definition (the built-in study changed since).")
    spec = page.chart_spec(measurement)
    if spec is not None:
        st.vega_lite_chart(spec, key=f"ledger.chart.{key}")


def card(entry: ldg.Entry) -> None:
    """One claim: its sentence, source and study, then each measurement or `not run`."""
    with st.container(border=True):
        st.markdown(f"{_icon(entry.state)} **{ui.plain(entry.claim)}**")
        st.caption(
            f"{ui.plain(entry.source)} · study {ui.literal(entry.study_key)} "
            f"({ui.plain(entry.study_title)}) · claim {ui.literal(entry.id)}"
        )
        if not entry.measurements:
            st.markdown(f"{NOT_RUN_ICON} **Not run.** Run it with:")
            st.code(entry.run_command, language="bash")
        for index, measurement in enumerate(entry.measurements):
            _measurement(measurement, f"{entry.id}.{index}")
