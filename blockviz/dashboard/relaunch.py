"""Edit & relaunch and Resume: a run's config back into the sidebar, or the run continued.

Edit & relaunch copies a stored run's config into the sidebar's widgets and opens Train,
where the user changes a field and presses Launch. The sidebar is drawn before the page
body, so its widget values can only be set in a button callback (before the script
reruns); the page then switches to Train. Resume hands the run to `runner.resume`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import streamlit as st

from blockviz.core import config, corpora
from blockviz.core.config import RunConfig
from blockviz.core.fields import ConfigError
from blockviz.core.presets import PRESETS
from blockviz.core.vocab import DataError
from blockviz.dashboard import sidebar, store_access, ui
from blockviz.dashboard.config_fields import ALL_FIELDS, DATASET_CHOICES, UPLOAD_CHOICE
from blockviz.dashboard.uploads import UPLOAD_INFO_KEY, accept_upload
from blockviz.launch import runner
from blockviz.store import RunRecord, RunStore

TRAIN_PAGE = "pages/train.py"
_GO_KEY = "relaunch.go"  # the callback's messages: the page then switches to Train
DATASET_KEY = sidebar.PREFIX + "dataset"
# A resumed run reads 'stopped' until its process takes it over (seconds: Python and
# torch start first); the page keeps refreshing this long after a Resume meanwhile.
RESUME_WATCH_S = 30.0
_RESUMED_KEY = "relaunch.resumed_at"
# Fields whose widget takes any number in its range: an invalid value can be shown there.
_NUMBER_FIELDS = frozenset(f.name for f in ALL_FIELDS if f.kind in ("int", "float"))


def closest_preset(run_config: RunConfig) -> str:
    """The preset that differs from `run_config` in the fewest fields (ties: listed first).

    The sidebar names runs by what differs from the preset and fills fields it has no
    widget for from it, so the nearest one keeps both honest.
    """
    return min(PRESETS, key=lambda name: len(config.diff(config.preset(name), run_config)))


def load_run_config(run: RunRecord, changes: dict[str, Any] | None = None) -> tuple[str, list[str]]:
    """Put the run's config, with `changes` (field: value) on top, into the sidebar's
    widgets; ('error' | 'ok', messages).

    A config that no longer parses, or holds a choice no widget offers, is refused with
    its field message; one whose numbers no longer validate (a bound or a relation
    between fields) is loaded, and the sidebar shows the field to fix. A dataset file
    that still exists becomes the upload; a missing one keeps the current dataset.
    """
    refused = f"Run #{run.id}'s config cannot be loaded"
    try:
        run_config = RunConfig.from_dict(run.config or {})
        if changes:
            run_config = config.replace(run_config, **changes)
    except ConfigError as exc:
        return "error", [f"{refused}: {exc}"]
    try:
        run_config.validate()
    except ConfigError as exc:
        if exc.field not in _NUMBER_FIELDS:
            return "error", [f"{refused}: {exc}"]
    previous_dataset = st.session_state.get(DATASET_KEY)
    st.session_state[sidebar.PRESET_KEY] = closest_preset(run_config)
    sidebar.apply_run_config(run_config)
    st.session_state.pop(sidebar.NAME_KEY, None)  # the name follows the suggestion again
    messages = [f"Loaded run #{run.id} {run.name}'s config; change a field and Launch."]
    if changes:
        changed = ", ".join(f"{name} {value!r}" for name, value in changes.items())
        messages = [
            f"Loaded run #{run.id} {run.name}'s config with {changed}; press Launch to try it."
        ]
    dataset = run_config.data.dataset
    if dataset not in DATASET_CHOICES:
        note = _dataset_file(dataset, previous_dataset)
        if note:
            messages.append(note)
    return "ok", messages


def _dataset_file(dataset: str, previous: str | None) -> str | None:
    """Take the run's dataset file as the upload; a word when it cannot be."""
    path = Path(dataset)
    try:
        if path.stat().st_size > corpora.MAX_TEXT_BYTES:
            raise DataError(
                f"{path.name} is larger than the {corpora.MAX_TEXT_BYTES // 2**20} MiB upload "
                "limit; train on it with the CLI (`--dataset`)"
            )
        data = path.read_bytes()
        info = accept_upload(data, path.name)
    except OSError:
        st.session_state[DATASET_KEY] = previous or config.RunConfig().data.dataset
        kept = st.session_state[DATASET_KEY]
        return (
            f"The run's dataset file {dataset} is gone; the dataset stays {kept}. "
            "Upload the text again to train on it."
        )
    except DataError as exc:
        st.session_state[DATASET_KEY] = previous or config.RunConfig().data.dataset
        return f"The run's dataset file cannot be used any more: {exc}"
    st.session_state[UPLOAD_INFO_KEY] = info
    st.session_state[DATASET_KEY] = UPLOAD_CHOICE
    return None


