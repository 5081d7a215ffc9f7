"""The README's "What the course material claims, what blockviz measured" table, made from
the results bench_studies.py wrote (nothing in it is typed by hand).

    .venv/bin/python benchmarks/studies_table.py [benchmarks/results/studies-quick.json
        [benchmarks/results/studies-quick-round2.json]]   # the second: verdicts before
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cell(text: str) -> str:
    return str(text).replace("|", r"\|").replace("\n", " ")


def table(result: dict, before: dict | None = None) -> str:
    """The claims table; with `before` (an earlier result file), its verdicts beside."""
    old = {
        (s["key"], i): c["verdict"]
        for s in (before or {}).get("studies", [])
        for i, c in enumerate(s["show"].get("claims") or [])
    }
    lines = [
        f"Measured {result['date']} on {result['machine']} (load average before: "
        f"{', '.join(map(str, result['load_before']))}); every study at `--size quick` with "
        "its default seeds, one after another, by `benchmarks/bench_studies.py`.",
        "",
        "| Study | Claim (source) | Verdict | Before | What the runs showed | Wall time |"
        if before
        else "| Study | Claim (source) | Verdict | What the runs showed | Wall time |",
        "| --- | --- | --- | --- | --- | ---: |" if before else "| --- | --- | --- | --- | ---: |",
    ]
    for study in result["studies"]:
        key, shown = study["key"], study["show"]
        command = f"`study run {key} --size quick`"
        claims = shown.get("claims") or []
        if not claims:
            gap = "— | " if before else ""
            lines.append(
                f"| {command} | — (measures, no claim) | — | {gap}— | {study['wall_s']:.0f} s |"
            )
        for index, claim in enumerate(claims):
            # As `judge` shows a reason: a sentence, starting with a capital.
            reason = claim["reason"][:1].upper() + claim["reason"][1:]
            intervals = claim.get("intervals") or []
            shown_reason = reason + (" Intervals: " + "; ".join(intervals) if intervals else "")
            was = f"{old.get((key, index), '—')} | " if before else ""
            lines.append(
                f"| {command} | {_cell(claim['claim'])} ({_cell(claim['source'])}) | "
                f"**{claim['verdict']}** | {was}{_cell(shown_reason)} | {study['wall_s']:.0f} s |"
            )
    lines.append("")
    lines.append(f"All quick studies together: {result['total_s'] / 60:.1f} min.")
    return "\n".join(lines) + "\n"


def main() -> None:
    path = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks/results/studies-quick.json"
    )
    before = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    print(
        table(
            json.loads(path.read_text(encoding="utf-8")),
            json.loads(before.read_text(encoding="utf-8")) if before else None,
        )
    )


if __name__ == "__main__":
    main()
