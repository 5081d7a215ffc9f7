"""docs/findings.md's calibration and remedies tables, generated from the committed results
of benchmarks/findings_calibration.py (never typed).

The calibration table gives each rule (but the induction-head timeline, calibrated on its own
runs) its false alarms on the held-out healthy runs and its hits on the held-out runs built
to show its problem, as counts; a rule with no such run says n = 0, and one past one false
alarm in 20 healthy runs says so. The remedies table gives what each suggestion did on a
held-out run. `blockviz.cli.docs` writes them between `<!-- calibration -->` and
`<!-- /calibration -->`, `<!-- remedies -->` and `<!-- /remedies -->`; its test fails when
either is stale.
"""

from __future__ import annotations

import json
from typing import Any

from blockviz.core.findings import RULES
from blockviz.core.findings.suggestions import EVIDENCE, SUGGESTS, UNTESTED

# Calibrated elsewhere (docs/findings.md, "Induction heads"): not judged by these runs.
NOT_HERE = ("induction_heads",)
# The false-alarm bound a rule is held to: at most one in this many healthy runs.
PER_HEALTHY = 20
SCRIPT = "benchmarks/findings_calibration.py"


def _cell(text: object) -> str:
    """Text safe in a Markdown table cell: one line, pipes and brackets escaped."""
    flat = " ".join(str(text).split())
    return flat.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _runs(labels: list[str]) -> str:
    return ", ".join(f"`{_cell(label)}`" for label in labels)


def _false_alarms(row: dict[str, Any]) -> str:
    alarms, healthy = len(row["false_alarms"]), row["healthy_runs"]
    text = f"{alarms} of {healthy}"
    if alarms:
        text += f" ({_runs(row['false_alarms'])})"
    if alarms * PER_HEALTHY > healthy:
        text += f"; **more than 1 in {PER_HEALTHY}**"
    elif healthy < PER_HEALTHY:
        text += f"; too few healthy runs to show 1 in {PER_HEALTHY}"
    return text


def _hits(row: dict[str, Any]) -> str:
    built = row["broken_runs"]
    if not built:
        return "no held-out run shows its problem (n = 0)"
    text = f"{len(row['hits'])} of {built}"
    if row["missed"]:
        text += f"; missed {_runs(row['missed'])}"
    return text


def calibration_table(results: dict[str, Any]) -> str:
    """The Markdown table of every rule's false alarms and hits on the held-out runs."""
    lines = [
        f"Generated from `{SCRIPT}`'s results ({_cell(results['machine'])}, "
        f"{results['date']}, load average {results['load_average']}) by "
        "`.venv/bin/python -m blockviz.cli.docs`. Healthy: "
        f"{_cell(results['healthy_criterion'])}.",
        "",
        "| Rule | False alarms on healthy runs | Hits on runs built to show it |",
        "| --- | --- | --- |",
    ]
    for name, rule in RULES.items():
        row = results["rules"].get(name)
        if name in NOT_HERE or row is None:
            continue
        lines.append(f"| {_cell(rule.label)} (`{name}`) | {_false_alarms(row)} | {_hits(row)} |")
    excluded = [
        label
        for label, run in results["runs"].items()
        if label in results["healthy_set"] and not run["healthy"]
    ]
    if excluded:
        lines += ["", f"Not healthy by the criterion, so not counted: {_runs(excluded)}."]
    return "\n".join(lines) + "\n"


def _val(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def _tried(row: dict[str, Any]) -> str:
    """One remedy run: its broken run and change, val before → after, and what it did."""
    did = "helped" if row["helped"] else "still fires" if row["fired_after"] else "val not lower"
    return (
        f"`{_cell(row['base'])}` + `{_cell(row['change'])}`: {_val(row['val_before'])} → "
        f"{_val(row['val_after'])}, {did}"
    )


def remedies_table(results: dict[str, Any]) -> str:
    """The Markdown table of every remedy each rule can suggest: the label it carries and
    the held-out runs that tried it on the rule's problem."""
    lines = [
        f"Generated from `{SCRIPT}`'s results and `SUGGESTS` / `EVIDENCE` "
        "(`core/findings/suggestions.py`) by `.venv/bin/python -m blockviz.cli.docs`.",
        "",
        "| Finding | Remedy | Its label says | Held-out runs that tried it: val loss before → "
        "after |",
        "| --- | --- | --- | --- |",
    ]
    for rule, remedies in SUGGESTS.items():
        label = RULES[rule].label if rule in RULES else rule
        for remedy in remedies:
            rows = [
                row
                for row in results["remedies"]
                if (row["rule"], row["remedy"]) == (rule, remedy) and row["fired_before"]
            ]
            said = EVIDENCE.get((rule, remedy), UNTESTED)
            tried = "<br>".join(_tried(row) for row in rows) or "—"
            lines.append(f"| {_cell(label)} (`{rule}`) | `{remedy}` | {said} | {tried} |")
    return "\n".join(lines) + "\n"


def runs_table(results: dict[str, Any]) -> str:
    """Every held-out run: its flags, its last val loss against the unigram entropy, and
    the rules that fired."""
    lines = [
        "| Run | Set | Flags | Val loss (unigram entropy) | Fired |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, run in results["runs"].items():
        kind = "broken or remedy"
        if label in results["healthy_set"]:
            kind = "healthy" if run["healthy"] else "healthy config, not healthy by the criterion"
        flags = results["flags"][label]
        lines.append(
            f"| `{_cell(label)}` | {kind} | `{_cell(flags)}` | {_val(run['val'])} "
            f"({run['unigram']:.3f}) | {_cell(', '.join(run['fired']) or '—')} |"
        )
    return "\n".join(lines) + "\n"


def parse(data: bytes) -> dict[str, Any]:
    """The results JSON as the tables read it."""
    return json.loads(data)
