"""A study's zip: its results table, charts, configs, claims with verdicts and an HTML page.

results.csv | .md | .tex   the per-variant table (study_table.results_table)
runs.csv                   one row per run: variant, seed, outcome, losses, swept values,
                           and its findings (headline and warnings)
claims.md                  each claim, its source, the verdict, the reason, both
                           intervals (paired by seed and unpaired) and the numbers
charts/*.png | .svg        loss curves by variant, final loss against each swept value
                           (the init-gradients study: its two figures)
configs/<variant>.json     each variant's config (seed 1)
index.html                 self-contained: question, claims, table, charts as inline SVG
README.txt                 what the zip holds
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable
from typing import Any

import altair as alt
import pandas as pd

from blockviz.core import spec
from blockviz.core.studies.define import StudyDef, plan_from_spec
from blockviz.core.studies.outcomes import results_frame
from blockviz.core.studies.rules.base import Verdict
from blockviz.core.studies.summary import summarize
from blockviz.core.studies.verdicts import verdicts
from blockviz.store import RunStore, StudyRecord
from blockviz.store.studies import INIT_GRADS_FILE
from blockviz.views import charts
from blockviz.views.export.outfolder import safe_filename
from blockviz.views.export.render import chart_png, chart_svg
from blockviz.views.export.report import zip_bytes
from blockviz.views.run_findings import findings_column
from blockviz.views.studies import charts as study_charts
from blockviz.views.studies import table as study_table
from blockviz.views.studies.text import json_safe

Progress = Callable[[float, str], None]
LOG_FIELDS = ("lr", "min_lr", "weight_decay", "dropout")  # swept on a log axis
MAX_RESULT_BYTES = 20 * 1024 * 1024


def zip_name(study: StudyRecord) -> str:
    """`blockviz-study-<id>-<name>.zip`, safe on every file system."""
    return safe_filename(f"blockviz-study-{study.id}-{study.name}", "zip")


def swept_charts(results: pd.DataFrame, plan: StudyDef) -> list[tuple[str, alt.TopLevelMixin]]:
    """Final val loss against each numeric swept field with two or more values, a line per
    combination of the other swept fields that vary (Post-LN with and without warm-up are
    two lines, never one mean through both)."""
    out = []
    for field in plan.swept:
        if field not in results.columns or results[field].nunique() < 2:
            continue
        values = results[field]
        if values.dtype == bool or not pd.api.types.is_numeric_dtype(values):
            continue
        others = [f for f in plan.swept if f != field and f in results.columns]
        by = [f for f in others if results[f].nunique() > 1]
        out.append(
            (
                f"final-loss-vs-{field}",
                study_charts.swept_chart(results, field, log_x=field in LOG_FIELDS, by=by),
            )
        )
    return out


def result_charts(
    scalars: pd.DataFrame, results: pd.DataFrame, plan: StudyDef
) -> list[tuple[str, alt.TopLevelMixin]]:
    """A training study's charts, (file stem, chart), as the page shows them and the zip
    holds them: val loss by variant, then final loss against each swept value."""
    curves = study_charts.curves_chart(scalars, results, plan.swept)
    return [("val-loss-by-variant", curves), *swept_charts(results, plan)]


def read_init_grads(store: RunStore, study_id: int) -> dict[str, Any] | None:
    """The init-gradients study's result, or None when it is not there (or not readable)."""
    path = store.study_dir(study_id) / INIT_GRADS_FILE
    if not path.is_file() or path.stat().st_size > MAX_RESULT_BYTES:
        return None
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and "rows" in result else None


def _claims_md(plan: StudyDef, judged: list[Verdict], note: str | None = None) -> str:
    lines = [f"# {plan.title}", "", f"Question: {plan.question}", ""]
    for verdict in judged:
        lines += [
            f"## {verdict.verdict.upper()}: {verdict.claim.text}",
            f"Source: {verdict.claim.source}",
            f"Rule: {verdict.claim.rule} {json.dumps(dict(verdict.claim.args))}",
            f"Why: {verdict.reason}",
            *(f"Intervals: {line}" for line in study_table.interval_lines(verdict)),
            "Numbers: " + json.dumps({k: json_safe(v) for k, v in dict(verdict.numbers).items()}),
            "",
        ]
    if not judged:
        lines.append("This study tests no claim: it measures.")
    if note:
        lines += ["", f"Note: {note}"]
    return "\n".join(lines) + "\n"


