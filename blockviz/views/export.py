"""Chart and data export: PNG, SVG, standalone HTML, CSV, tables, and a one-file report zip.

Rendering goes through vl-convert (a Rust build of Vega with its own JavaScript engine),
so no browser is needed and the exported figure is the very spec the page shows. The data
behind a chart is the frame its builder attached as the chart's top-level data
(`charts.chart_data`), so its CSV holds exactly what is drawn, smoothed column included.

Files land under one output folder and nowhere else: names go through `safe_filename`, and
every write goes through `OutFolder`, which refuses any name or symlink that would leave it.
"""

from __future__ import annotations

import html
import io
import json
import math
import os
import re
import stat
import time
import unicodedata
import zipfile
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd
import vl_convert as vlc

from blockviz.core import config as cfg
from blockviz.core import spec
from blockviz.core.files import atomic_write
from blockviz.store import RunStore
from blockviz.views import charts

Progress = Callable[[float, str], None]
ChartEntry = tuple[str, alt.TopLevelMixin, pd.DataFrame]

MAX_STEM = 100  # file-name stem cap: room for a suffix and well under every FS limit
REPORT_MAX_POINTS = 2000  # per series in report charts; the CSVs are never downsampled
FORMATS = ("png", "svg", "html", "csv", "zip", "all")

TEXT_COLUMNS = tuple(c for c, col in spec.FINAL_COLUMNS.items() if col.kind == "text")


class ExportError(ValueError):
    """An export cannot be written as asked; the message names the path or value and why."""


# ---------------------------------------------------------------------------------------
# One chart


def _vl_version() -> str | None:
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
    return bytes(vlc.vegalite_to_png(chart_spec(chart), vl_version=_vl_version(), scale=scale))


def chart_svg(chart: alt.TopLevelMixin) -> str:
    """SVG text of the chart (vector: for papers)."""
    return vlc.vegalite_to_svg(chart_spec(chart), vl_version=_vl_version())


def svg_png(svg: str, scale: float = 2.0) -> bytes:
    """Rasterise an SVG from `chart_svg`: the same PNG as `chart_png`, without re-running Vega."""
    return bytes(vlc.svg_to_png(svg, scale=scale))


def chart_html(chart: alt.TopLevelMixin) -> str:
    """A standalone interactive HTML page with Vega, Vega-Lite and vega-embed inlined."""
    return vlc.vegalite_to_html(chart_spec(chart), vl_version=_vl_version(), bundle=True)


def chart_csv(chart_or_frame: alt.TopLevelMixin | pd.DataFrame) -> str:
    """CSV of the data behind a chart (its attached frame) or of a frame itself."""
    if isinstance(chart_or_frame, pd.DataFrame):
        frame = chart_or_frame
    else:
        frame = charts.chart_data(chart_or_frame)
    return frame.to_csv(index=False, lineterminator="\n")


# ---------------------------------------------------------------------------------------
# Safe names and writes


def safe_filename(text: str, ext: str) -> str:
    """A file name made of [a-z0-9._-] from any text: no separators, no '..', never empty."""
    ascii_text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode()
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", ascii_text).lower()
    stem = re.sub(r"\.{2,}", ".", stem)  # '..' never survives, even inside a name
    stem = re.sub(r"-{2,}", "-", stem)
    # No leading dot (a hidden file) and no trailing dot or dash to glue onto the suffix.
    stem = stem.strip("._-")[:MAX_STEM].strip("._-") or "export"
    suffix = re.sub(r"[^a-z0-9]", "", str(ext).lower())[:10]
    return f"{stem}.{suffix}" if suffix else stem


def _check_name(name: str) -> None:
    """Refuse names that are not a single plain path component."""
    separators = {"/", "\\", os.sep, os.altsep or "/", "\0"}
    if not name or name in (".", "..") or any(s in name for s in separators):
        raise ExportError(
            f"file name {name!r} is not allowed; use one plain name without path "
            "separators (safe_filename makes one)"
        )


