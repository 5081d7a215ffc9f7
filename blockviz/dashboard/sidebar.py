"""The shared sidebar: every config field as a widget, presets, uploads, the run name.

Widget values live in st.session_state under `cfg.<field>`, so they persist across pages
(app.py renders the sidebar on every page). The RunConfig is built with blockviz.core.config and
validated there; the sidebar only shows the ConfigError it raises, under the field it names.
Number widgets take their min and max from config.BOUNDS. Text the user supplied (upload
names, run names, messages that quote them) is shown through `ui.plain`, never as Markdown.
What each widget is lives in `config_fields`, uploads in `uploads`, run names in `run_names`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import streamlit as st

from blockviz.core import config, corpora, params
from blockviz.core.config import ConfigError, DataConfig, ModelConfig, RunConfig
from blockviz.core.extras import check_logger_available
from blockviz.dashboard.config_fields import (
    ALL_FIELDS,
    ARCHITECTURE,
    DATASET_CHOICES,
    DATASET_NOTES,
    FINAL_NORM_CHOICES,
    NOT_WIDGETS,
    OPS_FIELDS,
    TRAINING,
    TRAINING_ADVANCED,
    UPLOAD_CHOICE,
    VAL_FRACTION,
    Field,
    from_widget,
    to_widget,
    widget_range,
)
from blockviz.dashboard.run_names import checked_name, suggest_name
from blockviz.dashboard.streamlit_compat import run_via_app
from blockviz.dashboard.ui import plain
from blockviz.dashboard.uploads import UPLOAD_INFO_KEY, UPLOAD_KEY, UploadInfo, upload_widget

PREFIX = "cfg."
PRESET_KEY = "cfg.preset"
NAME_KEY = "run_name"
AUTO_NAME_KEY = "run_name_suggested"  # the last suggestion, to tell it from a typed name
STATE_KEY = "sidebar_state"  # app.py hands this run's SidebarState to the page
DEFAULT_PRESET = config.DEFAULT_PRESET


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
    model_for_params: config.ModelConfig | None  # also set when only the data is wrong
    name_error: str | None = None  # the run name cannot be used (a bare number)

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
    """Set every config widget to the values of `run_config`."""
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


def _clamp_state(key: str, low: float, high: float) -> None:
    """Bring a stored value into the widget's range (Streamlit would reset it to the min).

    Only a config set from elsewhere (`apply_run_config` with an older run's) can hold
    one; the nearest bound keeps it as close to what was asked as the widget allows.
    """
    value = st.session_state.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if value != value:  # NaN
        st.session_state[key] = low
    elif value < low or value > high:
        st.session_state[key] = min(max(value, low), high)


def _widget(spec: Field, error: ConfigError | None) -> None:
    key = PREFIX + spec.name
    if spec.kind in ("select", "tristate"):
        options = FINAL_NORM_CHOICES if spec.kind == "tristate" else spec.options
        st.selectbox(spec.label, options, key=key, help=spec.help or None)
    elif spec.kind == "bool":
        st.toggle(spec.label, key=key, help=spec.help or None)
    else:
        low, high = widget_range(spec.name, spec.kind)  # _initialise clamped the value
        if spec.kind == "int":
            step, fmt = int(spec.step or 1), None
        else:
            step, fmt = float(spec.step or 0.1), spec.fmt
        st.number_input(
            spec.label,
            min_value=low,
            max_value=high,
            step=step,
            format=fmt,
            key=key,
            help=spec.help or None,
        )
    if error is not None and error.field == spec.name:
        st.error(str(error), icon=":material/error:")


def _group(title: str, specs: Sequence[Field], error: ConfigError | None, expanded: bool) -> None:
    holds_error = error is not None and any(s.name == error.field for s in specs)
    with st.expander(title, expanded=expanded or holds_error):
        for spec in specs:
            _widget(spec, error)


def _initialise() -> None:
    """First run of a session: the default preset; later runs: keep values off-page too."""
    if PRESET_KEY not in st.session_state:
        st.session_state[PRESET_KEY] = DEFAULT_PRESET
        apply_run_config(config.preset(DEFAULT_PRESET))
    # Re-assigning keeps a value whose widget is not drawn this run (the ops fields while
    # another dataset is chosen) from being dropped by Streamlit's widget cleanup.
    for key in list(st.session_state.keys()):
        if str(key).startswith(PREFIX) and key != UPLOAD_KEY:
            st.session_state[key] = st.session_state[key]
    # Before anything reads them: the config, the count and the widgets see one value.
    for spec in ALL_FIELDS:
        if spec.kind in ("int", "float"):
            _clamp_state(PREFIX + spec.name, *widget_range(spec.name, spec.kind))


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
        return corpora.CharVocab.from_text(text).size
    except (corpora.DataError, ConfigError, OSError, TypeError, ValueError):
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
            corpora.check_split(
                upload.n_chars,
                run_config.data.val_fraction,
                run_config.model.block_size,
                upload.name,
            )
        except corpora.DataError as exc:
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


def render_sidebar() -> SidebarState:
    """Draw the sidebar and return the config it describes (or the error that blocks it)."""
    _initialise()
    preset_name = st.session_state[PRESET_KEY]
    values = _values_from_state()
    dataset_choice = st.session_state.get(PREFIX + "dataset", "pydocs")
    # Field errors are known before drawing (widget values are in session state already),
    # so each can sit under its widget; only an upload needs its widget drawn first.
    _, error, _ = _with_dataset(values, dataset_choice, st.session_state.get(UPLOAD_INFO_KEY))
    with st.sidebar:
        st.selectbox(
            "Start from a preset",
            list(config.PRESETS),
            key=PRESET_KEY,
            on_change=_apply_preset,
            help="Choosing a preset resets every field below to it.",
        )
        st.caption(config.PRESET_DESCRIPTIONS.get(preset_name, ""))
        summary = st.container()
        _group("Architecture", ARCHITECTURE, error, expanded=True)
        _group("Training", TRAINING, error, expanded=False)
        _group("Training: advanced", TRAINING_ADVANCED, error, expanded=False)
        upload_error = _data_group(error, dataset_choice)
        upload = None if upload_error else st.session_state.get(UPLOAD_INFO_KEY)
        if dataset_choice != UPLOAD_CHOICE:
            upload = None
        run_config, error, data_error = _with_dataset(values, dataset_choice, upload)
        data_error = upload_error or data_error
        described = _described(values, dataset_choice, upload)
        suggestion = suggest_name(preset_name, described) if described else preset_name
        with summary:
            _parameter_metric(described)
            _name_follows(suggestion)
            st.text_input(
                "Run name", key=NAME_KEY, help="Suggested from what differs from the preset"
            )
            name, name_error = checked_name(st.session_state.get(NAME_KEY) or suggestion)
            if name_error is not None:
                st.error(plain(name_error), icon=":material/error:")
            if error is not None:
                field_name = plain(error.field)
                st.error(f"Cannot launch: fix **{field_name}** below.", icon=":material/block:")
            elif data_error is not None:
                st.warning(f"Cannot launch: {plain(data_error)}", icon=":material/block:")
            elif name_error is not None:
                st.warning("Cannot launch: change the run name.", icon=":material/block:")
    return SidebarState(
        preset=preset_name,
        run_config=run_config if error is None else None,
        error=error,
        data_error=data_error,
        name=name,
        name_suggestion=suggestion,
        upload=upload,
        model_for_params=described.model if described is not None else None,
        name_error=name_error,
    )


def _name_follows(suggestion: str) -> None:
    """Keep the name on the suggestion until the user types one of their own."""
    current = st.session_state.get(NAME_KEY)
    if not current or current == st.session_state.get(AUTO_NAME_KEY):
        st.session_state[NAME_KEY] = suggestion
    st.session_state[AUTO_NAME_KEY] = suggestion


def _parameter_metric(run_config: RunConfig | None) -> None:
    if run_config is None:
        st.metric("Parameters", "—")
        return
    try:
        total = params.param_breakdown(run_config.model).total
    except (ValueError, ArithmeticError):
        st.metric("Parameters", "—")
        return
    st.metric(
        "Parameters",
        f"{total:,}",
        help=f"for vocab_size {run_config.model.vocab_size} (set from the dataset when a run "
        "starts); the Parameters page has the breakdown",
    )


def _data_group(error: ConfigError | None, dataset_choice: str) -> str | None:
    """The Data expander; returns a refused upload's message (shown there too)."""
    upload_error = None
    data_fields = ("dataset", "val_fraction", *(f.name for f in OPS_FIELDS))
    holds_error = error is not None and error.field in data_fields
    with st.expander("Data", expanded=holds_error or dataset_choice == UPLOAD_CHOICE):
        st.selectbox("Dataset", DATASET_CHOICES, key=PREFIX + "dataset")
        st.caption(DATASET_NOTES[dataset_choice])
        if dataset_choice == "ops":
            for spec in OPS_FIELDS:
                _widget(spec, error)
        if dataset_choice == UPLOAD_CHOICE:
            upload_error = upload_widget()
            info: UploadInfo | None = st.session_state.get(UPLOAD_INFO_KEY)
            if upload_error is not None:
                st.error(f"Upload refused: {plain(upload_error)}", icon=":material/error:")
            elif info is not None:
                st.caption(
                    f"Using {plain(info.name)}: {info.n_chars:,} characters, "
                    f"{info.vocab_size} distinct."
                )
        _widget(VAL_FRACTION, error)
    return upload_error


def state() -> SidebarState:
    """This run's SidebarState: the one app.py rendered, or render it (a page run alone)."""
    current = st.session_state.get(STATE_KEY)
    if isinstance(current, SidebarState):
        return current
    run_via_app()
    return render_sidebar()
