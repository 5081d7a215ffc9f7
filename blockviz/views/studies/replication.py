"""A study's seed sets and each claim's replication, read from the store (`study show`,
the Studies page, `study show --json`).

Every stored study whose spec equals this one's except for the seeds is a seed set of the
same definition (`core.studies.replication`); each is judged on its own runs. For each
claim: every set's verdict, the replication state, how many seeds its interval needs, and
the command that runs them on fresh seeds after the highest one any set used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from blockviz.core.fields import ConfigError
from blockviz.core.studies import replication as rep
from blockviz.core.studies.define import StudyDef, plan_from_spec, seeds_text
from blockviz.core.studies.outcomes import results_frame
from blockviz.core.studies.rules.base import Verdict
from blockviz.core.studies.verdicts import verdicts
from blockviz.store import RunStore
from blockviz.views.commands import command_line

ARROW = "→"


@dataclass(frozen=True)
class ClaimReplication:
    """One claim of the study shown: its verdict here, across seed sets, and the seeds its
    interval needs (with the command that runs them)."""

    verdict: Verdict
    replication: rep.Replication
    needed: rep.SeedsNeeded | None
    rerun: str | None  # the command, None where none re-runs this definition
    refused: str = ""  # why the study that would run them is refused (too many runs)


@dataclass(frozen=True)
class SeedSets:
    """The study shown (`own`, its results and plan) and the other sets of its definition."""

    plan: StudyDef
    results: pd.DataFrame
    own: rep.SeedSet
    others: tuple[rep.SeedSet, ...]


def _seed_set(study_id: int, plan: StudyDef, results: pd.DataFrame) -> rep.SeedSet:
    unfinished = int((results["outcome"] == "").sum()) if not results.empty else 0
    return rep.SeedSet(study_id, plan.seeds, tuple(verdicts(plan, results)), unfinished)


def seed_sets(store: RunStore, study_id: int) -> SeedSets:
    """The study and every other stored study of its definition, each judged alone."""
    record = store.get_study(study_id)
    plan = plan_from_spec(record.spec)
    results = results_frame(store.study_runs(study_id), plan)
    others = []
    for other_id in store.studies_frame()["id"].astype(int):
        if other_id == int(study_id):
            continue
        spec = store.get_study(other_id).spec
        if spec and rep.same_definition(spec, record.spec):
            other = plan_from_spec(spec)
            other_results = results_frame(store.study_runs(other_id), other)
            others.append(_seed_set(other_id, other, other_results))
    return SeedSets(plan, results, _seed_set(int(study_id), plan, results), tuple(others))


def claims(store: RunStore, sets: SeedSets) -> list[ClaimReplication]:
    """Each claim's replication, seeds needed and re-run command."""
    out = []
    everyone = [sets.own, *sets.others]
    for verdict, replicated in zip(
        sets.own.verdicts, rep.replicate(sets.own, sets.others), strict=True
    ):
        needed = rep.seeds_needed(verdict)
        rerun, refused = None, ""
        if needed is not None and needed.n is not None:
            try:
                words = rep.rerun_words(sets.plan, rep.next_seeds(everyone, needed.n))
            except ConfigError as exc:
                words, refused = None, str(exc)
            rerun = command_line(store, *words) if words else None
        out.append(ClaimReplication(verdict, replicated, needed, rerun, refused))
    return out


def sets_line(sets: SeedSets) -> str:
    """`seed sets of this definition: seeds 1–2 (study 1, this one); seeds 3–4 (study 2)`."""
    shown = [f"seeds {seeds_text(sets.own.seeds)} (study {sets.own.study_id}, this one)"]
    shown += [s.label for s in sorted(sets.others, key=lambda s: s.study_id)]
    return "seed sets of this definition: " + "; ".join(shown)


def replication_lines(claim: ClaimReplication) -> list[str]:
    """`seeds 1–2 (study 1): supported; seeds 3–4 (study 2): supported → replicated: …`,
    then the sets that overlap this one, if any."""
    replication = claim.replication
    sets = "; ".join(f"{s.label}: {word}" for s, word in replication.sets)
    lines = [f"{sets} {ARROW} {replication.state}: {replication.reason}"]
    note = replication.overlap_note()
    return lines + ([f"not a replication: {note}"] if note else [])


def needed_lines(claim: ClaimReplication) -> list[str]:
    """`seeds needed: …` and `run them: …`, or nothing for a rule without one interval."""
    if claim.needed is None:
        return []
    lines = [f"seeds needed: {claim.needed.reason}"]
    if claim.rerun:
        lines.append(
            f"run them on fresh seeds: `{claim.rerun}` (a disjoint set, judged on its own)"
        )
    elif claim.refused:
        lines.append(f"no command runs them: that study would be refused ({claim.refused})")
    elif claim.needed.n is not None:
        lines.append("no command re-runs this definition (not a built-in study as it is today)")
    return lines


def claim_json(claim: ClaimReplication) -> dict[str, Any]:
    """One claim's replication as `study show --json` prints it."""
    replication, needed = claim.replication, claim.needed
    return {
        "replication": {
            "state": replication.state,
            "reason": replication.reason,
            "sets": [
                {"study": s.study_id, "seeds": list(s.seeds), "verdict": word}
                for s, word in replication.sets
            ],
            "overlapping": [
                {"study": s.study_id, "seeds": list(s.seeds)} for s in replication.overlapping
            ],
        },
        "seeds_needed": None
        if needed is None
        else {
            "n": needed.n,
            "capped": needed.capped,
            "pairs": needed.pairs,
            "reason": needed.reason,
            "command": claim.rerun,
        },
    }
