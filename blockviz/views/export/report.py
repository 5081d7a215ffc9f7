"""What a report holds and the report itself: charts, tables, configs, attention maps,
generated samples, one HTML page, a zip."""

from __future__ import annotations

import html
import io
import json
import stat
import time
import zipfile
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import altair as alt
import pandas as pd
import vl_convert as vlc

from blockviz.core import config as cfg
from blockviz.core import spec
from blockviz.core.fields import ConfigError
from blockviz.core.tags import tags_text
from blockviz.store import RunRecord, RunStore
from blockviz.views import charts, run_facts
from blockviz.views.export.ablation import (
    final_metrics_table,
    format_cell,
    html_table,
    shown_columns,
)
from blockviz.views.export.outfolder import ExportError, safe_filename, unique_name
from blockviz.views.export.render import (
    chart_csv,
    chart_spec,
    chart_svg,
    chart_title,
    svg_png,
    vl_version,
)
from blockviz.views.export.report_extras import attention_charts, sample_files, samples_html
from blockviz.views.run_findings import findings_table, read_findings
from blockviz.views.studies.table import table_markdown

Progress = Callable[[float, str], None]
ChartEntry = tuple[str, alt.TopLevelMixin, pd.DataFrame]
REPORT_MAX_POINTS = 2000  # per series in report charts; the CSVs are never downsampled


def selected_runs(store: RunStore, run_ids: Sequence[int | str]) -> list[RunRecord]:
    """The selected runs' rows (config parsed), in the order given, without repeats."""
    ids = list(dict.fromkeys(store.resolve(r) for r in run_ids))
    if not ids:
        raise ExportError("no runs selected; name at least one run id or name")
    return [store.get_run(i) for i in ids]


def report_charts(
    store: RunStore, run_ids: Sequence[int | str], max_points: int = REPORT_MAX_POINTS
) -> list[ChartEntry]:
    """The charts of a report as (title, chart, data): comparisons first, then per run,
    then each run's attention maps at its latest recorded step (report_extras)."""
    runs = selected_runs(store, run_ids)
    ids = [r.id for r in runs]
    depths = {r.id: m.n_layer for r in runs if (m := run_facts.stored_model_config(r))}
    colors = charts.run_color_scale({r.id: r.name for r in runs})
    diverged = {r.name: r.diverged_step for r in runs if r.diverged_step is not None}
    scalars = store.scalars(ids, max_points=max_points)
    built: list[alt.TopLevelMixin] = [
        # A diverged run's spike would flatten every other curve on a linear axis.
        charts.loss_chart(
            scalars, colors=colors, diverged=diverged, log_scale=bool(diverged), title="Loss"
        ),
        charts.metric_chart(scalars, spec.VAL_LOSS, colors=colors, title="Validation loss"),
        charts.metric_chart(scalars, spec.TRAIN_LR, colors=colors, title="Learning rate"),
        charts.metric_chart(
            scalars,
            spec.TRAIN_GRAD_NORM,
            smoothing=0.6,
            log_scale=True,
            colors=colors,
            title="Global gradient norm (before clipping)",
            diverged=diverged,
        ),
        charts.metric_chart(scalars, spec.TRAIN_TOKENS_PER_SEC, colors=colors, title="Throughput"),
    ]
    if spec.VAL_ANSWER_ACC in set(scalars["name"]):
        built.append(
            charts.metric_chart(
                scalars, spec.VAL_ANSWER_ACC, colors=colors, title="Answer accuracy"
            )
        )
    at_init = store.layer_stats(ids, kind="component", stat=spec.GRAD_NORM, step=0)
    built.append(charts.grad_by_layer_chart(at_init, step=0, colors=colors, n_layers=depths))
    last_parts = []
    for run_id in ids:
        steps = store.layer_steps(run_id, kind="component")
        if steps:
            last_parts.append(
                store.layer_stats(run_id, kind="component", stat=spec.GRAD_NORM, step=steps[-1])
            )
    at_last = pd.concat(last_parts, ignore_index=True) if last_parts else at_init.iloc[0:0]
    built.append(
        charts.grad_by_layer_chart(
            at_last,
            step=int(at_last["step"].max()) if len(at_last) else 0,
            colors=colors,
            title="Gradient norm by layer at each run's last probe step",
            n_layers=depths,
        )
    )
    for run in runs:
        components = store.layer_stats(run.id, kind="component", max_points=max_points)
        taps = store.layer_stats(run.id, kind="tap", stat=spec.RMS, max_points=max_points)
        n_layer = depths.get(run.id)
        built += [
            charts.layer_heatmap(components, spec.GRAD_NORM, "block", n_layers=n_layer),
            charts.update_ratio_chart(components, n_layers=n_layer),
            charts.tap_stats_chart(taps, spec.RMS, n_layers=n_layer),
        ]
        _name_placeholders(built[-3:], run.name)
    built += attention_charts(store, runs)
    return [(chart_title(c), c, charts.chart_data(c)) for c in built]


