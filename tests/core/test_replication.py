"""Seed sets of one study definition: replication states and the seeds a claim needs.

Results are constructed frames with neutral variants "a" and "b" (tests/helpers.py), judged
by `verdicts.judge` as they are; the numbers say nothing about any configuration.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from blockviz.core.fields import ConfigError
from blockviz.core.studies import builtins, define, sweeps
from blockviz.core.studies import replication as rep
from blockviz.core.studies.verdicts import judge
from tests.helpers import NEUTRAL, claim, frame

LOWER = claim("lower_loss", better="a", worse="b")


def seed_set(study_id: int, diffs: dict[int, float | None], rule=LOWER) -> rep.SeedSet:
    """A set whose variant b ends at 2.0 on every seed and a at 2.0 + diff (None: a's run of
    that seed has not finished)."""
    rows = []
    for seed, diff in diffs.items():
        rows.append(("b", seed, "converged", 2.0))
        rows.append(
            ("a", seed, "", math.nan) if diff is None else ("a", seed, "converged", 2.0 + diff)
        )
    results = frame(rows)
    unfinished = int((results["outcome"] == "").sum())
    return rep.SeedSet(study_id, tuple(diffs), (judge(rule, results, NEUTRAL),), unfinished)


LOW = {1: -0.10, 2: -0.11, 3: -0.12}  # a below b on every seed: supported
MIXED = {5: -0.10, 6: +0.10, 7: 0.0}  # the interval holds zero: inconclusive


def test_the_same_verdict_on_a_disjoint_set_is_replicated() -> None:
    own, other = seed_set(1, LOW), seed_set(2, {s + 4: d for s, d in LOW.items()})
    (result,) = rep.replicate(own, [other])
    assert own.verdicts[0].verdict == other.verdicts[0].verdict == "supported"
    assert result.state == rep.REPLICATED
    assert [(s.study_id, word) for s, word in result.sets] == [(1, "supported"), (2, "supported")]
    assert result.overlap_note() is None


def test_a_different_verdict_is_not_replicated_and_names_both() -> None:
    (result,) = rep.replicate(seed_set(1, LOW), [seed_set(2, MIXED)])
    assert result.state == rep.NOT_REPLICATED
    assert "this set says supported" in result.reason
    assert "seeds 5–7 (study 2) says inconclusive" in result.reason


def test_inconclusive_on_both_sets_is_no_verdict_to_replicate() -> None:
    (result,) = rep.replicate(seed_set(1, {1: -0.1, 2: 0.1, 3: 0.0}), [seed_set(2, MIXED)])
    assert result.state == rep.NOT_REPLICATED and "no verdict to replicate" in result.reason


@pytest.mark.parametrize("unfinished_side", ["own", "other"])
def test_an_unfinished_run_on_either_side_makes_it_pending(unfinished_side: str) -> None:
    waiting = {5: -0.10, 6: -0.11, 7: None}
    own = seed_set(1, LOW if unfinished_side == "other" else {1: -0.10, 2: -0.11, 3: None})
    other = seed_set(2, waiting if unfinished_side == "other" else {5: -0.1, 6: -0.11, 7: -0.12})
    (result,) = rep.replicate(own, [other])
    assert result.state == rep.PENDING
    waiting_set = other if unfinished_side == "other" else own
    assert f"waiting for {waiting_set.label} to finish" in result.reason
    # The unfinished set's own verdict waits for the run its claim rests on.
    words = dict((s.study_id, word) for s, word in result.sets)
    assert words[waiting_set.study_id] == "pending"


def test_a_finished_disagreement_is_said_even_while_another_set_runs() -> None:
    running = seed_set(3, {9: -0.1, 10: None})
    (result,) = rep.replicate(seed_set(1, LOW), [seed_set(2, MIXED), running])
    assert result.state == rep.NOT_REPLICATED


def test_an_overlapping_set_is_no_replication() -> None:
    own, overlapping = seed_set(1, LOW), seed_set(2, {3: -0.12, 4: -0.1, 5: -0.11})
    (result,) = rep.replicate(own, [overlapping])
    assert result.state == rep.NO_SECOND_SET  # the only other set shares seed 3
    assert [s.study_id for s, _ in result.sets] == [1]
    assert result.overlap_note() == (
        "seeds 3–5 (study 2) shares seed(s) 3 with this one: overlapping seed sets are no "
        "replication"
    )


def test_with_no_other_set_there_is_no_second_set() -> None:
    (result,) = rep.replicate(seed_set(1, LOW), [])
    assert result.state == rep.NO_SECOND_SET
    assert result.reason == "no disjoint seed set of this study's definition is stored yet"


def test_a_claim_judged_without_runs_needs_no_replication() -> None:
    shares = claim("param_share", variant="a", part="ffn", low=0.0, high=1.0)
    own, other = seed_set(1, LOW, shares), seed_set(2, MIXED, shares)
    (result,) = rep.replicate(own, [other])
    assert result.state == rep.NO_RUNS


# ------------------------------------------------------------------- definitions


def test_studies_of_one_definition_differ_only_in_their_seeds() -> None:
    first = builtins.builtin("activation", "quick", "1-4").to_spec()
    second = json.loads(json.dumps(builtins.builtin("activation", "quick", "5-8").to_spec()))
    assert rep.same_definition(first, second)  # tuples and JSON lists alike
    assert not rep.same_definition(first, builtins.builtin("activation", "standard").to_spec())
    assert not rep.same_definition(first, builtins.builtin("normalization", "quick").to_spec())


def test_the_next_seeds_start_after_the_highest_any_set_used() -> None:
    sets = [seed_set(1, LOW), seed_set(2, {5: -0.1, 8: -0.1}), seed_set(3, {2: -0.1, 3: -0.1})]
    assert rep.next_seeds(sets, 3) == (9, 10, 11)


def test_a_builtin_reruns_on_new_seeds_and_a_sweep_or_changed_builtin_does_not() -> None:
    plan = builtins.builtin("activation", "quick", "1-2")
    assert rep.rerun_words(plan, (3, 4, 5)) == (
        "study", "run", "activation", "--size", "quick", "--seeds", "3-5",
    )  # fmt: skip
    changed = dataclasses.replace(plan, question="another question")
    assert rep.rerun_words(changed, (3, 4)) is None
    swept = sweeps.sweep({"lr": [1e-3, 3e-3]}, seeds=2, size="quick")
    assert rep.rerun_words(swept, (3, 4)) is None


# ------------------------------------------------------------------- seeds needed


def test_seeds_needed_for_a_lower_loss_claim_matches_a_hand_computation() -> None:
    # Paired differences a − b: −0.1 and −0.3. Mean −0.2; sd = √((0.1² + 0.1²) / 1) =
    # 0.141421. n = ((1.959964 + 0.841621) · 0.141421 / 0.2)² = (2.801585 · 0.707107)² =
    # 1.981018² = 3.9244, rounded up: 4 seeds per variant.
    needed = rep.seeds_needed(seed_set(1, {1: -0.1, 2: -0.3}).verdicts[0])
    assert needed is not None
    assert needed.n == 4 and not needed.capped
    assert needed.uncapped == 4 and needed.pairs == 2
    assert needed.difference == pytest.approx(-0.2) and needed.sd == pytest.approx(0.141421, 1e-5)
    assert needed.reason.startswith("4 per variant for the 95% interval of a minus b")
    assert "optimistic" in needed.reason


def test_a_not_worse_claim_needs_seeds_for_the_distance_to_its_margin() -> None:
    # Differences −0.01 and +0.01: mean 0, sd 0.0141421; the margin is 0.02 away, so n =
    # ((2.801585 · 0.0141421) / 0.02)² = 3.9244 → 4, as above with everything ÷ 10.
    margin = claim("not_worse", better="a", worse="b", margin=0.02)
    needed = rep.seeds_needed(seed_set(1, {1: -0.01, 2: 0.01}, margin).verdicts[0])
    assert needed is not None and needed.n == 4 and needed.boundary == 0.02
    assert "to exclude the margin +0.020" in needed.reason


def test_the_cap_binds_and_says_so() -> None:
    # Differences −0.001 and +0.003: mean 0.001, sd 0.0028284; n = (2.801585 · 2.8284)² =
    # 62.79 → 63, capped at MAX_SEEDS.
    needed = rep.seeds_needed(seed_set(1, {1: -0.001, 2: 0.003}).verdicts[0])
    assert needed is not None and needed.n == define.MAX_SEEDS and needed.uncapped == 63
    assert needed.capped
    assert f"the formula says 63, capped at MAX_SEEDS = {define.MAX_SEEDS}" in needed.reason


def test_a_zero_difference_needs_more_seeds_than_any_number() -> None:
    needed = rep.seeds_needed(seed_set(1, {1: -0.01, 2: 0.01}).verdicts[0])
    assert needed is not None and needed.n == define.MAX_SEEDS and math.isinf(needed.uncapped)
    assert "the formula says no finite number" in needed.reason


def test_no_spread_needs_the_minimum_of_two() -> None:
    needed = rep.seeds_needed(seed_set(1, {1: -0.1, 2: -0.1}).verdicts[0])
    assert needed is not None and needed.n == 2


def test_without_two_pairs_it_cannot_say_and_other_rules_get_no_number() -> None:
    needed = rep.seeds_needed(seed_set(1, {1: -0.1, 2: None}).verdicts[0])
    assert needed is not None and needed.n is None and needed.reason.startswith("cannot say")
    converges = claim("converges", groups=["a"])
    assert rep.seeds_needed(seed_set(1, LOW, converges).verdicts[0]) is None


def test_the_rerun_of_a_study_too_big_for_its_seeds_names_why() -> None:
    """qk-norm-z-loss has 28 variants: 20 fresh seeds are 560 runs, past the 500 a study
    may hold; the command is refused with the reason, not called 'not a built-in'."""
    plan = builtins.builtin("qk-norm-z-loss", "quick", "1-2")
    assert rep.rerun_words(plan, (3, 4)) is not None
    with pytest.raises(ConfigError, match="500"):
        rep.rerun_words(plan, tuple(range(6, 26)))