def study_files(
    store: RunStore, study_id: int, progress: Progress | None = None
) -> dict[str, bytes]:
    """Every file of the study's zip, by name."""
    say = progress or (lambda fraction, message: None)
    study = store.get_study(study_id)
    plan = plan_from_spec(study.spec)
    files: dict[str, bytes] = {}
    built: list[tuple[str, alt.TopLevelMixin]] = []
    judged: list[Verdict] = []
    table = pd.DataFrame()
    note = None
    if plan.trains:
        runs = store.study_runs(study_id)
        results = results_frame(runs, plan)
        table = study_table.results_table(summarize(results), plan.baseline)
        judged = verdicts(plan, results)
        note = study_table.scoring_note(results)
        files["results.csv"] = table.to_csv(index=False).encode()
        files["results.md"] = study_table.table_markdown(table).encode()
        files["results.tex"] = study_table.table_latex(table).encode()
        found = results.assign(findings=findings_column(store, results["run_id"].tolist()))
        files["runs.csv"] = found.to_csv(index=False).encode()
        sensitivity = study_table.sensitivity_display(results, plan.swept)
        if sensitivity is not None:
            files["sensitivity.csv"] = sensitivity.to_csv(index=False).encode()
            files["sensitivity.md"] = (
                study_table.table_markdown(sensitivity) + "\n" + study_table.SENSITIVITY_NOTE + "\n"
            ).encode()
        scalars = store.scalars([int(i) for i in results["run_id"]], names=spec.VAL_LOSS)
        built += result_charts(scalars, results, plan)
    else:
        result = read_init_grads(store, study_id)
        if result is not None:
            rows, summary = pd.DataFrame(result["rows"]), pd.DataFrame(result["summary"])
            built.append(("init-grad-ratio", charts.init_grad_ratio_chart(summary)))
            built.append(("init-grad-by-block", charts.init_grad_profile_chart(rows)))
            files["init_grads.json"] = json.dumps(result).encode()
    files["claims.md"] = _claims_md(plan, judged, note).encode()
    for label in dict.fromkeys(v.label for v in plan.variants):
        files[f"configs/{safe_filename(label, 'json')}"] = (
            plan.config_for(label, plan.seeds[0]).to_json().encode()
        )
    svgs = []
    for index, (stem, chart) in enumerate(built):
        say(index / max(len(built), 1), f"rendering {stem}")
        svg = chart_svg(chart)
        files[f"charts/{stem}.svg"] = svg.encode()
        files[f"charts/{stem}.png"] = chart_png(chart)
        svgs.append(svg)
    files["index.html"] = _html(study, plan, judged, table, svgs).encode()
    files["README.txt"] = _readme(study, files).encode()
    say(1.0, "done")
    return files


def build_study_zip(store: RunStore, study_id: int, progress: Progress | None = None) -> bytes:
    """The study's zip as bytes (`study_files`, zipped)."""
    return zip_bytes(study_files(store, study_id, progress))


def _html(
    study: StudyRecord,
    plan: StudyDef,
    judged: list[Verdict],
    table: pd.DataFrame,
    svgs: list[str],
) -> str:
    esc = html.escape
    claims = "".join(
        f"<li><b>{esc(v.verdict)}</b>: {esc(v.claim.text)} <i>({esc(v.claim.source)})</i>"
        f"<br>{esc(v.reason)}"
        + "".join(f"<br><small>{esc(line)}</small>" for line in study_table.interval_lines(v))
        + "</li>"
        for v in judged
    )
    body = [
        f"<h1>{esc(plan.title)}</h1>",
        f"<p>Study #{int(study.id)} “{esc(str(study.name))}”, size {esc(plan.size)}, "
        f"seeds {esc(', '.join(map(str, plan.seeds)))}.</p>",
        f"<p><b>Question.</b> {esc(plan.question)}</p>",
        f"<h2>Claims and verdicts</h2><ul>{claims}</ul>" if judged else "",
        "<h2>Results</h2>" + study_table.table_html(table) if not table.empty else "",
        # vl-convert's SVG is generated from our own chart specs, never from user text
        # alone; run and variant names inside it are escaped by the SVG writer.
        "".join(f"<div>{svg}</div>" for svg in svgs),
    ]
    style = (
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(plan.title)}</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
    )


def _readme(study: StudyRecord, files: dict[str, bytes]) -> str:
    lines = [
        f"blockviz study #{study.id}: {study.name} ({study.key}, {study.size})",
        f"exported: {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
        *(f"  {name}" for name in sorted([*files, "README.txt"])),
    ]
    return "\n".join(lines) + "\n"
