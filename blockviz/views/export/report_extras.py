"""What a report holds beyond the training curves: attention maps and generated samples.

Attention: for each run, the latest step with recorded attention maps, one chart per
layer (every head as a panel), for at most ATTENTION_LAYERS layers (the first ones), so
a deep model does not make the report grow without bound. Samples: every recorded sample
of each run as text (samples/<run>.txt), and the newest REPORT_SAMPLES of each in the HTML
report, escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import altair as alt
import pandas as pd

from blockviz.store import RunRecord, RunStore
from blockviz.views import charts
from blockviz.views.export.outfolder import safe_filename, unique_name

ATTENTION_LAYERS = 12  # layers per run whose attention maps a report draws (the first ones)
REPORT_SAMPLES = 10  # newest samples per run shown in report.html (the .txt has all)


def attention_charts(store: RunStore, runs: Sequence[RunRecord]) -> list[alt.TopLevelMixin]:
    """Per run, its latest attention step: one heat map per layer (all heads), titled with
    the run, the layer and the step."""
    built: list[alt.TopLevelMixin] = []
    for run in runs:
        steps = store.attention_steps(run.id)
        if not steps:
            continue
        maps = store.attention(run.id, steps[-1])
        for layer in sorted(int(n) for n in set(maps["layer"]))[:ATTENTION_LAYERS]:
            title = f"Attention weights — layer {layer}, step {steps[-1]} — {run.name}"
            built.append(charts.attention_heatmap(maps, layer, title=title))
    return built


def _sample_lines(frame: pd.DataFrame) -> list[str]:
    """Samples oldest first, each under a line naming its step and prompt."""
    lines: list[str] = []
    for row in frame.iloc[::-1].itertuples(index=False):
        lines += [
            f"--- step {int(row.step)} · prompt {row.prompt!r}",
            f"{row.prompt}{row.text}",
            "",
        ]
    return lines


def sample_files(
    store: RunStore, runs: Sequence[RunRecord]
) -> tuple[dict[str, bytes], dict[str, pd.DataFrame]]:
    """samples/<run>.txt for each run with samples (every one, oldest first), and each
    run's samples newest first (for the HTML)."""
    files: dict[str, bytes] = {}
    taken: set[str] = set()
    by_run: dict[str, pd.DataFrame] = {}
    for run in runs:
        frame = store.samples(run.id)
        by_run[run.name] = frame
        if frame.empty:
            continue
        name = unique_name(safe_filename(run.name, "txt"), taken)
        text = "\n".join([f"generated samples of run {run.name}", "", *_sample_lines(frame)])
        files[f"samples/{name}"] = text.encode("utf-8")
    return files, by_run


def samples_html(samples: dict[str, pd.DataFrame]) -> str:
    """The report's samples section: per run the newest REPORT_SAMPLES, every text escaped."""
    parts = []
    for run_name, frame in samples.items():
        parts.append(f"<h3>{html.escape(run_name)}</h3>")
        if frame.empty:
            parts.append("<p>No samples yet.</p>")
            continue
        shown = frame.head(REPORT_SAMPLES)
        if len(frame) > len(shown):
            parts.append(
                f"<p>The newest {len(shown)} of {len(frame)}; every one is in samples/.</p>"
            )
        for row in shown.itertuples(index=False):
            parts.append(
                f"<p>step {int(row.step)} · prompt <code>{html.escape(repr(row.prompt))}</code></p>"
                f"<pre>{html.escape(str(row.prompt) + str(row.text))}</pre>"
            )
    return "".join(parts)
