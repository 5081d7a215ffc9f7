"""docs/findings.md's induction-runs table, generated from the committed results of
benchmarks/induction_runs.py (never typed).

One row per run, the runs the thresholds were chosen on first, then the held-out runs they
are judged on: the text and size, each run's largest prefix score with its standard error,
the finding at the end, whether the step it named held still at every probe after it first
formed, whether the model copies in context (its repeat-loss gain at the end,
benchmarks/induction_runs.py's COPIES_GAIN) and whether the finding agrees; then the
held-out hit and false-alarm counts. `blockviz.cli.docs` writes it between
`<!-- induction-runs -->` and `<!-- /induction-runs -->`, and its test fails when the
table is stale. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

HEADER = (
    "| Set | Run | Steps, probes (rows) | Largest prefix score ± SE (head, step; its entropy) "
    "| Loss | Copies in context (repeat gain at the end) | What the rule says at the end "
    "| Step named after each probe | Verdict |"
)


def _cell(text: object) -> str:
    """Text safe in a Markdown table cell: one line, pipes and brackets escaped."""
    flat = " ".join(str(text).split())
    return flat.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def _largest(heads: Sequence[Mapping[str, Any]]) -> str:
    top = max(heads, key=lambda h: h["largest"])
    return (
        f"{_num(top['largest'])} ± {_num(top['se'], 2)} (block {top['layer']} head "
        f"{top['head']}, step {top['at']:,}; {_num(top['entropy'], 2)} nats); at the end "
        f"{_num(top['final'])} ± {_num(top['final_se'], 2)}"
    )


def _held(row: Mapping[str, Any]) -> str:
    named = row["named_steps"]
    if not named:
        return "none formed at any probe"
    steps = ", ".join(f"{step:,}" for step in named)
    lapses = row["probes_saying_none_after_formation"]
    said = f"; {lapses} said none" if lapses else ""
    return f"{steps} at all {row['probes_after_first_formation']} probes from the first{said}"


def _loss(row: Mapping[str, Any]) -> str:
    val = f", val {_num(row['val'], 4)}" if row.get("val") is not None else ""
    return f"train (last 50) {_num(row['train_last50'], 4)}{val}"


def _copies(row: Mapping[str, Any]) -> str:
    gain = (
        f"{_num(row['repeat_gain_end'], 2)} nats" if row.get("repeat_gain_end") is not None else "—"
    )
    return f"{'yes' if row['copies'] else 'no'} ({gain})"


def _run_cell(row: Mapping[str, Any]) -> str:
    lr = f", lr {row['lr']:g}" if row.get("lr", 1e-3) != 1e-3 else ""
    return f"{row['text']}, ctx {row['ctx']}, seed {row['seed']}{lr}"


def _counts(rows: Sequence[Mapping[str, Any]]) -> str:
    held = [r for r in rows if r["set"] == "held-out"]
    positives = [r for r in held if r["copies"]]
    negatives = [r for r in held if not r["copies"]]
    hits = sum(r["verdict"] == "hit" for r in positives)
    alarms = sum(r["verdict"] == "false alarm" for r in negatives)
    moved = sum(len(r["named_steps"]) > 1 or r["probes_saying_none_after_formation"] for r in rows)
    return (
        f"Held out: formed in **{hits} of {len(positives)}** runs whose model copies in "
        f"context; a false alarm in **{alarms} of {len(negatives)}** runs whose model does "
        f"not. The step named moved or lapsed in {moved} of {len(rows)} runs."
    )


def table(results: Mapping[str, Any], source: str) -> str:
    """The Markdown table of every run in `results` (benchmarks/induction_runs.py's JSON)."""
    machine = results["machine"]
    rows = sorted(results["runs"], key=lambda r: r["set"] != "chosen")
    lines = [
        f"Generated from `{source}` ({'; '.join(f'`{_cell(c)}`' for c in results['commands'])}; "
        f"{_cell(machine.get('cpu_model', machine.get('cpu', '')))}, "
        f"{machine.get('cpu_count', '?')} cores, {results.get('threads', 1)} thread a run, "
        f"{_cell(machine.get('date', ''))}) by "
        "`.venv/bin/python -m blockviz.cli.docs`.",
        "",
        HEADER,
        "|" + " --- |" * HEADER.count(" | ") + " --- |",
    ]
    for row in rows:
        cells = [
            row["set"],
            _run_cell(row),
            f"{row['steps']:,}, every {row['probe']} ({row['rows']} rows)",
            _largest(row["heads"]),
            _loss(row),
            _copies(row),
            f"**{row['finding']['title']}**: {row['finding']['text']}",
            _held(row),
            row["verdict"],
        ]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    lines += ["", _counts(rows)]
    return "\n".join(lines) + "\n"
