"""The ledger as one self-contained HTML page that opens with the network off.

Every card is plain HTML (the claim, its source, each seed set's verdict with its reason
and intervals, the replication, size, machine, date and re-run command), so the page reads
without any script. A claim judged across a swept field (learning-rate sensitivity, the
largest stable lr, the FFN's sweet spot) also gets its final-loss chart (the study page's
`swept_chart`: each seed's run a point, a line through the means over the seeds' spread),
drawn by Vega-Embed from the bundle vl-convert ships (`vl_convert.javascript_bundle`:
Vega, Vega-Lite and Vega-Embed with their dependencies, no import or URL to fetch),
inlined once, with each chart's data inlined in its spec. Nothing refers to the network:
no script or stylesheet source, no link. User text (claims, sources, reasons, names,
hosts) is escaped, never markup; the charts' specs sit in a JSON script element with
`<`, `>` and `&` escaped, so no text in them can close it.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from blockviz.core import ledger as ldg
from blockviz.views.ledger.text import set_label, verdict_word
from blockviz.views.studies.charts import swept_chart
from blockviz.views.studies.report import LOG_FIELDS

esc = html.escape
GROUP = "side"  # the chart's legend: which side of the claim a run is on
STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
    "color:#1a1a1a}"
    ".card{border:1px solid #ccc;border-radius:8px;padding:1em 1.2em;margin:1.2em 0}"
    ".card h2{font-size:1.15em;margin:0 0 .3em}"
    ".meta{color:#555;font-size:.9em;margin:.2em 0}"
    "table{border-collapse:collapse;width:100%;font-size:.88em;margin:.6em 0}"
    "td,th{border:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}"
    "code{background:#f3f3f3;padding:1px 4px;border-radius:3px;word-break:break-all}"
    ".v{font-weight:600;padding:1px 6px;border-radius:4px}"
    ".supported{background:#d9f2dc}.contradicted{background:#f7d6d6}"
    ".inconclusive{background:#eee}.pending{background:#fff1c7}.notrun{background:#e6e6f7}"
)


@functools.cache
def vega_bundle() -> str:
    """Vega-Embed with Vega and Vega-Lite (the version Altair writes specs for), as one
    script that defines `vegaEmbed` globally; built once per process (seconds)."""
    import vl_convert
    from altair.utils._importers import vl_version_for_vl_convert

    return vl_convert.javascript_bundle(vl_version=vl_version_for_vl_convert())


def chart_spec(measurement: ldg.Measurement) -> dict[str, Any] | None:
    """The final-loss-against-field chart of a swept claim's points (data inlined), or
    None for a claim with no swept field or no finished run."""
    field = measurement.field
    if not field or not measurement.points:
        return None
    frame = pd.DataFrame(
        {
            "run_id": range(len(measurement.points)),
            "seed": [p.seed for p in measurement.points],
            field: [p.x for p in measurement.points],
            "val_loss": [
                float("nan") if p.val_loss is None else p.val_loss for p in measurement.points
            ],
            "outcome": [p.outcome for p in measurement.points],
            GROUP: [p.group for p in measurement.points],
        }
    )
    chart = swept_chart(frame, field, log_x=field in LOG_FIELDS, by=[GROUP])
    return chart.to_dict()


def _verdict(word: str) -> str:
    kind = word.split(" ", 1)[0] if word else "inconclusive"
    kind = kind if kind in ("supported", "contradicted", "inconclusive", "pending") else "notrun"
    return f"<span class='v {kind}'>{esc(word)}</span>"


def _sets_table(measurement: ldg.Measurement) -> str:
    rows = "".join(
        "<tr>"
        f"<td>{esc(set_label(s))}</td>"
        f"<td>{_verdict(verdict_word(s))}<br>{esc(s.reason)}"
        + "".join(f"<br><small>{esc(line)}</small>" for line in s.intervals)
        + "".join(f"<br><small>{esc(line)}</small>" for line in s.sensitivity)
        + "</td>"
        f"<td>{s.runs}</td><td>{esc(s.machine())}</td><td>{esc(s.date or 'not recorded')}</td>"
        "</tr>"
        for s in measurement.sets
    )
    head = "<tr><th>Seed set</th><th>Verdict, why, intervals</th><th>Runs</th>"
    return f"<table>{head}<th>Machine</th><th>Date</th></tr>{rows}</table>"


def _measurement(measurement: ldg.Measurement, chart_id: str | None) -> str:
    rerun = (
        f"Re-run on fresh seeds: <code>{esc(measurement.rerun)}</code>"
        if measurement.rerun
        else "No command re-runs this definition (the built-in study changed since)."
    )
    chart = f"<div class='chart' id='{chart_id}'></div>" if chart_id else ""
    return (
        f"<p class='meta'>Size <b>{esc(measurement.size)}</b>, grid "
        f"{esc(measurement.grid())}, measured in "
        f"{esc(measurement.origin.text())}. Replication: {_verdict(measurement.replication)} "
        f"{esc(measurement.replication_reason)}</p>"
        f"{_sets_table(measurement)}<p class='meta'>{rerun}</p>{chart}"
    )


def _card(entry: ldg.Entry, charts: list[tuple[str, dict[str, Any]]]) -> str:
    parts = [
        f"<section class='card' id='{esc(entry.id)}'>",
        f"<h2>{esc(entry.claim)}</h2>",
        f"<p class='meta'><b>Source:</b> {esc(entry.source)}</p>",
        f"<p class='meta'><b>Study:</b> <code>{esc(entry.study_key)}</code> "
        f"({esc(entry.study_title)}), rule <code>{esc(entry.rule)}</code>; claim "
        f"<code>{esc(entry.id)}</code></p>",
    ]
    if not entry.measurements:
        parts.append(
            f"<p>{_verdict(ldg.NOT_RUN)} Run it with <code>{esc(entry.run_command)}</code></p>"
        )
    for measurement in entry.measurements:
        spec = chart_spec(measurement)
        chart_id = None
        if spec is not None:
            chart_id = f"chart-{len(charts)}"
            charts.append((chart_id, spec))
        parts.append(_measurement(measurement, chart_id))
    parts.append("</section>")
    return "".join(parts)


def _script_json(value: Any) -> str:
    """JSON that cannot end the script element it sits in."""
    text = json.dumps(value, allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def ledger_html(ledger: ldg.Ledger, entries: Sequence[ldg.Entry] | None = None) -> str:
    """The whole page: a header, one card per claim, the charts drawn offline."""
    shown = ledger.entries if entries is None else entries
    charts: list[tuple[str, dict[str, Any]]] = []
    cards = "".join(_card(entry, charts) for entry in shown)
    measured = sum(1 for e in shown if e.measurements)
    header = (
        "<h1>blockviz claim ledger</h1>"
        f"<p class='meta'>Exported {esc(ledger.exported)} from {esc(ledger.origin.text())}: "
        f"{len(shown)} claims, {measured} measured. Each verdict is computed from the runs "
        "by the rule its study names; a seed set is judged on its own runs, and a claim is "
        "replicated when a disjoint seed set gives the same verdict.</p>"
    )
    script = ""
    if charts:
        specs = _script_json([{"id": chart_id, "spec": spec} for chart_id, spec in charts])
        script = (
            f"<script>{vega_bundle()}</script>"
            f"<script type='application/json' id='ledger-charts'>{specs}</script>"
            "<script>for (const c of JSON.parse(document.getElementById('ledger-charts')"
            ".textContent)) { vegaEmbed('#' + c.id, c.spec, {actions: false, renderer: "
            "'svg'}).catch(console.error); }</script>"
        )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<title>blockviz claim ledger</title>"
        f"<style>{STYLE}</style></head><body>{header}{cards}{script}</body></html>\n"
    )