def _on_relaunch(run: RunRecord, changes: dict[str, Any] | None = None) -> None:
    outcome, messages = load_run_config(run, changes)
    if outcome == "error":
        for message in messages:
            ui.flash("error", message)  # shown here: the page stays
    else:
        st.session_state[_GO_KEY] = messages  # for Train, which the page switches to


def relaunch_button(run: RunRecord, key: str, container: Any = st) -> None:
    """'Edit & relaunch': the run's config into the sidebar, then the Train page."""
    container.button(
        "Edit & relaunch",
        key=key,
        icon=":material/tune:",
        help="Load this run's config into the sidebar, then open Train to change and launch",
        on_click=_on_relaunch,
        args=(run,),
    )
    go_to_train()


def try_button(
    run: RunRecord, changes: dict[str, Any], key: str, label: str, help_text: str
) -> None:
    """A button that loads the run's config with `changes` into the sidebar, then Train.

    It may sit in a fragment (Live's panel): a refused config's message is a flash, which
    only a run of the whole page shows, so a click that does not go to Train reruns it.
    """
    clicked = st.button(label, key=key, help=help_text, on_click=_on_relaunch, args=(run, changes))
    if clicked and _GO_KEY not in st.session_state:
        st.rerun()
    go_to_train()


def go_to_train() -> None:
    """After a relaunch callback loaded a config: its messages, then the Train page."""
    messages = st.session_state.pop(_GO_KEY, None)
    if messages is not None:
        for message in messages:
            ui.flash("info", message)
        st.switch_page(TRAIN_PAGE)


def resume_button(
    store: RunStore, run: RunRecord, key: str, writable: bool, container: Any = st
) -> bool:
    """'Resume' where `train --resume` can continue the run, else disabled with the reason.

    True when a resume was started (the caller reruns to show it).
    """
    run_id = int(run.id)
    blocker = runner.resume_blocker(run, runner.checkpoint_path(store, run_id).is_file())
    if not writable:
        help_text = store_access.READONLY_NOTICE
    elif blocker is not None:
        help_text = f"Cannot resume: {blocker}"
    else:
        help_text = "Continue from its last checkpoint to max_steps"
    if not container.button(
        "Resume",
        key=key,
        icon=":material/play_arrow:",
        disabled=blocker is not None or not writable,
        help=help_text,
    ):
        return False
    try:
        runner.resume(store, run_id)
    except runner.LaunchError as exc:
        st.error(ui.plain(exc))
        if exc.log_tail:
            st.code(exc.log_tail, language=None)
        return False
    st.session_state[_RESUMED_KEY] = time.monotonic()
    ui.flash("success", f"Resuming run #{run_id} {run.name} from its last checkpoint.")
    return True


def recently_resumed() -> bool:
    """Whether this session resumed a run in the last RESUME_WATCH_S seconds."""
    started = st.session_state.get(_RESUMED_KEY)
    return started is not None and time.monotonic() - started < RESUME_WATCH_S


def action_row(store: RunStore, run: RunRecord, prefix: str, writable: bool) -> None:
    """Edit & relaunch and Resume side by side (Runs and Live); reruns after a resume."""
    with st.container(horizontal=True, gap="small"):
        relaunch_button(run, f"{prefix}.relaunch")
        resumed = resume_button(store, run, f"{prefix}.resume", writable)
    if resumed:
        st.rerun()
