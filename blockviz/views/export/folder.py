"""Export to a folder: every chart of the runs in the chosen formats, their data and a report.

Rendering goes through vl-convert (a Rust build of Vega with its own JavaScript engine),
so no browser is needed and the exported figure is the very spec the page shows. The data
behind a chart is the frame its builder attached as the chart's top-level data
(`charts.chart_data`), so its CSV holds exactly what is drawn, smoothed column included.

Files land under one output folder and nowhere else: names go through `safe_filename`, and
every write goes through `OutFolder`, which refuses any name or symlink that would leave it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import altair as alt

from blockviz.store import RunRecord, RunStore
from blockviz.views.export.ablation import final_metrics_table
from blockviz.views.export.outfolder import (
    ExportError,
    OutFolder,
)
from blockviz.views.export.render import (
    chart_csv,
    chart_html,
    chart_png,
    chart_svg,
)
from blockviz.views.export.report import (
    chart_stems,
    report_charts,
    report_files,
    report_name,
    selected_runs,
    tidy_layer_stats,
    tidy_scalars,
    zip_bytes,
)

FORMATS = ("png", "svg", "html", "csv", "zip", "all")


def export_to_folder(
    store: RunStore, run_ids: Sequence[int | str], out_dir: Path, fmt: str = "all"
) -> list[Path]:
    """Write the chosen format(s) of the runs' charts and data under out_dir; the paths.

    Layout: charts/<title>.<fmt>, configs/<run>.json, the tables at the top, the zip
    (format zip or all) named after the runs. Every file goes through one `OutFolder`,
    so nothing lands outside out_dir whatever it already holds (symlinks included).
    """
    if fmt not in FORMATS:
        raise ExportError(f"format {fmt!r} is not allowed; choose one of {', '.join(FORMATS)}")
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ExportError(f"--out {out_dir} exists and is not a folder")
    runs = selected_runs(store, run_ids)
    with OutFolder(out_dir) as out:
        # The folders first: a symlink in the way is refused before seconds of rendering.
        if fmt != "zip":
            out.folder("charts")
        if fmt == "all" and any(r.config is not None for r in runs):
            out.folder("configs")
        return _export(store, runs, out, fmt)


def _export(store: RunStore, runs: Sequence[RunRecord], out: OutFolder, fmt: str) -> list[Path]:
    """The writes of export_to_folder, into an opened (and checked) output folder."""
    ids = [r.id for r in runs]
    entries = report_charts(store, ids)
    stems = chart_stems(entries)
    written: list[Path] = []
    if fmt in ("zip", "all"):
        files = report_files(store, ids, entries=entries)
        written.append(out.write(report_name([r.name for r in runs]), zip_bytes(files)))
        if fmt == "zip":
            return written
        for member, payload in files.items():
            written.append(out.write(member, payload))
    renderers: dict[str, Callable[[alt.TopLevelMixin], bytes | str]] = {
        "png": chart_png,
        "svg": chart_svg,
        "html": chart_html,
        "csv": chart_csv,
    }
    # `all` already has PNG, SVG and CSV from the report; only the standalone HTML is new.
    chosen = ["html"] if fmt == "all" else [fmt]
    for (_, chart, _), stem in zip(entries, stems, strict=True):
        for ext in chosen:
            written.append(out.write(f"charts/{stem}.{ext}", renderers[ext](chart)))
    if fmt == "csv":
        tables = {
            "scalars.csv": tidy_scalars(store.scalars(ids)),
            "layer_stats.csv": tidy_layer_stats(store.layer_stats(ids)),
        }
        for name, frame in tables.items():
            written.append(out.write(name, chart_csv(frame)))
        metrics_csv = final_metrics_table(store.final_metrics(ids))[0]
        written.append(out.write("final_metrics.csv", metrics_csv))
    return written
