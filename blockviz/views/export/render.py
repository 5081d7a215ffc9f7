"""One chart as PNG, SVG, standalone HTML or CSV, rendered by vl-convert (no browser)."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import vl_convert as vlc

from blockviz.views import charts


def vl_version() -> str | None:
    """The Vega-Lite version Altair writes, when vl-convert has it (else its latest)."""
    major_minor = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return major_minor if major_minor in vlc.get_vegalite_versions() else None


def chart_spec(chart: alt.TopLevelMixin) -> dict[str, Any]:
    """The Vega-Lite spec of a chart, with every data row inlined (no 5,000-row cap)."""
    # Altair refuses frames over 5,000 rows by default; an export wants them all.
    with alt.data_transformers.disable_max_rows():
        return chart.to_dict()


def chart_title(chart: alt.TopLevelMixin) -> str:
    """The chart's title text (what exported file names are made from)."""
    title = getattr(chart, "title", None)
    text = getattr(title, "text", title)
    if isinstance(text, list):
        text = " ".join(map(str, text))
    return text if isinstance(text, str) and text.strip() else "chart"


def chart_png(chart: alt.TopLevelMixin, scale: float = 2.0) -> bytes:
    """PNG bytes at `scale` x the chart's CSS size (2 = sharp on slides and retina)."""
    return bytes(vlc.vegalite_to_png(chart_spec(chart), vl_version=vl_version(), scale=scale))


def chart_svg(chart: alt.TopLevelMixin) -> str:
    """SVG text of the chart (vector: for papers)."""
    return vlc.vegalite_to_svg(chart_spec(chart), vl_version=vl_version())


def svg_png(svg: str, scale: float = 2.0) -> bytes:
    """Rasterise an SVG from `chart_svg`: the same PNG as `chart_png`, without re-running Vega."""
    return bytes(vlc.svg_to_png(svg, scale=scale))


def chart_html(chart: alt.TopLevelMixin) -> str:
    """A standalone interactive HTML page with Vega, Vega-Lite and vega-embed inlined."""
    return vlc.vegalite_to_html(chart_spec(chart), vl_version=vl_version(), bundle=True)


def chart_csv(chart_or_frame: alt.TopLevelMixin | pd.DataFrame) -> str:
    """CSV of the data behind a chart (its attached frame) or of a frame itself."""
    if isinstance(chart_or_frame, pd.DataFrame):
        frame = chart_or_frame
    else:
        frame = charts.chart_data(chart_or_frame)
    return frame.to_csv(index=False, lineterminator="\n")