# Opening a folder never follows a symlink (O_NOFOLLOW) and never opens anything else.
_FOLDER_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


class OutFolder:
    """An output folder opened once; every export write goes through `write` and stays in it.

    The root is resolved once (a symlink given as the folder itself is the caller's
    choice). Below it, subfolders are created and opened one component at a time
    relative to their parent's file descriptor, refusing any component that is a
    symlink, so nothing swapped in later can redirect a write either. Each file is
    written to a temporary name in its folder and renamed over the target, and a rename
    replaces a symlink at the target instead of following it.
    """

    def __init__(self, out_dir: str | Path) -> None:
        if not {os.open, os.mkdir, os.stat, os.rename, os.unlink} <= os.supports_dir_fd:
            raise ExportError("writing exports needs a system with dir_fd support (POSIX)")
        root = Path(out_dir).expanduser()
        if root.exists() and not root.is_dir():
            raise ExportError(f"--out {root} exists and is not a folder")
        try:
            root.mkdir(parents=True, exist_ok=True)
            self.root = root.resolve(strict=True)
            root_fd = os.open(self.root, _FOLDER_FLAGS)
        except OSError as exc:
            raise ExportError(
                f"cannot create the output folder {root} ({exc.strerror or exc})"
            ) from None
        self._folders: dict[str, int] = {"": root_fd}

    def __enter__(self) -> OutFolder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the folder descriptors (writing afterwards reopens nothing: it fails)."""
        folders, self._folders = self._folders, {}
        for fd in folders.values():
            os.close(fd)

    def folder(self, relative: str) -> int:
        """The descriptor of root/relative ('a/b'), created if missing; never via a symlink."""
        if relative in self._folders:
            return self._folders[relative]
        if not self._folders:
            raise ExportError(f"the output folder {self.root} is closed")
        parent_path, _, name = relative.rpartition("/")
        _check_name(name)
        parent = self.folder(parent_path)
        shown = self.root / relative
        try:
            os.mkdir(name, 0o777, dir_fd=parent)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ExportError(f"cannot create the folder {shown} ({exc.strerror})") from None
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError as exc:
            raise ExportError(f"cannot read the folder {shown} ({exc.strerror})") from None
        if stat.S_ISLNK(info.st_mode):
            raise ExportError(
                f"{shown} is a symlink; not writing through it (exports stay inside {self.root})"
            )
        if not stat.S_ISDIR(info.st_mode):
            raise ExportError(f"{shown} exists and is not a folder; not writing into it")
        try:
            fd = os.open(name, _FOLDER_FLAGS, dir_fd=parent)
        except OSError as exc:  # replaced by a symlink since the check: ELOOP
            raise ExportError(f"cannot open the folder {shown} ({exc.strerror})") from None
        self._folders[relative] = fd
        return fd

    def write(self, relative: str, data: bytes | str, *, overwrite: bool = True) -> Path:
        """Write data to root/relative ('charts/loss.png') whole, then return its path.

        An existing regular file is replaced (unless overwrite=False, which refuses); a
        symlink, folder or anything else at that name is refused and left as it is.
        """
        for part in relative.split("/"):
            _check_name(part)  # no '', '.', '..' or backslash anywhere in the path
        folder_path, _, name = relative.rpartition("/")
        folder = self.folder(folder_path)
        target = self.root / relative
        try:
            info: os.stat_result | None = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        except OSError as exc:
            raise ExportError(f"cannot read {target} ({exc.strerror})") from None
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise ExportError(f"{target} exists and is not a regular file; not writing over it")
        if info is not None and not overwrite:
            raise ExportError(f"{target} already exists; pass overwrite=True to replace it")
        try:
            atomic_write(name, data, dir_fd=folder)
        except OSError as exc:
            raise ExportError(f"cannot write {target} ({exc.strerror or exc})") from None
        return target


def write_file(out_dir: Path, name: str, data: bytes | str, *, overwrite: bool = True) -> Path:
    """Write `data` to out_dir/name and return the path; refuse to write anywhere else.

    An existing regular file of that name is replaced (re-running an export refreshes it),
    atomically, unless `overwrite=False`, which raises instead. A symlink or a folder in
    the way is refused, never followed.
    """
    _check_name(name)
    with OutFolder(out_dir) as out:
        return out.write(name, data, overwrite=overwrite)


def _unique(name: str, taken: set[str]) -> str:
    """`name`, or name-2, name-3 ... when two titles sanitise to the same file name."""
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    candidate, count = name, 1
    while candidate in taken:
        count += 1
        candidate = f"{stem}-{count}.{ext}" if ext else f"{stem}-{count}"
    taken.add(candidate)
    return candidate


# ---------------------------------------------------------------------------------------
# Tables


def _is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _format_cell(column: str, value: Any) -> str:
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


def _shown_columns(frame: pd.DataFrame) -> list[str]:
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
    columns = _shown_columns(frame)
    headers = [spec.final_header(c) for c in columns]
    rows = [[_format_cell(c, row[c]) for c in columns] for _, row in frame.iterrows()]

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


def _html_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(v) if v else '—'}</td>" for v in r) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ---------------------------------------------------------------------------------------
# What a report holds


def _runs(store: RunStore, run_ids: Sequence[int | str]) -> list[dict[str, Any]]:
    """The selected runs' rows (config parsed), in the order given, without repeats."""
    ids = list(dict.fromkeys(store.resolve(r) for r in run_ids))
    if not ids:
        raise ExportError("no runs selected; name at least one run id or name")
    return [store.get_run(i) for i in ids]


