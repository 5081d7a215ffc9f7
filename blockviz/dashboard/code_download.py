"""The "Export as code" button: a config as one self-contained PyTorch `train_<name>.py`."""

from __future__ import annotations

from typing import Any

import streamlit as st

from blockviz.core.config import RunConfig
from blockviz.core.fields import ConfigError
from blockviz.views.export import codegen

LABEL = "Export as code"
HELP = (
    "Download train_<name>.py: PyTorch only, no blockviz. It builds this model, reads a text "
    "file into the same characters and split, and trains with the same optimizer, schedule, "
    "clipping and seed (see docs/export.md, 'Export as code')."
)


def code_download_button(
    run_config: RunConfig | dict[str, Any] | None, name: str, key: str
) -> None:
    """An "Export as code" download for a valid config (a stored run's dict or the sidebar's).

    Nothing is drawn while there is no config; a stored config that no longer validates
    gets a disabled button whose help says why. The script is written on click only.
    """
    if run_config is None:
        return
    data = run_config.to_dict() if isinstance(run_config, RunConfig) else run_config
    try:
        config = RunConfig.from_dict(data).validate()  # a copy: later edits do not leak in
    except ConfigError as exc:
        st.download_button(
            LABEL, data="", key=key, disabled=True, help=f"Cannot export this config: {exc}"
        )
        return
    st.download_button(
        LABEL,
        data=lambda: codegen.script_text(config, name),
        file_name=codegen.script_filename(name),
        mime=codegen.MIME,
        key=key,
        on_click="ignore",
        icon=":material/code:",
        help=HELP,
    )
