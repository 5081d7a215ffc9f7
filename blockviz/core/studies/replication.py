"""Replication: a claim judged again on a second, disjoint seed set of the same study.

Two stored studies hold **the same definition** when their specs (`StudyDef.to_spec`) are
equal except for the seeds (the study's name, id and dates are not in the spec). Each seed
set is judged on its own runs only (`verdicts.judge` on that study's results): the second
set is never pooled into the first. Pooling, and deciding after each new seed whether to
stop, is optional stopping; it makes "supported" likelier than the interval's 95% says.
A claim's verdict is then:

- **replicated**: every disjoint seed set of the definition has finished and gives the same
  decided verdict (supported, or contradicted) as this one;
- **not replicated**: a finished disjoint set gives another verdict, or no set decides
  (inconclusive on both is no verdict to replicate);
- **pending**: this set or a disjoint one has runs that have not finished (queued, running,
  stopped or failed), or its verdict is itself pending;
- **no second set**: no disjoint seed set of the definition is in the store. A set that
  shares a seed with this one is listed but is no replication: the shared seeds' runs are
  the same runs' draws twice.

`seeds_needed` says how many seeds per variant a two-group claim needs (below), and
`next_seeds` where a fresh, disjoint set starts. Torch-free and store-free: the caller
reads the studies and judges them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from blockviz.core.studies import builtins
from blockviz.core.studies.define import MAX_SEEDS, Claim, StudyDef, seeds_text
from blockviz.core.studies.rules.base import Verdict

REPLICATED, NOT_REPLICATED, PENDING, NO_SECOND_SET, NO_RUNS = (
    "replicated",
    "not replicated",
    "pending",
    "no second set",
    "needs no runs",
)
DECIDED = ("supported", "contradicted")
UNTRAINED_RULES = ("param_share",)  # judged from a config: seeds cannot change them
# The rules whose verdict is one interval of (better − worse) against a boundary: 0, or
# the claim's margin for not_worse. `seeds_needed` answers for these.
TWO_GROUP_RULES = ("lower_loss", "not_worse", "less_sensitive")
Z_INTERVAL = 1.959964  # z(0.975): a two-sided 95% interval
Z_POWER = 0.841621  # z(0.8): 80% power
# A difference this close to its boundary is the boundary (float noise in a mean of
# differences of losses that agree to every printed digit); no seed count separates them.
ZERO_DISTANCE = 1e-9


def definition(spec: Mapping[str, Any]) -> str:
    """A study's spec without its seeds, as canonical JSON (tuples and lists alike)."""
    return json.dumps({k: v for k, v in spec.items() if k != "seeds"}, sort_keys=True)


