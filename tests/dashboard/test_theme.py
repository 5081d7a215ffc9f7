"""The app follows the system's light or dark setting (issue 35, defect 13)."""

from __future__ import annotations

import tomllib
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / ".streamlit" / "config.toml"


def test_the_app_forces_no_theme() -> None:
    """Without theme.base Streamlit follows the browser's prefers-color-scheme; with it (or
    a custom theme's colours) every visitor gets that one theme."""
    theme = tomllib.loads(CONFIG.read_text(encoding="utf-8")).get("theme", {})
    assert theme == {}, f"{CONFIG} forces a theme: [theme] {theme}"
