"""The final-metrics (ablation) table as CSV, Markdown, LaTeX and HTML."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from blockviz.core import spec

TEXT_COLUMNS = tuple(c for c, col in spec.FINAL_COLUMNS.items() if col.kind == "text")


def _is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def format_cell(column: str, value: Any) -> str:
    """Human text for one table cell; '' for a missing value (callers pick a dash)."""
    if _is_missing(value):
        return ""
    if column in TEXT_COLUMNS or isinstance(value, str):
        return str(value)
    number = float(value)
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    shown = spec.FINAL_COLUMNS.get(column)
    if shown and shown.kind == "duration":
        return f"{number:.1f}"
    if shown and shown.digits == 0:
        return f"{number:,.0f}"
    if (shown and shown.kind in ("integer", "count")) or number.is_integer():
        return f"{int(number):,}"
    return f"{number:.4f}" if abs(number) < 1000 else f"{number:,.1f}"


def shown_columns(frame: pd.DataFrame) -> list[str]:
    """Columns worth printing: the text ones and those with at least one value."""
    return [c for c in frame.columns if c in TEXT_COLUMNS or frame[c].notna().any()]


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    """Text safe inside a LaTeX tabular cell (one pass, so nothing is escaped twice)."""
    return re.sub(r"[\\&%$#_{}~^]", lambda m: _LATEX_SPECIAL[m.group(0)], str(text))


def final_metrics_table(frame: pd.DataFrame) -> tuple[str, str, str]:
    """The final-metrics (ablation) table as (CSV, Markdown, LaTeX booktabs tabular).

    The CSV keeps every column at full precision; Markdown and LaTeX drop columns that are
    empty for every run (e.g. answer acc outside the ops task) and round for reading.
    """
    csv_text = frame.to_csv(index=False, lineterminator="\n")
    columns = shown_columns(frame)
    headers = [spec.final_header(c) for c in columns]
    rows = [[format_cell(c, row[c]) for c in columns] for _, row in frame.iterrows()]

    def md_cell(text: str) -> str:
        return text.replace("|", r"\|") if text else "—"

    align = ["---" if c in TEXT_COLUMNS else "---:" for c in columns]
    markdown = "\n".join(
        "| " + " | ".join(cells) + " |"
        for cells in [[md_cell(h) for h in headers], align]
        + [[md_cell(v) for v in r] for r in rows]
    )
    col_spec = "".join("l" if c in TEXT_COLUMNS else "r" for c in columns)
    col_spec = col_spec if col_spec.startswith("l") else "l" + col_spec[1:]
    latex_lines = [
        f"\\begin{{tabular}}{{{col_spec}}}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in headers) + r" \\",
        r"\midrule",
        *(" & ".join(latex_escape(v) if v else "--" for v in r) + r" \\" for r in rows),
        r"\bottomrule",
        r"\end{tabular}",
    ]
    return csv_text, markdown + "\n", "\n".join(latex_lines) + "\n"


def html_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(v) if v else '—'}</td>" for v in r) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