def same_definition(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two studies' specs are equal except for the seeds."""
    return definition(a) == definition(b)


@dataclass(frozen=True)
class SeedSet:
    """One stored study of a definition: its seeds, its claims' verdicts judged on its own
    runs, and how many of its runs have not finished."""

    study_id: int
    seeds: tuple[int, ...]
    verdicts: tuple[Verdict, ...]  # one per claim, in the study's order
    unfinished: int

    @property
    def label(self) -> str:
        """`seeds 1–4 (study 3)`."""
        return f"seeds {seeds_text(self.seeds)} (study {self.study_id})"

    def state(self, index: int) -> str:
        """Claim `index`'s verdict here, or `pending` while a run has not finished."""
        verdict = self.verdicts[index].verdict
        return PENDING if self.unfinished else verdict


@dataclass(frozen=True)
class Replication:
    """One claim across the seed sets of its definition: the state and why, each disjoint
    set's verdict (this study's first), and the sets that share a seed with this one."""

    claim: Claim
    state: str
    reason: str
    sets: tuple[tuple[SeedSet, str], ...]  # (seed set, its verdict or pending)
    overlapping: tuple[SeedSet, ...] = ()

    def overlap_note(self) -> str | None:
        """`seeds 2–3 (study 3) shares seeds 2–3 with this one: ...`, or None."""
        if not self.overlapping:
            return None
        own = set(self.sets[0][0].seeds)
        shared = "; ".join(
            f"{s.label} shares seed(s) {seeds_text(sorted(set(s.seeds) & own))}"
            for s in self.overlapping
        )
        return f"{shared} with this one: overlapping seed sets are no replication"


def _set_word(seed_set: SeedSet, index: int) -> str:
    """A set's verdict as shown: `supported`, or `pending (2 run(s) unfinished; so far
    supported)`."""
    so_far = seed_set.verdicts[index].verdict
    if seed_set.state(index) != PENDING or so_far == PENDING:
        return so_far
    return f"pending ({seed_set.unfinished} run(s) unfinished; so far {so_far})"


def replicate(own: SeedSet, others: Sequence[SeedSet]) -> list[Replication]:
    """Each claim of `own` against the other seed sets of its definition."""
    ordered = sorted(others, key=lambda s: s.study_id)
    overlapping = tuple(s for s in ordered if set(s.seeds) & set(own.seeds))
    disjoint = [s for s in ordered if not set(s.seeds) & set(own.seeds)]
    out = []
    for index, verdict in enumerate(own.verdicts):
        sets = tuple((s, _set_word(s, index)) for s in [own, *disjoint])
        state, reason = _judged(own, disjoint, index)
        if verdict.claim.rule in UNTRAINED_RULES:
            state, reason = NO_RUNS, "judged from the config alone; seeds do not change it"
        out.append(Replication(verdict.claim, state, reason, sets, overlapping))
    return out


def _judged(own: SeedSet, disjoint: Sequence[SeedSet], index: int) -> tuple[str, str]:
    """The state of claim `index` over this set and the disjoint ones, and why."""
    if not disjoint:
        return NO_SECOND_SET, "no disjoint seed set of this study's definition is stored yet"
    mine = own.state(index)
    finished = [s for s in disjoint if s.state(index) != PENDING]
    differ = [s for s in finished if s.state(index) != mine]
    if mine != PENDING and differ:
        said = "; ".join(f"{s.label} says {s.state(index)}" for s in differ)
        return NOT_REPLICATED, f"this set says {mine}; {said}"
    waiting = [s for s in [own, *disjoint] if s.state(index) == PENDING]
    if waiting:
        return PENDING, "waiting for " + ", ".join(s.label for s in waiting) + " to finish"
    if mine not in DECIDED:
        return NOT_REPLICATED, f"{mine} on every set: no verdict to replicate"
    return REPLICATED, f"{mine} on {len(disjoint) + 1} disjoint seed sets, each judged alone"


# ------------------------------------------------------------------- seeds needed


@dataclass(frozen=True)
class SeedsNeeded:
    """How many seeds per variant a two-group claim's interval needs to exclude its
    boundary with 80% power, from the paired differences of one seed set."""

    claim: Claim
    n: int | None  # seeds per variant, capped at MAX_SEEDS; None when it cannot say
    uncapped: float  # the formula's n before the cap (inf for a zero distance)
    difference: float  # the observed mean paired difference (better − worse)
    boundary: float  # 0, or the not_worse margin
    sd: float  # the paired differences' sample sd
    pairs: int
    reason: str

    @property
    def capped(self) -> bool:
        return self.n is not None and self.uncapped > self.n


def seeds_needed(verdict: Verdict, cap: int = MAX_SEEDS) -> SeedsNeeded | None:
    """n = ⌈((z(0.975) + z(0.8)) · sd / |difference − boundary|)²⌉, at least 2, at most
    `cap`; None for a rule that is not one interval against a boundary (TWO_GROUP_RULES).

    Normal approximation over paired differences that are normal, with the observed mean
    difference taken as the true one: optimistic when the first set is small (its sd and
    difference are themselves noisy, and a t interval is wider than a normal one).
    """
    claim = verdict.claim
    if claim.rule not in TWO_GROUP_RULES:
        return None
    boundary = float(claim.args.get("margin", 0.0)) if claim.rule == "not_worse" else 0.0
    paired = [c.paired for c in verdict.comparisons if c.paired is not None]
    if len(verdict.comparisons) != 1 or len(paired) != 1:
        return SeedsNeeded(
            claim, None, math.nan, math.nan, boundary, math.nan, 0,
            "cannot say: it needs the paired differences of at least 2 seeds both sides "
            "finished with a finite value",
        )  # fmt: skip
    interval = paired[0]
    distance = abs(interval.mean - boundary)
    z = Z_INTERVAL + Z_POWER
    if interval.sd == 0.0:
        raw = 0.0
    elif distance < ZERO_DISTANCE:
        raw = math.inf
    else:
        raw = (z * interval.sd / distance) ** 2
    uncapped = float(max(2, math.ceil(raw))) if math.isfinite(raw) else math.inf
    n = int(min(uncapped, cap))
    what = "0" if boundary == 0.0 else f"the margin {boundary:+.3f}"
    edge = f"{boundary:.3f}" if boundary else "0"
    a, b = verdict.comparisons[0].names
    said = (
        f"{n} per variant for the 95% interval of {a} minus {b} to exclude {what} with 80% "
        f"power, if the difference measured here ({interval.mean:+.4f}, sd {interval.sd:.4f} "
        f"over {interval.n} paired seeds) is the true one: n = ⌈((1.960 + 0.842) · "
        f"{interval.sd:.4f} / |{interval.mean:+.4f} − {edge}|)²⌉, at least 2 (normal paired "
        "differences, a normal approximation: optimistic when this set is small)"
    )
    if uncapped > n:
        formula_n = "no finite number" if math.isinf(uncapped) else f"{int(uncapped):,}"
        said += (
            f"; the formula says {formula_n}, capped at MAX_SEEDS = {cap}: that many may "
            "not decide it"
        )
    return SeedsNeeded(claim, n, uncapped, interval.mean, boundary, interval.sd, interval.n, said)


def next_seeds(sets: Sequence[SeedSet], n: int) -> tuple[int, ...]:
    """n fresh seeds after the highest seed any set of the definition used."""
    start = max((seed for s in sets for seed in s.seeds), default=0) + 1
    return tuple(range(start, start + n))


def rerun_words(plan: StudyDef, seeds: Sequence[int]) -> tuple[str, ...] | None:
    """The `study run` words that store `plan`'s definition again on `seeds`; None unless
    it is a built-in whose definition today is the one stored (a sweep, or a built-in
    changed since, has no such command). ConfigError where that study would be refused
    (too many runs or seeds: its message says which)."""
    if plan.key not in builtins.BUILTINS:
        return None
    flag = f"{min(seeds)}-{max(seeds)}"
    again = builtins.builtin(plan.key, plan.size, flag)
    if not same_definition(again.to_spec(), plan.to_spec()):
        return None
    return ("study", "run", plan.key, "--size", plan.size, "--seeds", flag)
