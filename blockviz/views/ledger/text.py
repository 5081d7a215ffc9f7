"""The ledger as text: `ledger list`'s line per claim and `ledger show`'s card."""

from __future__ import annotations

from collections.abc import Sequence

from blockviz.core import ledger as ldg
from blockviz.core.studies.define import seeds_text

ARROW = "→"


def set_label(seed_set: ldg.SeedSetResult) -> str:
    """`seeds 1–2 (study 3)`."""
    return f"seeds {seeds_text(seed_set.seeds)} (study {seed_set.study})"


def verdict_word(seed_set: ldg.SeedSetResult) -> str:
    """The set's verdict, with its unfinished runs when it has some."""
    if seed_set.unfinished and seed_set.verdict != "pending":
        return f"pending ({seed_set.unfinished} run(s) unfinished; so far {seed_set.verdict})"
    return seed_set.verdict


def measured_line(measurement: ldg.Measurement) -> str:
    """`quick: seeds 1–2 supported; seeds 3–4 supported → replicated`."""
    sets = "; ".join(f"seeds {seeds_text(s.seeds)} {verdict_word(s)}" for s in measurement.sets)
    return f"{measurement.size}: {sets} {ARROW} {measurement.replication}"


def list_lines(entries: Sequence[ldg.Entry]) -> list[str]:
    """One line per claim: its id, each measurement's verdict per seed set and
    replication (or `not run`), and the claim."""
    rows = [
        (e.id, " | ".join(measured_line(m) for m in e.measurements) or ldg.NOT_RUN, e.claim)
        for e in entries
    ]
    if not rows:
        return []
    id_width = max(len(r[0]) for r in rows)
    said_width = min(max(len(r[1]) for r in rows), 70)
    return [f"{i.ljust(id_width)}  {said.ljust(said_width)}  {claim}" for i, said, claim in rows]


def card_lines(entry: ldg.Entry) -> list[str]:
    """Everything the ledger holds about one claim."""
    lines = [
        f"{entry.id}: {entry.claim}",
        f"source: {entry.source}",
        f"study: {entry.study_key} ({entry.study_title}); rule {entry.rule}",
    ]
    if not entry.measurements:
        return [*lines, f"not run: `{entry.run_command}` runs it"]
    for measurement in entry.measurements:
        lines.append(
            f"measured at size {measurement.size} in {measurement.origin.text()}: "
            f"{measurement.replication} ({measurement.replication_reason})"
        )
        lines.append(f"  grid: {measurement.grid()}")
        for seed_set in measurement.sets:
            lines += [
                f"  {set_label(seed_set)}, {seed_set.date or 'date not recorded'}, "
                f"{seed_set.runs} runs, {seed_set.machine()}: {verdict_word(seed_set)}",
                f"      {seed_set.reason}",
                *(f"      intervals: {line}" for line in seed_set.intervals),
                *(f"      {line}" for line in seed_set.sensitivity),
            ]
        if measurement.rerun:
            lines.append(f"  re-run on fresh seeds: `{measurement.rerun}`")
        else:
            lines.append("  no command re-runs this definition (the built-in study changed since)")
    return lines
