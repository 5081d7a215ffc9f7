"""Compare's report: the zip built in the download's thread, and its progress meanwhile."""

from __future__ import annotations

import streamlit as st

from blockviz.dashboard import ui
from blockviz.store import RunStore
from blockviz.views.export.report import build_report, report_name
from blockviz.views.export.report_job import ReportJob

POLL_S = 0.5
REPORT_JOB_KEY = "compare.report_job"


def _report_job() -> ReportJob:
    """This session's report job (shared with the download's worker thread)."""
    job = st.session_state.get(REPORT_JOB_KEY)
    if not isinstance(job, ReportJob):
        job = ReportJob()
        st.session_state[REPORT_JOB_KEY] = job
    return job


def _report_progress(
    job: ReportJob, run_ids: list[int], file_name: str, was_building: bool
) -> None:
    """Progress of the report being built (polled while it builds), then the built zip.

    Once built, the zip is also offered as an ordinary download of the same bytes, name and
    type. Besides letting a user save it again without a rebuild, that keeps the click's
    own file alive: Streamlit drops a generated download that no element of the session
    refers to after two script runs (this timer's and the redraw's), and identical bytes,
    name and type are one file to it.
    """
    status = job.status()
    if status.building:
        text = f"Building the report… {ui.plain(status.message)}".strip()
        st.progress(status.fraction, text=text)
        return
    if status.error:
        st.error(f"The report could not be built: {ui.plain(status.error)}")
    built = job.result(run_ids)
    if built is not None:
        st.success(f"Report built ({len(built) / 1e6:.1f} MB); your browser saves the zip.")
        st.download_button(
            "Save the report again",
            data=built,
            file_name=file_name,
            mime="application/zip",
            key="compare.report.saved",
            icon=":material/download:",
            on_click="ignore",
        )
    if was_building:
        st.rerun()  # done: redraw once without the timer


def report_section(store: RunStore, run_ids: list[int], names: list[str]) -> None:
    """The report's download button; its progress polls while it builds."""
    st.subheader("Report", anchor=False)
    st.caption(
        "One zip: every chart as PNG and SVG (each run's attention maps at its latest "
        "recorded step included), the configs, the generated samples, all scalars as CSV, "
        "the final metrics as CSV, Markdown and LaTeX, and a self-contained HTML report."
    )
    job = _report_job()
    st.download_button(
        "Download report (zip)",
        data=job.builder(lambda progress: build_report(store, run_ids, progress=progress), run_ids),
        file_name=report_name(names),
        mime="application/zip",
        key="compare.report",
        type="primary",
        icon=":material/folder_zip:",
        on_click=job.request,
    )
    building = job.building()
    st.fragment(_report_progress, run_every=POLL_S if building else None)(
        job, run_ids, report_name(names), building
    )