def report_charts(
    store: RunStore, run_ids: Sequence[int | str], max_points: int = REPORT_MAX_POINTS
) -> list[ChartEntry]:
    """The charts of a report as (title, chart, data): comparisons first, then per run."""
    runs = _runs(store, run_ids)
    ids = [r["id"] for r in runs]
    colors = charts.run_color_scale({r["id"]: r["name"] for r in runs})
    diverged = {r["name"]: r["diverged_step"] for r in runs if r["diverged_step"] is not None}
    scalars = store.scalars(ids, max_points=max_points)
    built: list[alt.TopLevelMixin] = [
        # A diverged run's spike would flatten every other curve on a linear axis.
        charts.loss_chart(
            scalars, colors=colors, diverged=diverged, log_scale=bool(diverged), title="Loss"
        ),
        charts.metric_chart(scalars, "val/loss", colors=colors, title="Validation loss"),
        charts.metric_chart(scalars, "train/lr", colors=colors, title="Learning rate"),
        charts.metric_chart(
            scalars,
            "train/grad_norm",
            smoothing=0.6,
            log_scale=True,
            colors=colors,
            title="Global gradient norm (before clipping)",
            diverged=diverged,
        ),
        charts.metric_chart(scalars, "train/tokens_per_sec", colors=colors, title="Throughput"),
    ]
    if "val/answer_acc" in set(scalars["name"]):
        built.append(
            charts.metric_chart(scalars, "val/answer_acc", colors=colors, title="Answer accuracy")
        )
    at_init = store.layer_stats(ids, kind="component", stat="grad_norm", step=0)
    built.append(charts.grad_by_layer_chart(at_init, step=0, colors=colors))
    last_parts = []
    for run_id in ids:
        steps = store.layer_steps(run_id, kind="component")
        if steps:
            last_parts.append(
                store.layer_stats(run_id, kind="component", stat="grad_norm", step=steps[-1])
            )
    at_last = pd.concat(last_parts, ignore_index=True) if last_parts else at_init.iloc[0:0]
    built.append(
        charts.grad_by_layer_chart(
            at_last,
            step=int(at_last["step"].max()) if len(at_last) else 0,
            colors=colors,
            title="Gradient norm by layer at each run's last probe step",
        )
    )
    for run in runs:
        components = store.layer_stats(run["id"], kind="component", max_points=max_points)
        taps = store.layer_stats(run["id"], kind="tap", stat="rms", max_points=max_points)
        built += [
            charts.layer_heatmap(components, "grad_norm", "block"),
            charts.update_ratio_chart(components),
            charts.tap_stats_chart(taps, "rms"),
        ]
        _name_placeholders(built[-3:], run["name"])
    return [(chart_title(c), c, charts.chart_data(c)) for c in built]