def _name_placeholders(built: list[alt.TopLevelMixin], run_name: str) -> None:
    """An empty per-run chart has no run in its title; add it so titles stay distinct."""
    for chart in built:
        title = chart_title(chart)
        if run_name not in title:
            chart.title = f"{title} — {run_name}"


def _running_notes(runs: Sequence[RunRecord]) -> list[str]:
    """One sentence per run that had not finished when exported."""
    notes = []
    for run in runs:
        if run.status == "running":
            notes.append(
                f"run {run.name} was still running at step {run.step or 0} when "
                "exported; this report holds what it had logged so far"
            )
        elif run.status == "queued":
            notes.append(f"run {run.name} was queued and had not started when exported")
    return notes


def _configs(runs: Sequence[RunRecord]) -> dict[str, cfg.RunConfig]:
    """Parsed configs by run name; a run whose config no longer parses is left out."""
    parsed: dict[str, cfg.RunConfig] = {}
    for run in runs:
        try:
            parsed[run.name] = cfg.RunConfig.from_dict(run.config or {})
        except ConfigError:
            continue
    return parsed


def config_diff_table(runs: Sequence[RunRecord]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the fields whose values differ between the runs' configs, then
    the runs' tags and notes where those differ (LABEL_ROWS)."""
    configs = _configs(runs)
    names = list(configs)
    by_name = {r.name: r for r in runs}
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
    return ["field", *names], rows + label_rows([by_name[n] for n in names])


LABEL_ROWS = ("tags", "notes")  # rows of config_diff_table that are not config fields


def label_rows(runs: Sequence[RunRecord]) -> list[list[str]]:
    """A 'tags' and a 'notes' row, each only when the runs' values differ."""
    values = {
        "tags": [tags_text(r.tags) for r in runs],
        "notes": [r.notes or "" for r in runs],
    }
    return [[label, *shown] for label, shown in values.items() if len(set(shown)) > 1]


# ---------------------------------------------------------------------------------------
# The report


@cache
def _js_bundle() -> str:
    """Vega + Vega-Lite + vega-embed as one script (about 0.9 MB), built once per process."""
    bundle = vlc.javascript_bundle(vl_version=vl_version())
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


def _findings_html(findings: pd.DataFrame | None) -> str:
    """The findings section's table: run, what it found (title), the sentences, what to try."""
    if findings is None or findings.empty:
        return "<p>No findings (no run has logged a loss yet).</p>"
    rows = [
        [str(r.run), str(r.severity), str(r.title), str(r.text), str(r.suggestion)]
        for r in findings.itertuples(index=False)
    ]
    return html_table(["run", "severity", "finding", "evidence", "try"], rows)


def report_html(
    runs: Sequence[RunRecord],
    entries: Sequence[ChartEntry],
    metrics: pd.DataFrame,
    samples: dict[str, pd.DataFrame],
    findings: pd.DataFrame | None = None,
) -> str:
    """A self-contained HTML report: one inlined JS bundle, every chart interactive offline."""
    names = ", ".join(r.name for r in runs)
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in _running_notes(runs))
    run_rows = [
        [
            r.name,
            r.status or "",
            f"{r.step or 0} / {r.max_steps or '?'}",
            r.device or "",
            format_cell("n_params", r.n_params),
            tags_text(r.tags),
        ]
        for r in runs
    ]
    run_notes = "".join(
        f"<h3>{html.escape(r.name)}</h3><pre>{html.escape(r.notes)}</pre>" for r in runs if r.notes
    )
    columns = shown_columns(metrics)
    metric_rows = [[format_cell(c, row[c]) for c in columns] for _, row in metrics.iterrows()]
    diff_headers, diff_rows = config_diff_table(runs)
    if diff_rows:
        diff_html = html_table(diff_headers, diff_rows)
        if all(row[0] in LABEL_ROWS for row in diff_rows):
            diff_html = "<p>The runs' configurations are identical.</p>" + diff_html
    elif len(runs) > 1:
        diff_html = "<p>The runs' configurations are identical.</p>"
    else:
        diff_html = "<p>One run: its whole configuration is in configs/.</p>"
    figures = "".join(
        f'<figure id="fig-{i}"><div id="chart-{i}"></div></figure>' for i in range(len(entries))
    )
    sample_html = samples_html(samples)
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
{html_table(["run", "status", "step", "device", "params", "tags"], run_rows)}
{"<h2>Notes</h2>" + run_notes if run_notes else ""}
<h2>Final metrics</h2>
{html_table([spec.final_header(c) for c in columns], metric_rows)}
<h2>Findings</h2>
<p>What each run's stored series show, by the documented rules of blockviz's findings
(docs/findings.md); a suggestion names its source, a paper or "a rule of thumb", then
whether it helped in a run of blockviz's own or is untested there.</p>
{_findings_html(findings)}
<h2>Configuration differences</h2>
{diff_html}
<h2>Charts</h2>
{figures}
<h2>Generated samples</h2>
{sample_html}
<script>
const specs = {_script_json(specs)};
const options = {_script_json(embed_options)};
specs.forEach((spec, i) => vegaEmbed("#chart-" + i, spec, options).catch(console.error));
</script>
</body></html>
"""


def tidy_scalars(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[["run", "step", "name", "value"]]


def chart_stems(entries: Sequence[ChartEntry]) -> list[str]:
    """A distinct file-name stem per chart, from its title."""
    taken: set[str] = set()
    return [unique_name(safe_filename(title, ""), taken) for title, _, _ in entries]


def tidy_layer_stats(frame: pd.DataFrame) -> pd.DataFrame:
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
    runs = selected_runs(store, run_ids)
    ids = [r.id for r in runs]
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
        if run.config is None:
            continue  # a run created without a config has nothing to write
        name = unique_name(safe_filename(run.name, "json"), config_names)
        files[f"configs/{name}"] = json.dumps(run.config, indent=2, sort_keys=True).encode()
    scalars = store.scalars(ids)
    files["scalars.csv"] = chart_csv(tidy_scalars(scalars)).encode()
    for family in sorted(set(scalars["name"].str.split("/").str[0])):
        part = scalars[scalars["name"].str.split("/").str[0] == family]
        files[safe_filename(f"scalars_{family}", "csv")] = chart_csv(tidy_scalars(part)).encode()
    layer_stats = store.layer_stats(ids)
    files["layer_stats.csv"] = chart_csv(tidy_layer_stats(layer_stats)).encode()
    metrics = store.final_metrics(ids)
    for ext, text in zip(("csv", "md", "tex"), final_metrics_table(metrics), strict=True):
        files[f"final_metrics.{ext}"] = text.encode("utf-8")
    findings = findings_table([(r.name, read_findings(store, r)) for r in runs])
    files["findings.csv"] = findings.to_csv(index=False).encode("utf-8")
    files["findings.md"] = table_markdown(findings).encode("utf-8")
    report(0.9, "writing report.html")
    sample_texts, samples = sample_files(store, runs)
    files.update(sample_texts)
    html_text = report_html(runs, entries, metrics, samples, findings)
    files["report.html"] = html_text.encode("utf-8")
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
    "findings.": "each run's findings (headline, warnings, evidence, what to try): CSV, Markdown",
    "samples/": "every generated sample of each run, oldest first, with its step and prompt",
    "report.html": "the report: interactive charts (work offline), config diff, samples",
    "README.txt": "this file",
}


def _readme(runs: Sequence[RunRecord], files: dict[str, bytes]) -> str:
    """What the zip holds, grouped by kind, with the running-run notes up front."""
    lines = [
        "blockviz report",
        "runs: " + ", ".join(r.name for r in runs),
        f"exported: {time.strftime('%Y-%m-%d %H:%M:%S')}",
        *_running_notes(runs),
    ]
    names = [*sorted(files), "README.txt"]
    for prefix, description in _DESCRIPTIONS.items():
        group = [n for n in names if n.startswith(prefix)]
        if group:
            lines += ["", f"{prefix.rstrip('/.')}: {description}", *(f"  {n}" for n in group)]
    return "\n".join(lines) + "\n"


ENTRY_MODE = stat.S_IFREG | 0o644  # -rw-r--r--: writestr(name) alone gives 0600


def zip_bytes(files: dict[str, bytes]) -> bytes:
    """A deflated zip of {name: bytes}, whose entries unpack readable by everyone."""
    buffer = io.BytesIO()
    now = time.localtime()[:6]
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, payload in files.items():
            entry = zipfile.ZipInfo(name, date_time=now)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.create_system = 3  # Unix: unzip reads the mode below only then
            entry.external_attr = ENTRY_MODE << 16
            archive.writestr(entry, payload)
    return buffer.getvalue()


def build_report(
    store: RunStore, run_ids: Sequence[int | str], progress: Progress | None = None
) -> bytes:
    """A zip: charts/*.png|svg|csv (attention maps included), configs/*.json,
    samples/*.txt, scalars*.csv, layer_stats.csv, final_metrics.csv|md|tex, report.html
    and README.txt. `progress(fraction, message)`."""
    return zip_bytes(report_files(store, run_ids, progress))


def report_name(names: Sequence[str]) -> str:
    """The report zip's file name, made from the run names."""
    return safe_filename("blockviz-report-" + "_".join(names), "zip")
