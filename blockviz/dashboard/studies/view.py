"""The Studies page's view of one study: progress, Stop / Resume, results, verdicts, zip.

While the study trains, this is a fragment that refreshes every REFRESH_S seconds, and
the results fill in as runs finish (partial results say how many runs they rest on).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from blockviz.core import spec
from blockviz.core.studies import define
from blockviz.core.studies.summary import summarize
from blockviz.dashboard import ui
from blockviz.dashboard.studies.launch import SELECTED_KEY
from blockviz.launch import study_runner
from blockviz.store import RunStore, StoreError
from blockviz.views import charts, run_findings
from blockviz.views.studies import replication
from blockviz.views.studies import report as study_report
from blockviz.views.studies import table as study_table

VERDICT_ICONS = {  # Streamlit's own icon font: shown even where no emoji font is installed
    "supported": ":green[:material/check_circle:]",
    "contradicted": ":red[:material/cancel:]",
    "inconclusive": ":gray[:material/help:]",
    "pending": ":blue[:material/hourglass_empty:]",
}
REFRESH_S = 5.0  # a page redraw costs CPU the study's runs need on a 2-core box


def studies_table(frame: pd.DataFrame, labels: dict[int, str]) -> pd.DataFrame:
    """The store's studies, newest first, as the page lists them."""
    shown = frame.iloc[::-1]
    return pd.DataFrame(
        {
            "id": shown["id"].astype(int),
            "name": shown["name"],
            "study": shown["key"],
            "size": shown["size"],
            "status": [labels.get(int(i), "") for i in shown["id"]],
            "runs done": [
                f"{f}/{n}" for f, n in zip(shown["finished"], shown["runs"], strict=True)
            ],
        }
    )


def pick_study(store: RunStore) -> int | None:
    """The study to show, picked by name (the newest, or the one just launched)."""
    frame = store.studies_frame()
    if frame.empty:
        st.info("No studies yet: pick one below and press Run study.")
        return None
    ids = [int(i) for i in frame["id"]][::-1]
    chosen = st.session_state.get(SELECTED_KEY)
    index = ids.index(chosen) if chosen in ids else 0
    names = dict(zip(frame["id"].astype(int), frame["name"], strict=True))
    return st.selectbox(
        "Study to show",
        ids,
        index=index,
        format_func=lambda i: f"#{i} {names[i]}",
        key="studies.show",
    )


def studies_list(store: RunStore) -> None:
    """Every study of the store with its status and progress, folded under the launchers."""
    frame = store.studies_frame()
    if frame.empty:
        return
    labels = {
        int(i): study_runner.status_label(store, int(i), str(status))
        for i, status in zip(frame["id"], frame["status"], strict=True)
    }
    with st.expander(f"Every study ({len(frame)})"):
        st.dataframe(studies_table(frame, labels), hide_index=True, width="stretch")


def _actions(store: RunStore, study_id: int, now: study_runner.Progress, writable: bool) -> None:
    left, right = st.columns(2)
    active = now.status == "running" and not now.interrupted
    if left.button(
        "Stop study",
        icon=":material/stop:",
        key=f"studies.stop.{study_id}",
        disabled=not (writable and active),
        width="stretch",
    ):
        try:
            ui.flash("info", f"Study #{study_id}: {study_runner.stop(store, study_id)}.")
        except StoreError as exc:
            ui.flash("error", f"Could not stop study #{study_id}: {exc}")
        st.rerun(scope="app")
    resumable = not active and (now.unfinished > 0 or now.interrupted)
    if right.button(
        "Resume study",
        icon=":material/play_arrow:",
        key=f"studies.resume.{study_id}",
        disabled=not (writable and resumable),
        width="stretch",
    ):
        try:
            queued = study_runner.resume(store, study_id)
            ui.flash("success", f"Study #{study_id}: {queued.summary()}.")
        except (study_runner.StudyError, StoreError) as exc:
            ui.flash("error", f"Could not resume study #{study_id}: {exc}")
        st.rerun(scope="app")


def _progress(now: study_runner.Progress) -> None:
    fraction = (now.finished + now.unfinished) / now.total if now.total else 1.0
    text = (
        f"{now.finished} of {now.total} runs done · {now.running} running · "
        f"{now.queued} queued"
        + (f" · {now.unfinished} stopped or failed" if now.unfinished else "")
    )
    st.progress(min(max(fraction, 0.0), 1.0), text=text)
    if now.interrupted:
        st.warning(
            "No worker is left to train this study's remaining runs (the machine restarted, "
            "or its processes were killed). Resume study trains them."
        )


def _init_gradients(store: RunStore, study_id: int) -> None:
    """The init explorer's figures for a study that measured at initialisation."""
    result = study_report.read_init_grads(store, study_id)
    if result is None:
        st.info("The measurement has not written its result yet.")
        return
    rows, summary = pd.DataFrame(result["rows"]), pd.DataFrame(result["summary"])
    st.caption(
        f"Measured on {ui.plain(result.get('dataset', '?'))}, seeds "
        f"{', '.join(map(str, result.get('seeds', [])))}, in {result.get('seconds', 0):.1f} s."
    )
    ui.chart_with_downloads(
        charts.init_grad_ratio_chart(summary),
        summary,
        f"study {study_id} init ratio",
        f"st{study_id}.ratio",
    )
    ui.chart_with_downloads(
        charts.init_grad_profile_chart(rows),
        charts.init_grad_means(rows),
        f"study {study_id} init by block",
        f"st{study_id}.profile",
    )