def _name_placeholders(built: list[alt.TopLevelMixin], run_name: str) -> None:
    """An empty per-run chart has no run in its title; add it so titles stay distinct."""
    for chart in built:
        title = chart_title(chart)
        if run_name not in title:
            chart.title = f"{title} — {run_name}"


def _running_notes(runs: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence per run that had not finished when exported."""
    notes = []
    for run in runs:
        if run["status"] == "running":
            notes.append(
                f"run {run['name']} was still running at step {run['step'] or 0} when "
                "exported; this report holds what it had logged so far"
            )
        elif run["status"] == "queued":
            notes.append(f"run {run['name']} was queued and had not started when exported")
    return notes


def _configs(runs: Sequence[dict[str, Any]]) -> dict[str, cfg.RunConfig]:
    """Parsed configs by run name; a run whose config no longer parses is left out."""
    parsed: dict[str, cfg.RunConfig] = {}
    for run in runs:
        try:
            parsed[run["name"]] = cfg.RunConfig.from_dict(run["config"] or {})
        except cfg.ConfigError:
            continue
    return parsed


def config_diff_table(runs: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the fields whose values differ between the runs' configs."""
    configs = _configs(runs)
    names = list(configs)
    if len(names) < 2:
        return ["field", *names], []
    first = configs[names[0]]
    differing: dict[str, None] = {}
    for name in names[1:]:
        differing.update(dict.fromkeys(cfg.diff(first, configs[name])))
    rows = []
    for field_name in differing:
        section = cfg.section_of(field_name)
        values = [getattr(getattr(configs[n], section), field_name) for n in names]
        rows.append([field_name, *("auto" if v is None else str(v) for v in values)])
    return ["field", *names], rows


# ---------------------------------------------------------------------------------------
# The report


@cache
def _js_bundle() -> str:
    """Vega + Vega-Lite + vega-embed as one script (about 0.9 MB), built once per process."""
    bundle = vlc.javascript_bundle(vl_version=_vl_version())
    return bundle.replace("</script", "<\\/script")  # cannot end the inline <script> early


def _script_json(value: Any) -> str:
    """JSON safe to place inside an inline <script>."""
    return json.dumps(value, allow_nan=False).replace("</", "<\\/").replace("<!--", "<\\!--")


_REPORT_CSS = """
body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
table{border-collapse:collapse;margin:0.5rem 0 1.5rem}th,td{border-bottom:1px solid #ddd;
padding:0.25rem 0.6rem;text-align:left}th{border-bottom:2px solid #444}.note{background:#fff4d6;
padding:0.5rem 0.8rem;border-left:4px solid #e0a800}figure{margin:1.5rem 0}pre{background:#f6f6f6;
padding:0.6rem;white-space:pre-wrap}
"""


def report_html(
    runs: Sequence[dict[str, Any]],
    entries: Sequence[ChartEntry],
    metrics: pd.DataFrame,
    samples: dict[str, pd.DataFrame],
) -> str:
    """A self-contained HTML report: one inlined JS bundle, every chart interactive offline."""
    names = ", ".join(r["name"] for r in runs)
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in _running_notes(runs))
    run_rows = [
        [
            r["name"],
            r["status"] or "",
            f"{r['step'] or 0} / {r['max_steps'] or '?'}",
            r["device"] or "",
            _format_cell("n_params", r["n_params"]),
        ]
        for r in runs
    ]
    columns = _shown_columns(metrics)
    metric_rows = [[_format_cell(c, row[c]) for c in columns] for _, row in metrics.iterrows()]
    diff_headers, diff_rows = config_diff_table(runs)
    if diff_rows:
        diff_html = _html_table(diff_headers, diff_rows)
    elif len(runs) > 1:
        diff_html = "<p>The runs' configurations are identical.</p>"
    else:
        diff_html = "<p>One run: its whole configuration is in configs/.</p>"
    figures = "".join(
        f'<figure id="fig-{i}"><div id="chart-{i}"></div></figure>' for i in range(len(entries))
    )
    sample_html = ""
    for run_name, frame in samples.items():
        if frame.empty:
            sample_html += f"<h3>{html.escape(run_name)}</h3><p>No samples yet.</p>"
            continue
        newest = frame.iloc[0]
        sample_html += (
            f"<h3>{html.escape(run_name)} — step {int(newest['step'])}</h3>"
            f"<pre>{html.escape(str(newest['prompt']) + str(newest['text']))}</pre>"
        )
    specs = [chart_spec(chart) for _, chart, _ in entries]
    # Export menu only: the editor link would reach the network.
    embed_options = {
        "actions": {"export": True, "source": True, "compiled": False, "editor": False}
    }
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>blockviz report — {html.escape(names)}</title>
<style>{_REPORT_CSS}</style>
<script>{_js_bundle()}</script>
</head><body>
<h1>blockviz report</h1>
<p>Runs: {html.escape(names)}. Generated {html.escape(time.strftime("%Y-%m-%d %H:%M:%S"))}.</p>
{notes}
<h2>Runs</h2>
{_html_table(["run", "status", "step", "device", "params"], run_rows)}
<h2>Final metrics</h2>
{_html_table([spec.final_header(c) for c in columns], metric_rows)}
<h2>Configuration differences</h2>
{diff_html}
<h2>Charts</h2>
{figures}
<h2>Newest generated samples</h2>
{sample_html}
<script>
const specs = {_script_json(specs)};
const options = {_script_json(embed_options)};
specs.forEach((spec, i) => vegaEmbed("#chart-" + i, spec, options).catch(console.error));
</script>
</body></html>
"""


def _tidy_scalars(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[["run", "step", "name", "value"]]


def chart_stems(entries: Sequence[ChartEntry]) -> list[str]:
    """A distinct file-name stem per chart, from its title."""
    taken: set[str] = set()
    return [_unique(safe_filename(title, ""), taken) for title, _, _ in entries]


def _tidy_layer_stats(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns="run_id")


def report_files(
    store: RunStore,
    run_ids: Sequence[int | str],
    progress: Progress | None = None,
    entries: Sequence[ChartEntry] | None = None,
) -> dict[str, bytes]:
    """Every file of a report, by its path inside the zip (see `build_report`)."""
    report = progress or (lambda fraction, message: None)
    report(0.0, "reading runs")
    runs = _runs(store, run_ids)
    ids = [r["id"] for r in runs]
    entries = report_charts(store, ids) if entries is None else entries
    files: dict[str, bytes] = {}
    stems = chart_stems(entries)
    for index, ((title, chart, data), stem) in enumerate(zip(entries, stems, strict=True)):
        report(0.05 + 0.8 * index / max(1, len(entries)), f"rendering {title}")
        svg = chart_svg(chart)  # one Vega run serves both files (byte-identical PNG)
        files[f"charts/{stem}.png"] = svg_png(svg)
        files[f"charts/{stem}.svg"] = svg.encode("utf-8")
        files[f"charts/{stem}.csv"] = chart_csv(data).encode("utf-8")
    report(0.85, "writing data")
    config_names: set[str] = set()
    for run in runs:
        if run["config"] is None:
            continue  # a run created without a config has nothing to write
        name = _unique(safe_filename(run["name"], "json"), config_names)
        files[f"configs/{name}"] = json.dumps(run["config"], indent=2, sort_keys=True).encode()
    scalars = store.scalars(ids)
    files["scalars.csv"] = chart_csv(_tidy_scalars(scalars)).encode()
    for family in sorted(set(scalars["name"].str.split("/").str[0])):
        part = scalars[scalars["name"].str.split("/").str[0] == family]
        files[safe_filename(f"scalars_{family}", "csv")] = chart_csv(_tidy_scalars(part)).encode()
    layer_stats = store.layer_stats(ids)
    files["layer_stats.csv"] = chart_csv(_tidy_layer_stats(layer_stats)).encode()
    metrics = store.final_metrics(ids)
    for ext, text in zip(("csv", "md", "tex"), final_metrics_table(metrics), strict=True):
        files[f"final_metrics.{ext}"] = text.encode("utf-8")
    report(0.9, "writing report.html")
    samples = {r["name"]: store.samples(r["id"], limit=1) for r in runs}
    files["report.html"] = report_html(runs, entries, metrics, samples).encode("utf-8")
    files["README.txt"] = _readme(runs, files).encode("utf-8")
    report(1.0, "done")
    return files


_DESCRIPTIONS = {
    "charts/": "every chart as PNG (2x scale), SVG, and CSV of the exact data it draws",
    "configs/": "each run's RunConfig as JSON",
    "scalars": "every scalar of every run, not downsampled (run, step, name, value); "
    "scalars_<family>.csv holds one metric family",
    "layer_stats.csv": "per-layer statistics: gradients, updates, activations, attention",
    "final_metrics.": "the final-metrics table as CSV, Markdown and LaTeX (booktabs)",
    "report.html": "the report: interactive charts (work offline), config diff, samples",
    "README.txt": "this file",
}


def _readme(runs: Sequence[dict[str, Any]], files: dict[str, bytes]) -> str:
    """What the zip holds, grouped by kind, with the running-run notes up front."""
    lines = [
        "blockviz report",
        "runs: " + ", ".join(r["name"] for r in runs),
        f"exported: {time.strftime('%Y-%m-%d %H:%M:%S')}",
        *_running_notes(runs),
    ]
    names = [*sorted(files), "README.txt"]
    for prefix, description in _DESCRIPTIONS.items():
        group = [n for n in names if n.startswith(prefix)]
        if group:
            lines += ["", f"{prefix.rstrip('/.')}: {description}", *(f"  {n}" for n in group)]
    return "\n".join(lines) + "\n"


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, payload in files.items():
            archive.writestr(name, payload)
    return buffer.getvalue()


def build_report(
    store: RunStore, run_ids: Sequence[int | str], progress: Progress | None = None
) -> bytes:
    """A zip: charts/*.png|svg|csv, configs/*.json, scalars*.csv, layer_stats.csv,
    final_metrics.csv|md|tex, report.html and README.txt. `progress(fraction, message)`."""
    return _zip(report_files(store, run_ids, progress))


def report_name(runs: Sequence[dict[str, Any]]) -> str:
    """The report zip's file name, made from the run names."""
    return safe_filename("blockviz-report-" + "_".join(r["name"] for r in runs), "zip")


# ---------------------------------------------------------------------------------------
# Command line


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
    runs = _runs(store, run_ids)
    with OutFolder(out_dir) as out:
        # The folders first: a symlink in the way is refused before seconds of rendering.
        if fmt != "zip":
            out.folder("charts")
        if fmt == "all" and any(r["config"] is not None for r in runs):
            out.folder("configs")
        return _export(store, runs, out, fmt)


def _export(
    store: RunStore, runs: Sequence[dict[str, Any]], out: OutFolder, fmt: str
) -> list[Path]:
    """The writes of export_to_folder, into an opened (and checked) output folder."""
    ids = [r["id"] for r in runs]
    entries = report_charts(store, ids)
    stems = chart_stems(entries)
    written: list[Path] = []
    if fmt in ("zip", "all"):
        files = report_files(store, ids, entries=entries)
        written.append(out.write(report_name(runs), _zip(files)))
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
            "scalars.csv": _tidy_scalars(store.scalars(ids)),
            "layer_stats.csv": _tidy_layer_stats(store.layer_stats(ids)),
        }
        for name, frame in tables.items():
            written.append(out.write(name, chart_csv(frame)))
        metrics_csv = final_metrics_table(store.final_metrics(ids))[0]
        written.append(out.write("final_metrics.csv", metrics_csv))
    return written
