"""Attention maps read like Transformer Explainer's: each query row and key column carries
its character, visibly (space, newline, markup), in cells large enough to read."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import altair as alt
import pandas as pd
import pytest

from blockviz.views import charts
from blockviz.views.charts.attention import (
    ATTENTION_MAX_WIDTH,
    MAX_POSITIONS,
    MIN_CELL_PX,
    visible_char,
)
from blockviz.views.export.render import chart_svg

SVG = "{http://www.w3.org/2000/svg}"


def attention_of(text: str, heads: int = 1, layer: int = 0) -> pd.DataFrame:
    """The store's attention frame for probe text `text`: uniform causal weights."""
    size = len(text)
    rows = [
        (1, 50, layer, head, q, k, text[q], text[k], 1 / (q + 1) if k <= q else 0.0)
        for head in range(heads)
        for q in range(size)
        for k in range(size)
    ]
    columns = ["run_id", "step", "layer", "head", "query", "key", "query_char", "key_char"]
    return pd.DataFrame(rows, columns=[*columns, "weight"])


def axis_labels(chart: alt.TopLevelMixin) -> dict[str, list[str]]:
    """The labels of the first x and the first y axis, as the rendered SVG draws them."""
    root = ET.fromstring(chart_svg(chart))  # parses: labels are text, not markup
    found: dict[str, list[str]] = {}
    for group in root.iter(f"{SVG}g"):
        described = group.get("aria-label", "")
        axis = re.match(r"([XY])-axis", described)
        if axis is None or axis.group(1).lower() in found:
            continue
        labels = [
            "".join(text.itertext())
            for inner in group.iter(f"{SVG}g")
            if "role-axis-label" in inner.get("class", "")
            for text in inner.iter(f"{SVG}text")
        ]
        found[axis.group(1).lower()] = labels
    return found


def test_each_query_row_and_key_column_is_labelled_with_its_character() -> None:
    labels = axis_labels(charts.attention_heatmap(attention_of("the cat"), layer=0))
    assert labels["x"] == ["t", "h", "e", "␣", "c", "a", "t"]
    assert labels["y"] == ["t", "h", "e", "␣", "c", "a", "t"]


def test_space_newline_tab_quotes_and_markup_render_as_visible_plain_labels() -> None:
    text = "a <b>&\n\tz\"'\\"
    labels = axis_labels(charts.attention_heatmap(attention_of(text), layer=0))
    assert labels["x"] == ["a", "␣", "<", "b", ">", "&", "⏎", "⇥", "z", '"', "'", "\\"]
    data = charts.chart_data(charts.attention_heatmap(attention_of(text), layer=0))
    # The raw characters stay in the data (the CSV); the tooltip shows the visible ones.
    assert "".join(data[data["query"] == len(text) - 1]["key_char"]) == text
    assert set(data["key_label"]) == set(labels["x"])


@pytest.mark.parametrize(
    ("char", "shown"),
    [
        (" ", "␣"),
        ("\n", "⏎"),
        ("\t", "⇥"),
        ("\r", "␍"),
        ("\x00", "\\x00"),
        ("\u200b", "\\u200b"),  # zero-width space
        ("\u2028", "\\u2028"),  # line separator
        ("<", "<"),
        ("é", "é"),
        ("\\", "\\"),
    ],
)
def test_invisible_characters_get_a_visible_stand_in(char: str, shown: str) -> None:
    assert visible_char(char) == shown


def test_repeated_characters_keep_their_own_positions() -> None:
    chart = charts.attention_heatmap(attention_of("aaab"), layer=0)
    labels = axis_labels(chart)
    assert labels["x"] == ["a", "a", "a", "b"]
    assert labels["y"] == ["a", "a", "a", "b"]
    data = charts.chart_data(chart)
    assert sorted(set(data["key"])) == [0, 1, 2, 3]
    assert len(data) == 4 * 5 // 2  # one cell per (query, key <= query)


def panel_cell_px(chart: alt.TopLevelMixin, size: int) -> tuple[float, float]:
    """The width and height one cell gets in a panel of `size` x `size` positions."""
    with alt.data_transformers.disable_max_rows():  # as the page and the exports do
        panel = chart.to_dict()["spec"]
    sides = []
    for side in ("width", "height"):
        value = panel[side]
        sides.append(value["step"] if isinstance(value, dict) else value / size)
    return sides[0], sides[1]


@pytest.mark.parametrize(("size", "heads"), [(8, 1), (32, 2), (48, 4), (64, 8)])
def test_cells_are_large_enough_to_read_and_all_heads_fit_the_page(size: int, heads: int) -> None:
    text = ("hello world\n" * 6)[:size]
    chart = charts.attention_heatmap(attention_of(text, heads=heads), layer=0)
    width, height = panel_cell_px(chart, size)
    assert width >= MIN_CELL_PX and height >= MIN_CELL_PX
    drawn = ET.fromstring(chart_svg(chart))
    assert float(drawn.get("width")) <= ATTENTION_MAX_WIDTH  # panels wrap, never too wide


def test_a_long_probe_shows_its_first_positions_and_says_so() -> None:
    size = MAX_POSITIONS + 36
    text = ("to be or not to be " * 10)[:size]
    chart = charts.attention_heatmap(attention_of(text), layer=0)
    data = charts.chart_data(chart)
    assert data["query"].max() == MAX_POSITIONS - 1
    assert f"first {MAX_POSITIONS} of {size} characters" in str(chart.title)
    assert len(axis_labels(chart)["x"]) == MAX_POSITIONS
