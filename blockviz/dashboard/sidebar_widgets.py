"""The sidebar's widgets: one per config field, greyed out (saying why) where inert.

What each widget is lives in `config_fields`; this draws them. Values live in
st.session_state under `cfg.<field>` (the sidebar's `PREFIX`).
"""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from blockviz.core.fields import ConfigError, ConfigField
from blockviz.dashboard import url_config
from blockviz.dashboard.config_fields import (
    DATASET_CHOICES,
    DATASET_NOTES,
    FINAL_NORM_CHOICES,
    OPS_FIELDS,
    UPLOAD_CHOICE,
    VAL_FRACTION,
    widget_range,
)
from blockviz.dashboard.ui import plain
from blockviz.dashboard.uploads import UPLOAD_INFO_KEY, UploadInfo, upload_widget

PREFIX = "cfg."


def clamp_state(key: str, low: float, high: float) -> None:
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


def widget(
    spec: ConfigField, error: ConfigError | None, inert: dict[str, str] | None = None
) -> None:
    """One field's widget, the error that names it under it; disabled where `inert` says."""
    key = PREFIX + spec.name
    why_off = (inert or {}).get(spec.name)
    help_text = spec.help or None
    if why_off is not None:  # greyed out, and saying why (the value is kept for later)
        help_text = f"Does nothing now: {why_off}." + (f" {spec.help}" if spec.help else "")
    disabled = why_off is not None
    if spec.kind in ("select", "tristate"):
        options = FINAL_NORM_CHOICES if spec.kind == "tristate" else spec.choices
        st.selectbox(spec.label, options, key=key, help=help_text, disabled=disabled)
    elif spec.kind == "bool":
        st.toggle(spec.label, key=key, help=help_text, disabled=disabled)
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
            help=help_text,
            disabled=disabled,
        )
    if error is not None and error.field == spec.name:
        st.error(str(error), icon=":material/error:")


def group(
    title: str,
    specs: Sequence[ConfigField],
    error: ConfigError | None,
    expanded: bool,
    inert: dict[str, str] | None = None,
) -> None:
    """An expander of widgets, opened when it holds the field an error names."""
    holds_error = error is not None and any(s.name == error.field for s in specs)
    with st.expander(title, expanded=expanded or holds_error):
        for spec in specs:
            widget(spec, error, inert)


def data_group(error: ConfigError | None, dataset_choice: str) -> str | None:
    """The Data expander; returns a refused upload's message (shown there too)."""
    upload_error = None
    data_fields = ("dataset", "val_fraction", *(f.name for f in OPS_FIELDS))
    holds_error = error is not None and error.field in data_fields
    with st.expander("Data", expanded=holds_error or dataset_choice == UPLOAD_CHOICE):
        st.selectbox("Dataset", DATASET_CHOICES, key=PREFIX + "dataset")
        st.caption(DATASET_NOTES[dataset_choice])
        if dataset_choice == "ops":
            for spec in OPS_FIELDS:
                widget(spec, error)
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
            st.caption(url_config.UPLOAD_NOTE)
        widget(VAL_FRACTION, error)
    return upload_error
