"""Before and after one evaluation set: each quick study's seed spread, interval widths and
verdicts, from two result files of bench_studies.py (nothing in it is typed by hand).

    .venv/bin/python benchmarks/studies_compare.py \
        benchmarks/results/studies-quick-round2.json benchmarks/results/studies-quick.json

Seed spread: a variant's max − min final val loss over its seeds. The round-two file holds
each variant's sample sd instead; with its 2 seeds, max − min = sd · √2 exactly. Interval
width: the high − low of the interval a claim's verdict rests on (round two: Welch's; now
paired by seed where 2 seeds pair up) and, now, of the unpaired one beside it.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def spreads(study: dict) -> dict[str, float]:
    """Each variant's seed spread: recorded, or from its sd when it ran two seeds."""
    if study.get("seed_spread"):
        return {k: float(v) for k, v in study["seed_spread"].items()}
    out = {}
    for row in study["show"].get("variants") or []:
        if row.get("sd") is not None and row.get("finished") == 2:
            out[row["variant"]] = float(row["sd"]) * math.sqrt(2)
    return out


def widths(claim: dict) -> tuple[float, float]:
    """The width of the interval the verdict used, and of the unpaired one (NaN if none)."""
    numbers = claim.get("numbers") or {}
    if "difference" not in numbers:  # a rule without an interval (counts, a share's band)
        return math.nan, math.nan

    def width(low: str, high: str) -> float:
        a, b = numbers.get(low), numbers.get(high)
        return b - a if isinstance(a, int | float) and isinstance(b, int | float) else math.nan

    return width("low", "high"), width("unpaired low", "unpaired high")


def fmt(value: float, digits: int = 3) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def spread_table(before: dict, after: dict) -> str:
    by_key = {s["key"]: s for s in before["studies"]}
    lines = [
        "| Study | variants | worst seed spread, before | after | median spread, before | after |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for study in after["studies"]:
        old, new = spreads(by_key.get(study["key"], {"show": {}})), spreads(study)
        if not new:
            continue
        lines.append(
            f"| `{study['key']}` | {len(new)} | {fmt(max(old.values(), default=math.nan))} | "
            f"**{fmt(max(new.values()))}** | "
            f"{fmt(statistics.median(old.values()) if old else math.nan)} | "
            f"{fmt(statistics.median(new.values()))} |"
        )
    return "\n".join(lines)


def verdict_table(before: dict, after: dict) -> str:
    old_claims = {
        (s["key"], i): c
        for s in before["studies"]
        for i, c in enumerate(s["show"].get("claims") or [])
    }
    lines = [
        "| Study | Claim | Verdict before | interval width before | Verdict now | "
        "width now (used) | width now (unpaired) |",
        "| --- | --- | --- | ---: | --- | ---: | ---: |",
    ]
    for study in after["studies"]:
        for index, claim in enumerate(study["show"].get("claims") or []):
            old = old_claims.get((study["key"], index), {})
            used, unpaired = widths(claim)
            lines.append(
                f"| `{study['key']}` | {claim['claim']} | {old.get('verdict', '—')} | "
                f"{fmt(widths(old)[0]) if old else '—'} | **{claim['verdict']}** | "
                f"{fmt(used)} | {fmt(unpaired)} |"
            )
    return "\n".join(lines)


def main() -> None:
    before = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    after = json.loads(Path(sys.argv[2]).read_text(encoding="utf-8"))
    print(spread_table(before, after))
    print()
    print(verdict_table(before, after))


if __name__ == "__main__":
    main()
