"""The shared sidebar: every config field as a widget, presets, uploads, the run name.

Widget values live in st.session_state under `cfg.<field>`, so they persist across pages:
app.py draws the sidebar only on the pages it drives (Train, Parameters, Gradients at init)
and calls `keep_values` on the others, so no value is lost while its widget is not drawn.
The RunConfig is built with blockviz.core.config and validated there; the sidebar only
shows the ConfigError it raises, under the field it names. The config also lives in the
URL query (`url_config`): a fresh session reads it, every drawn sidebar writes it back.
Number widgets take their min and max from config.BOUNDS. Text the user supplied (upload
names, run names, messages that quote them) is shown through `ui.plain`, never as Markdown.
What each widget is lives in `config_fields`, uploads in `uploads`, run names in `run_names`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, fields
from typing import Any

import streamlit as st

from blockviz.core import config, corpora, params
from blockviz.core.config import RunConfig
from blockviz.core.config_model import ModelConfig
from blockviz.core.config_train import DataConfig
from blockviz.core.extras import check_logger_available
from blockviz.core.fields import ConfigError, ConfigField
from blockviz.core.inert import inert_fields
from blockviz.core.presets import DEFAULT_PRESET, PRESET_DESCRIPTIONS, PRESETS
from blockviz.core.vocab import CharVocab, DataError, check_split
from blockviz.dashboard import sidebar_widgets, url_config
from blockviz.dashboard.config_fields import (
    ALL_FIELDS,
    ARCHITECTURE,
    NOT_WIDGETS,
    TRAINING,
    TRAINING_ADVANCED,
    UPLOAD_CHOICE,
    from_widget,
    to_widget,
    widget_range,
)
from blockviz.dashboard.run_names import checked_name, suggest_name
from blockviz.dashboard.sidebar_widgets import clamp_state, data_group, group
from blockviz.dashboard.streamlit_compat import run_via_app
from blockviz.dashboard.ui import plain
from blockviz.dashboard.uploads import UPLOAD_INFO_KEY, UPLOAD_KEY, UploadInfo

PREFIX = sidebar_widgets.PREFIX
PRESET_KEY = "cfg.preset"
NAME_KEY = "run_name"
AUTO_NAME_KEY = "run_name_suggested"  # the last suggestion, to tell it from a typed name
STATE_KEY = "sidebar_state"  # app.py hands this run's SidebarState to the page
URL_PROBLEMS_KEY = "cfg_url_problems"  # what a shared URL asked for that could not be used
URL_LOADED_KEY = "cfg_url_loaded"  # the query as first written: problems show until it changes
STARTED_KEY = "cfg_started"  # the start presets of the pages drawn so far this session


@dataclass(frozen=True)
class SidebarState:
    """What the sidebar produced this run."""

    preset: str
    run_config: RunConfig | None  # None while the widgets make an invalid config
    error: ConfigError | None
    data_error: str | None  # a dataset problem (no upload yet, text too short)
    name: str  # the sanitized run name to launch with
    name_suggestion: str
    upload: UploadInfo | None
    # The model to draw and count: None while the config does not validate, but set when
    # only the data is wrong (no upload yet), so the diagram and the count stay.
    model_for_params: ModelConfig | None
    name_error: str | None = None  # the run name cannot be used (a bare number)
    # The Architecture fields that do nothing under the rest of the config, and why (a
    # page drawing a field itself greys it out the same way).
    inert: dict[str, str] = field(default_factory=dict)

    @property
    def can_launch(self) -> bool:
        """Whether Launch may be pressed."""
        return (
            self.run_config is not None
            and self.error is None
            and self.data_error is None
            and self.name_error is None
        )

    @property
    def problem(self) -> str | None:
        """The message that explains why Launch is disabled (plain text, not Markdown)."""
        if self.error is not None:
            return str(self.error)
        return self.data_error or self.name_error


# ------------------------------------------------------------------ widget values


def apply_run_config(run_config: RunConfig) -> None:
    """Set every config widget to the values of `run_config`.

    Called before any sidebar of the session (a run's config loaded on another page),
    it also starts the session's config, so the URL query read at a session's first
    sidebar cannot replace what was loaded.
    """
    st.session_state.setdefault(PRESET_KEY, DEFAULT_PRESET)
    for section in config.SECTIONS:
        for f in fields(config.SECTIONS[section]):
            if f.name == "vocab_size":
                continue
            st.session_state[PREFIX + f.name] = to_widget(
                f.name, getattr(getattr(run_config, section), f.name)
            )


def _apply_preset() -> None:
    """on_change of the preset select: every widget back to the preset's values."""
    name = st.session_state.get(PRESET_KEY, DEFAULT_PRESET)
    apply_run_config(config.preset(name))
    st.session_state.pop(NAME_KEY, None)  # the name follows the new preset again


def _values_from_state() -> dict[str, dict[str, Any]]:
    """Nested {section: {field: value}} from the widgets (dataset left to the caller)."""
    defaults = config.preset(st.session_state.get(PRESET_KEY, DEFAULT_PRESET)).to_dict()
    values: dict[str, dict[str, Any]] = {section: {} for section in config.SECTIONS}
    for section in config.SECTIONS:
        for name, default in defaults[section].items():
            if name in NOT_WIDGETS:
                values[section][name] = default
                continue
            key = PREFIX + name
            raw = st.session_state[key] if key in st.session_state else to_widget(name, default)
            values[section][name] = from_widget(name, raw)
    return values


# ------------------------------------------------------------------ rendering


def keep_values() -> None:
    """Keep every config value through a run that does not draw its widget.

    Streamlit drops a widget's value at the end of a run that did not draw it (the ops
    fields while another dataset is chosen; every field on Live, Compare and Runs, which
    draw no sidebar). Re-assigning the value makes it the session's own, which survives.
    """
    for key in list(st.session_state.keys()):
        if (str(key).startswith(PREFIX) and key != UPLOAD_KEY) or key == NAME_KEY:
            st.session_state[key] = st.session_state[key]


def _from_url(start: str) -> None:
    """First sidebar of a session: the config the URL query asks for, over its preset
    (`start` when the query names none)."""
    query = {key: st.query_params[key] for key in st.query_params}
    decoded = url_config.decode(query, start)
    st.session_state[PRESET_KEY] = decoded.preset
    apply_run_config(config.replace(config.preset(decoded.preset), **decoded.values))
    if decoded.name is not None:
        st.session_state[NAME_KEY] = decoded.name
    if decoded.problems:
        st.session_state[URL_PROBLEMS_KEY] = decoded.problems
        st.session_state.pop(URL_LOADED_KEY, None)


def _untouched() -> bool:
    """Whether the session's config is still the default preset's, no field changed."""
    typed = st.session_state.get(NAME_KEY)
    if st.session_state.get(PRESET_KEY) != DEFAULT_PRESET or (
        typed and typed != st.session_state.get(AUTO_NAME_KEY)
    ):
        return False
    dataset_choice = st.session_state.get(PREFIX + "dataset", "pydocs")
    return not url_config.changes(DEFAULT_PRESET, _flat(_values_from_state(), dataset_choice))


def _initialise(start: str) -> None:
    """First run of a session: the URL's config, else the page's `start` preset. The first
    time a page with a start of its own (the Playground) draws the sidebar, it starts from
    that preset too, unless the config was changed from the default on another page.
    Later runs keep the values."""
    if PRESET_KEY not in st.session_state:
        _from_url(start)
    elif start not in st.session_state.get(STARTED_KEY, ()) and _untouched():
        st.session_state[PRESET_KEY] = start
        _apply_preset()
    st.session_state[STARTED_KEY] = {*st.session_state.get(STARTED_KEY, ()), start}
    keep_values()
    # Before anything reads them: the config, the count and the widgets see one value.
    for spec in ALL_FIELDS:
        if spec.kind in ("int", "float"):
            clamp_state(PREFIX + spec.name, *widget_range(spec.name, spec.kind))


def _build(values: dict[str, dict[str, Any]]) -> tuple[RunConfig | None, ConfigError | None]:
    try:
        run_config = RunConfig.from_dict(values).validate()
        check_logger_available(run_config.train)  # shown under "Also log to", not at launch
        return run_config, None
    except ConfigError as exc:
        return None, exc


@st.cache_data(show_spinner=False, max_entries=32)
def _builtin_vocab_size(data: dict[str, Any]) -> int:
    """The vocabulary a run on this built-in dataset will have, so the counts shown match.

    Reads the corpus (milliseconds; cached). Tiny Shakespeare's is known without reading
    or downloading it; a dataset that cannot be read keeps the default, and Launch says why.
    """
    if data.get("dataset") == "shakespeare":  # its SHA-256 pins the text; never download here
        return corpora.SHAKESPEARE_VOCAB_SIZE
    try:
        text = corpora.load_corpus(DataConfig(**data).validate()).text
        return CharVocab.from_text(text).size
    except (DataError, ConfigError, OSError, TypeError, ValueError):
        return ModelConfig().vocab_size


def _with_dataset(
    values: dict[str, dict[str, Any]], dataset_choice: str, upload: UploadInfo | None
) -> tuple[RunConfig | None, ConfigError | None, str | None]:
    """Validate the widgets' values with the chosen dataset; (config, error, data problem)."""
    data_error = None
    values = {section: dict(part) for section, part in values.items()}
    if dataset_choice != UPLOAD_CHOICE:
        values["data"]["dataset"] = dataset_choice
        values["model"]["vocab_size"] = _builtin_vocab_size(values["data"])
    elif upload is None:
        values["data"]["dataset"] = UPLOAD_CHOICE  # a stand-in so the other fields validate
        data_error = "dataset: no text uploaded yet; upload a UTF-8 text file or pick a corpus"
    else:
        values["data"]["dataset"] = upload.path
        values["model"]["vocab_size"] = upload.vocab_size
    run_config, error = _build(values)
    if run_config is not None and upload is not None and dataset_choice == UPLOAD_CHOICE:
        try:
            check_split(
                upload.n_chars,
                run_config.data.val_fraction,
                run_config.model.block_size,
                upload.name,
            )
        except DataError as exc:
            data_error = str(exc)
    return run_config, error, data_error


def _described(
    values: dict[str, dict[str, Any]], dataset_choice: str, upload: UploadInfo | None
) -> RunConfig | None:
    """The widgets' config unvalidated (for the count, the diagram and the name), or None."""
    described = {section: dict(part) for section, part in values.items()}
    if upload is not None:
        described["model"]["vocab_size"] = upload.vocab_size
        described["data"]["dataset"] = upload.name  # only the name suggestion reads it
    elif dataset_choice != UPLOAD_CHOICE:
        described["data"]["dataset"] = dataset_choice
        described["model"]["vocab_size"] = _builtin_vocab_size(described["data"])
    try:
        return RunConfig.from_dict(described)
    except ConfigError:
        return None


def render_sidebar(elsewhere: Collection[str] = (), start: str = DEFAULT_PRESET) -> SidebarState:
    """Draw the sidebar and return the config it describes (or the error that blocks it).

    The fields named in `elsewhere` are left out: the page draws them itself (the
    Playground, beside its chart) with the same keys, so they hold one value. `start` is
    the page's own preset, the config it opens on (`_initialise`).
    """
    _initialise(start)
    preset_name = st.session_state[PRESET_KEY]
    values = _values_from_state()
    dataset_choice = st.session_state.get(PREFIX + "dataset", "pydocs")
    # Field errors are known before drawing (widget values are in session state already),
    # so each can sit under its widget; only an upload needs its widget drawn first.
    _, error, _ = _with_dataset(values, dataset_choice, st.session_state.get(UPLOAD_INFO_KEY))
    before = _described(values, dataset_choice, st.session_state.get(UPLOAD_INFO_KEY))
    inert = _architecture_inert(before)
    with st.sidebar:
        st.selectbox(
            "Start from a preset",
            list(PRESETS),
            key=PRESET_KEY,
            on_change=_apply_preset,
            help="Choosing a preset resets every field below to it.",
        )
        preset_caption = st.container()
        url_notes = st.container()
        summary = st.container()
        group("Architecture", _left(ARCHITECTURE, elsewhere), error, expanded=True, inert=inert)
        group("Training", _left(TRAINING, elsewhere), error, expanded=False)
        group("Training: advanced", _left(TRAINING_ADVANCED, elsewhere), error, expanded=False)
        upload_error = data_group(error, dataset_choice)
        upload = None if upload_error else st.session_state.get(UPLOAD_INFO_KEY)
        if dataset_choice != UPLOAD_CHOICE:
            upload = None
        run_config, error, data_error = _with_dataset(values, dataset_choice, upload)
        data_error = upload_error or data_error
        described = _described(values, dataset_choice, upload)
        model_for_params = _valid_model(described)
        suggestion = suggest_name(preset_name, described) if described else preset_name
        flat = _flat(values, dataset_choice)
        with preset_caption:
            _preset_caption(preset_name, flat)
        with summary:
            _parameter_metric(model_for_params)
            _name_follows(suggestion)
            st.text_input(
                "Run name", key=NAME_KEY, help="Suggested from what differs from the preset"
            )
            typed = st.session_state.get(NAME_KEY) or suggestion
            name, name_error = checked_name(typed)
            if name_error is not None:
                st.error(plain(name_error), icon=":material/error:")
            if error is not None:
                field_name = plain(error.field)
                where = "beside the chart" if error.field in elsewhere else "below"
                st.error(f"Cannot launch: fix **{field_name}** {where}.", icon=":material/block:")
            elif data_error is not None:
                st.warning(f"Cannot launch: {plain(data_error)}", icon=":material/block:")
            elif name_error is not None:
                st.warning("Cannot launch: change the run name.", icon=":material/block:")
        query = url_config.encode(preset_name, flat, None if typed == suggestion else typed)
        with url_notes:
            _url_problems(query)
        _write_query(query)
    return SidebarState(
        preset=preset_name,
        run_config=run_config if error is None else None,
        error=error,
        data_error=data_error,
        name=name,
        name_suggestion=suggestion,
        upload=upload,
        model_for_params=model_for_params,
        name_error=name_error,
        inert=inert,
    )


def _left(specs: tuple[ConfigField, ...], elsewhere: Collection[str]) -> tuple[ConfigField, ...]:
    """The fields of a group the sidebar draws: those the page does not draw itself."""
    return tuple(spec for spec in specs if spec.name not in elsewhere)


def _architecture_inert(described: RunConfig | None) -> dict[str, str]:
    """The Architecture fields that do nothing under the rest of the config, and why."""
    if described is None:
        return {}
    names = {spec.name for spec in ARCHITECTURE}
    return {name: why for name, why in inert_fields(described).items() if name in names}


def _valid_model(described: RunConfig | None) -> ModelConfig | None:
    """The model to draw and count, or None when the config does not validate.

    Validated apart from the Launch checks: a missing upload or an uninstalled logger
    package blocks Launch but leaves a model that can be drawn and counted.
    """
    if described is None:
        return None
    try:
        described.validate()
    except ConfigError:
        return None
    return described.model


def _flat(values: dict[str, dict[str, Any]], dataset_choice: str) -> dict[str, Any]:
    """{field: config value} of the widgets, `dataset` being the chosen corpus (or upload)."""
    flat = {name: value for part in values.values() for name, value in part.items()}
    flat["dataset"] = dataset_choice
    flat.pop("vocab_size", None)
    return flat


def _preset_caption(preset_name: str, flat: dict[str, Any]) -> None:
    """What the preset is, and which fields now differ from it (computed, not described)."""
    description = PRESET_DESCRIPTIONS.get(preset_name, "")
    st.caption(f"Preset {plain(preset_name)}: {plain(description)}")
    changed = url_config.changes_caption(preset_name, flat)
    if changed:
        st.caption(plain(changed[0].upper() + changed[1:]))


def _url_problems(query: dict[str, str]) -> None:
    """What the opening URL asked for and did not get, until the config is changed."""
    problems = st.session_state.get(URL_PROBLEMS_KEY)
    if not problems:
        return
    loaded = st.session_state.setdefault(URL_LOADED_KEY, query)
    if loaded != query:
        st.session_state.pop(URL_PROBLEMS_KEY, None)
        st.session_state.pop(URL_LOADED_KEY, None)
        return
    for problem in problems:
        st.warning(f"From the link: {plain(problem)}", icon=":material/link_off:")


def _write_query(query: dict[str, str]) -> None:
    """Put the config in the URL, touching no key that is not the config's."""
    current = st.query_params
    for key in [key for key in current if key in url_config.PARAMS and key not in query]:
        del current[key]
    for key, text in query.items():
        if current.get(key) != text:
            current[key] = text


def drop_query() -> None:
    """On a page without the sidebar: the URL carries none of the config's keys."""
    for key in [key for key in st.query_params if key in url_config.PARAMS]:
        del st.query_params[key]


def _name_follows(suggestion: str) -> None:
    """Keep the name on the suggestion until the user types one of their own."""
    current = st.session_state.get(NAME_KEY)
    if not current or current == st.session_state.get(AUTO_NAME_KEY):
        st.session_state[NAME_KEY] = suggestion
    st.session_state[AUTO_NAME_KEY] = suggestion


def _parameter_metric(model: ModelConfig | None) -> None:
    """The total, or "—" while the config does not validate (its message says why)."""
    if model is None:
        st.metric("Parameters", "—", help="the config does not validate; see the message below")
        return
    try:
        total = params.param_breakdown(model).total
    except (ValueError, ArithmeticError):
        st.metric("Parameters", "—")
        return
    st.metric(
        "Parameters",
        f"{total:,}",
        help=f"for vocab_size {model.vocab_size} (set from the dataset when a run "
        "starts); the Parameters page has the breakdown",
    )


def show_invalid(state: SidebarState, purpose: str) -> None:
    """In place of what an invalid config cannot have: its message, naming the field."""
    if state.error is None:
        st.error(f"Fix the config in the sidebar {purpose}.", icon=":material/error:")
        return
    st.error(
        f"This config does not validate: {plain(state.error)}. Fix "
        f"**{plain(state.error.field)}** in the sidebar {purpose}.",
        icon=":material/error:",
    )


def state(elsewhere: Collection[str] = (), start: str = DEFAULT_PRESET) -> SidebarState:
    """This run's SidebarState: the one app.py rendered, or render it (a page run alone),
    leaving out the fields named in `elsewhere` (the page draws them), starting from the
    page's preset `start`."""
    current = st.session_state.get(STATE_KEY)
    if isinstance(current, SidebarState):
        return current
    run_via_app()
    return render_sidebar(elsewhere, start)
