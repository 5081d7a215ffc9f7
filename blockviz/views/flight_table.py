"""docs/flight-recorder.md's calibration tables, generated from the committed results of
`benchmarks/flight_calibration.py` (never typed).

Two tables: per set (tuning, held-out) how many healthy windows named a break and how many
broken runs were hit, and one row for each break named in a healthy window and for each
broken run's replay. `blockviz.cli.docs` writes them between `<!-- flight -->` and
`<!-- /flight -->`, and its test fails when they are stale. Torch-free.
"""

from __future__ import annotations

from typing import Any

from blockviz.core.findings.base import num
from blockviz.core.flight import Break

# Each set's label in the tables, in their order: what the set is to the rule.
SETS = {
    "tuning": "tuning (the parameters were chosen on it)",
    "held-out": "held-out (judged on it, never tuned)",
}
TARGET = 20  # docs/flight-recorder.md's target: at most one false alarm in 20 windows


class ResultsError(ValueError):
    """The results file lacks what the tables are made from."""


def _cell(text: object) -> str:
    """Text safe in a Markdown table cell: one line, pipes and brackets escaped."""
    flat = " ".join(str(text).split())
    return flat.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _row(cells: list[object]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _named(brk: dict[str, Any] | None) -> str:
    """What a replay named: the statistic, its value against its range, at which step."""
    if brk is None:
        return "nothing"
    found = Break.from_dict(brk)
    where = f"{found.subject()} at step {found.step:,}: {num(found.value)}"
    where += f" against {num(found.low)}–{num(found.high)}"
    if found.event != "window":
        where += f", {found.lead} steps before the {found.event}"
    return where


def _rate(count: int, total: int) -> str:
    """`count` of `total`, and whether that meets the target of one in TARGET."""
    if not total:
        return "no windows"
    met = "meets" if count * TARGET <= total else "misses"
    return f"{count} of {total} ({met} the target of at most 1 in {TARGET})"


def _summary(sets: dict[str, Any]) -> list[str]:
    lines = [
        "| set | healthy runs | healthy windows that named a break | broken runs | hit |",
        "|---|---|---|---|---|",
    ]
    for name, label in SETS.items():
        found = sets[name]
        lines.append(
            _row(
                [
                    label,
                    len(found["healthy_runs"]),
                    _rate(int(found["false_alarms"]), len(found["windows"])),
                    len(found["broken"]),
                    f"{found['hits']} of {len(found['broken'])}",
                ]
            )
        )
    return lines


def _replay(broken: dict[str, Any]) -> str:
    """Which replay a broken run got: its event, the loss's onset and the start."""
    text = f"{broken['event']} at step {broken['event_step']:,}, loss out of its range from "
    text += f"{broken['onset']:,}; "
    if broken["start"] is None:
        return text + "no kept checkpoint before it"
    text += f"replay from {broken['start']:,}"
    late = " (after the onset: the event began before its window)"
    return text + (late if broken["late"] else "")


def _details(sets: dict[str, Any]) -> list[str]:
    lines = ["| set | run | replay | what it named |", "|---|---|---|---|"]
    for name in SETS:
        for window in sets[name]["windows"]:
            if window["break"] is not None:
                replay = f"healthy window, steps {window['start'] + 1:,}–{window['end']:,}"
                lines.append(_row([name, window["run"], replay, _named(window["break"])]))
        for broken in sets[name]["broken"]:
            lines.append(_row([name, broken["run"], _replay(broken), _named(broken["break"])]))
    return lines


def table(results: dict[str, Any], source: str) -> str:
    """The two tables and the line that says where and how they were measured."""
    try:
        sets = results["sets"]
        missing = [name for name in SETS if name not in sets]
        if missing:
            raise ResultsError(f"{source}: no {' or '.join(missing)} set; run both sets")
        load = ", ".join(f"{x:g}" for x in results["load_average"])
        lines = [
            f"Measured by `{results['command']}` on {results['machine']}, {results['date']} "
            f"(load average {load}); {results['window_steps']}-step windows; from `{source}`.",
            "",
            *_summary(sets),
            "",
            "Every break named in a healthy window, and every broken run's replay:",
            "",
            *_details(sets),
        ]
    except (KeyError, TypeError) as exc:
        raise ResultsError(f"{source}: not a flight_calibration.py results file ({exc})") from exc
    return "\n".join(lines) + "\n"
