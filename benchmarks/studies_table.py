"""The README's "What the course material claims, what blockviz measured" table, made from
the results bench_studies.py wrote (nothing in it is typed by hand).

    .venv/bin/python benchmarks/studies_table.py [benchmarks/results/studies-quick.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cell(text: str) -> str:
    return str(text).replace("|", r"\|").replace("\n", " ")


def table(result: dict) -> str:
    lines = [
        f"Measured {result['date']} on {result['machine']} (load average before: "
        f"{', '.join(map(str, result['load_before']))}); every study at `--size quick` with "
        "its default seeds, one after another, by `benchmarks/bench_studies.py`.",
        "",
        "| Study | Claim (source) | Verdict | What the runs showed | Wall time |",
        "| --- | --- | --- | --- | ---: |",
    ]
    for study in result["studies"]:
        key, shown = study["key"], study["show"]
        command = f"`study run {key} --size quick`"
        claims = shown.get("claims") or []
        if not claims:
            lines.append(
                f"| {command} | — (measures, no claim) | — | — | {study['wall_s']:.0f} s |"
            )
        for claim in claims:
            lines.append(
                f"| {command} | {_cell(claim['claim'])} ({_cell(claim['source'])}) | "
                f"**{claim['verdict']}** | {_cell(claim['reason'])} | {study['wall_s']:.0f} s |"
            )
    lines.append("")
    lines.append(f"All quick studies together: {result['total_s'] / 60:.1f} min.")
    return "\n".join(lines) + "\n"


def main() -> None:
    path = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks/results/studies-quick.json"
    )
    print(table(json.loads(path.read_text(encoding="utf-8"))))


if __name__ == "__main__":
    main()
