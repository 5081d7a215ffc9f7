"""The Studies page's launchers: a built-in study in one click, or a custom sweep form.

Each shows what it will run (variants × seeds, the size, an estimate of the time on this
machine from its finished runs, with what it assumes) before the button; a bad field or
value in the sweep form is one line naming it. Launching stores the study and starts its workers
(`study_runner.launch`): the study goes on with the tab closed.
"""

from __future__ import annotations

import math
from typing import Any

import streamlit as st

from blockviz import CLI
from blockviz.core import config as cfg
from blockviz.core.fields import ConfigError
from blockviz.core.studies import builtins, define, sweeps
from blockviz.dashboard import ui
from blockviz.launch import study_estimate, study_runner
from blockviz.store import RunStore, StoreError

SELECTED_KEY = "studies.selected"  # session_state: the study id the page shows
SWEEP_FIELDS = (
    "lr",
    "norm_position",
    "n_layer",
    "d_model",
    "ffn_mult",
    "activation",
    "norm_type",
    "residual",
    "warmup_steps",
    "batch_size",
    "init",
    "dropout",
)
SWEEP_SEEDS = 2  # the sweep form's seeds on a CPU (`define.GPU_SEEDS` on a GPU)
# The built-in studies the launcher leaves out (they train nothing), and where each lives.
ELSEWHERE = {
    "init-gradients": "it trains nothing (it measures gradients at initialisation). The "
    "**Gradients at init** page draws its two figures for the sidebar's model, at the depths "
    f"and inits you pick there; `{CLI} study run init-gradients` runs it as a "
    "study, which then shows below",
}


def duration(seconds: float) -> str:
    """`about 4 min`, `about 40 s`, or `unknown`."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 5400:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"


def _estimate(store: RunStore, study: define.StudyDef) -> str:
    """`about 4 min (from the pace this store's last 6 completed run(s) measured ...)`."""
    workers = study_runner.default_workers()
    pace = study_estimate.measured_pace(store)
    seconds = study_estimate.estimate_s(study, pace, workers)
    if not study.trains:
        return duration(seconds)
    return f"{duration(seconds)} ({study_estimate.estimate_assumes(study, workers, pace=pace)})"


def _seeds_note() -> str:
    """On a GPU, why the seeds default to more (a sentence to append); nothing on a CPU."""
    note = define.seeds_note()
    return f" {ui.plain(note[0].upper() + note[1:])}." if note else ""


def seeds_input(where: Any, count: int, key: str) -> str:
    """The seeds field: a count, a range or a list as text, read by `define.parse_seeds`
    (through `builtins.builtin` or `sweeps.sweep`), which names what is wrong with it."""
    return where.text_input(
        "Seeds",
        value=str(count),
        key=key,
        max_chars=80,
        help=f"{define.SEEDS_HELP[0].upper()}{define.SEEDS_HELP[1:]}, at most "
        f"{define.MAX_SEEDS}. A second study on seeds disjoint from a first one's replicates "
        "its verdicts.",
    )


def _launch(store: RunStore, study: define.StudyDef, name: str | None = None) -> None:
    try:
        study_id = study_runner.launch(store, study, name)
    except (study_runner.StudyError, ConfigError, StoreError, OSError) as exc:
        st.error(f"The study could not start: {ui.plain(exc)}")
        return
    st.session_state[SELECTED_KEY] = study_id
    ui.flash("success", f"Started study #{study_id}: {study.n_runs} runs.")
    st.rerun()


def builtin_launcher(store: RunStore, writable: bool) -> None:
    """Pick a built-in study and a size; see its question, claims and cost; launch."""
    keys = [k for k in builtins.STUDY_KEYS if builtins.BUILTINS[k]().trains]
    titles = {key: title for key, title, _ in builtins.describe(keys)}
    left, right = st.columns([2, 1])
    key = left.selectbox(
        "Study", keys, format_func=lambda k: f"{k} — {titles[k]}", key="studies.key"
    )
    for missing in (k for k in builtins.STUDY_KEYS if k not in keys):
        where = ELSEWHERE.get(missing, f"run it with `{CLI} study run {missing}`")
        left.caption(f"`{missing}` is not in this list: {where}.")
    size = right.radio("Size", define.SIZES, horizontal=True, key="studies.size")
    seeds = seeds_input(right, define.default_seeds(size), f"studies.seeds.{size}")
    try:
        study = builtins.builtin(key, size, seeds)
    except ConfigError as exc:
        st.error(ui.plain(exc))
        return
    left.markdown(f"**Question.** {ui.plain(study.question)}")
    for claim in study.claims:
        left.markdown(f"- *Claim:* {ui.plain(claim.text)} — {ui.plain(claim.source)}")
    left.caption(
        f"{len(study.variants)} variants × {len(study.seeds)} seeds "
        f"({define.seeds_text(study.seeds)}) = {study.n_runs} runs; "
        f"{ui.plain(define.SIZE_DESCRIPTIONS[size])}. Estimated time here: "
        f"{_estimate(store, study)}." + _seeds_note()
    )
    if right.button(
        "Run study",
        type="primary",
        icon=":material/play_arrow:",
        key="studies.launch",
        disabled=not writable,
        width="stretch",
    ):
        _launch(store, study)


def _grid_from_form(rows: list[tuple[str, str]]) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for name, text in rows:
        if not text.strip():
            continue
        if name in grid:
            raise ConfigError(name, text, "is swept twice; give all its values in one box")
        grid[name] = sweeps.parse_values(name, text)
    return grid


def sweep_launcher(store: RunStore, writable: bool) -> None:
    """A form: up to two fields with their values (a,b,c or low:high:n), seeds and size."""
    with st.form("studies.sweep", border=True):
        st.caption(
            "Values as `a,b,c` or a log range `low:high:n` (e.g. `1e-4:1e-1:7`). The sweep "
            "starts from the chosen size's model; leave the second field's values empty to "
            "sweep one field." + _seeds_note()
        )
        rows = []
        for i, default in enumerate(("lr", "norm_position")):
            left, right = st.columns([1, 2])
            name = left.selectbox(
                f"Field {i + 1}",
                SWEEP_FIELDS,
                index=SWEEP_FIELDS.index(default),
                key=f"studies.sweep.field{i}",
            )
            text = right.text_input(
                f"Values {i + 1}",
                key=f"studies.sweep.values{i}",
                max_chars=200,
                placeholder="1e-4:1e-1:7" if name == "lr" else "a,b,c",
            )
            rows.append((name, text))
        left, middle, right = st.columns(3)
        size = left.radio("Size", define.SIZES, horizontal=True, key="studies.sweep.size")
        seeds = seeds_input(
            middle, define.GPU_SEEDS if define.on_gpu() else SWEEP_SEEDS, "studies.sweep.seeds"
        )
        steps = right.number_input(
            "Steps per run (0: the size's)",
            min_value=0,
            max_value=1_000_000,
            value=0,
            key="studies.sweep.steps",
        )
        submitted = st.form_submit_button(
            "Run sweep", type="primary", icon=":material/play_arrow:", disabled=not writable
        )
    if not submitted:
        return
    try:
        grid = _grid_from_form(rows)
        if not grid:
            raise ConfigError("values", "", "give at least one field's values")
        study = sweeps.sweep(
            grid, seeds=seeds, base=cfg.RunConfig(), size=size, max_steps=int(steps) or None
        )
    except ConfigError as exc:
        st.error(ui.plain(exc))
        return
    _launch(store, study)