def _runs_with_findings(store: RunStore, results: pd.DataFrame) -> pd.DataFrame:
    """One row per run of the study: id, variant, seed, outcome, final val loss, findings."""
    table = results[["run_id", "variant", "seed", "status", "outcome", "val_loss"]].copy()
    table["findings"] = run_findings.findings_column(store, table["run_id"].tolist())
    return table.rename(columns={"run_id": "run", "val_loss": "val loss"})


def _claim(claim: replication.ClaimReplication) -> None:
    """One claim: its verdict here and why, its intervals, each seed set's verdict, and the
    seeds its interval needs with the command that runs them."""
    verdict = claim.verdict
    icon = VERDICT_ICONS.get(verdict.verdict, VERDICT_ICONS["inconclusive"])
    lines = [*study_table.interval_lines(verdict), *replication.replication_lines(claim)]
    needed = replication.needed_lines(claim)
    if claim.rerun:  # the command goes in a code block below, where it copies as it is
        needed = [needed[0], "Run them on fresh seeds (a disjoint set, judged on its own):"]
    st.markdown(
        f"{icon} **{ui.plain(verdict.verdict.capitalize())}** — "
        f"{ui.plain(verdict.claim.text)}  \n"
        f"*{ui.plain(verdict.claim.source)}*  \n{ui.plain(verdict.reason)}"
        + "".join(f"  \n{ui.plain(line)}" for line in [*lines, *needed])
    )
    if claim.rerun:
        st.code(claim.rerun, language="bash", wrap_lines=True)


def _results(store: RunStore, study_id: int, plan: define.StudyDef) -> None:
    if not plan.trains:
        _init_gradients(store, study_id)
        return
    runs = store.study_runs(study_id)
    sets = replication.seed_sets(store, study_id)
    results = sets.results
    finished = int((results["outcome"] != "").sum()) if not results.empty else 0
    if finished < len(results):
        st.caption(f"Partial results: {finished} of {len(results)} runs finished so far.")
    summary = summarize(results)
    note = study_table.scoring_note(results)
    if note:
        st.warning(ui.plain(note), icon=":material/rule:")
    if plan.claims:
        st.subheader("Claims and what this machine measured", anchor=False)
        st.caption(ui.plain(replication.sets_line(sets)))
        for claim in replication.claims(store, sets):
            _claim(claim)
        st.caption(
            "A verdict is computed from the runs by the rule docs/studies.md "
            "documents (95% intervals over seeds, paired by seed where two or more seeds "
            "pair up, with the unpaired interval beside it; diverged, blown-up and stalled "
            "runs counted, a seed where one side failed and the other trained held against "
            "it; pending until every run a claim rests on has ended); nothing here is "
            "written by hand. Each seed set is judged on its own runs, never pooled with "
            "another's."
        )
    _charts(store, study_id, plan, runs, results)
    st.subheader("Results", anchor=False)
    st.dataframe(
        study_table.results_table(summary, plan.baseline), hide_index=True, width="stretch"
    )
    with st.expander(f"Runs ({len(results)}) and their findings"), ui.guard("Runs"):
        st.dataframe(_runs_with_findings(store, results), hide_index=True, width="stretch")
        st.caption(
            "Each run's findings (headline, then its warnings) by the rules of the findings "
            "table (docs/findings.md); open a run on Live for the numbers behind them."
        )
    sensitivity = study_table.sensitivity_display(results, plan.swept)
    if sensitivity is not None:
        st.subheader("Learning-rate sensitivity", anchor=False)
        st.dataframe(sensitivity, hide_index=True)
        st.caption(study_table.SENSITIVITY_NOTE)
    st.download_button(
        "Download study (zip)",
        data=lambda: study_report.build_study_zip(store, study_id),
        file_name=study_report.zip_name(store.get_study(study_id)),
        mime="application/zip",
        icon=":material/folder_zip:",
        key=f"studies.zip.{study_id}",
        on_click="ignore",
    )


def _charts(
    store: RunStore,
    study_id: int,
    plan: define.StudyDef,
    runs: pd.DataFrame,
    results: pd.DataFrame,
) -> None:
    """The study's charts (loss curves with seed bands, final loss against the swept value)."""
    built = []
    with ui.guard("Charts"):
        scalars = store.scalars([int(i) for i in runs["id"]], names=spec.VAL_LOSS)
        built = study_report.result_charts(scalars, results, plan)
    for stem, chart in built:
        with ui.guard(stem):
            ui.chart_with_downloads(
                chart, charts.chart_data(chart), f"study {study_id} {stem}", f"st{study_id}.{stem}"
            )


def study_panel(store: RunStore, study_id: int, writable: bool) -> None:
    """One study: header, progress, actions and results; refreshes itself while it runs."""
    study = store.get_study(study_id)
    plan = define.plan_from_spec(study.spec)
    now = study_runner.progress(store, study_id)
    st.subheader(f"#{study_id} {ui.plain(study.name)} — {now.label}", anchor=False)
    st.markdown(f"**Question.** {ui.plain(plan.question)}")
    _progress(now)
    _actions(store, study_id, now, writable)
    with ui.guard("Study results"):
        _results(store, study_id, plan)


def live_panel(store: RunStore, study_id: int, writable: bool) -> None:
    """`study_panel`, as a fragment on a timer while the study has runs to train."""
    now = study_runner.progress(store, study_id)
    moving = now.status == "running" and not now.interrupted
    st.fragment(_panel_body, run_every=REFRESH_S if moving else None)(
        store, study_id, writable, moving
    )


def _panel_body(store: RunStore, study_id: int, writable: bool, was_moving: bool) -> None:
    now = study_runner.progress(store, study_id)
    if was_moving and not (now.status == "running" and not now.interrupted):
        st.rerun(scope="app")  # it ended: redraw once without the timer
    study_panel(store, study_id, writable)
