"""docs/studies.md's claims table, generated from a committed ledger export (never typed).

One row per claim of today's built-in studies, in their order: the measurements the export
holds for it (each seed set's verdict with its intervals, the replication, size, machine,
date) and the command that re-runs it; a claim the export has not measured says "not run
here yet" with the command that runs it. `blockviz.cli.docs` writes it between
`<!-- ledger -->` and `<!-- /ledger -->`, and its test fails when the table is stale.
"""

from __future__ import annotations

from blockviz.core import ledger as ldg
from blockviz.core.studies import builtins
from blockviz.core.studies.define import seeds_text
from blockviz.views.ledger.text import verdict_word

NOT_RUN_HERE = "not run here yet"


def _cell(text: object) -> str:
    """Text safe in a Markdown table cell: one line, pipes and brackets escaped."""
    flat = " ".join(str(text).split())
    return flat.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def _measured(measurement: ldg.Measurement) -> str:
    sets = "<br>".join(
        f"seeds {seeds_text(s.seeds)}: **{_cell(verdict_word(s))}**"
        + "".join(f"; {_cell(line)}" for line in s.intervals)
        for s in measurement.sets
    )
    return f"{sets}<br>replication: **{_cell(measurement.replication)}**"


def _where(measurement: ldg.Measurement) -> str:
    dates = sorted({s.date for s in measurement.sets if s.date})
    machines = sorted({s.machine() for s in measurement.sets})
    return _cell(
        f"{measurement.size}; {'; '.join(machines)}; {', '.join(dates) or 'date not recorded'}"
    )


def table(ledger: ldg.Ledger, source: str) -> str:
    """The Markdown table of every built-in claim as the export `source` measured it."""
    held = {(e.study_key, e.claim): e for e in ledger.entries}
    lines = [
        f"Generated from `{source}` (exported {ledger.exported} from "
        f"{_cell(ledger.origin.text())}) by `.venv/bin/python -m blockviz.cli.docs`.",
        "",
        "| Claim | Source | Verdict per seed set (intervals) | Size; machine; date | Re-run |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key in builtins.STUDY_KEYS:
        study = builtins.BUILTINS[key]()
        for index, claim in enumerate(study.claims):
            entry = held.get((key, claim.text))
            name = f"{_cell(claim.text)} ({_code(ldg.claim_id(key, index))})"
            measurements = entry.measurements if entry else ()
            if not measurements:
                command = entry.run_command if entry else f"study run {key} --size quick"
                lines.append(
                    f"| {name} | {_cell(claim.source)} | {NOT_RUN_HERE} | — | {_code(command)} |"
                )
            for m in measurements:
                rerun = _code(m.rerun) if m.rerun else "none (the built-in changed since)"
                lines.append(
                    f"| {name} | {_cell(claim.source)} | {_measured(m)} | {_where(m)} | {rerun} |"
                )
    return "\n".join(lines) + "\n"
