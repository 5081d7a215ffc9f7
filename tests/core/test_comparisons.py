"""Two groups of runs compared paired by seed and unpaired (blockviz.core.studies.comparisons), and
the verdicts that rest on them. Variant names and numbers are neutral and made up."""

from __future__ import annotations

import math

import pytest

from blockviz.core.studies.comparisons import compare, match_columns, seed_pairs
from blockviz.core.studies.define import StudyDef, Variant
from blockviz.core.studies.stats import difference_interval
from blockviz.core.studies.verdicts import judge
from blockviz.views.studies.table import interval_lines
from tests.helpers import NEUTRAL, claim, frame

# Seed-to-seed spread of 0.7 nats that both variants share; "a" is 0.01 below "b" in each.
SHARED = {1: 2.0, 2: 2.7, 3: 2.2}


def _shared_noise() -> list[tuple]:
    rows = [("a", seed, "converged", base - 0.01 - 0.001 * seed) for seed, base in SHARED.items()]
    return rows + [("b", seed, "converged", base) for seed, base in SHARED.items()]


def test_seed_noise_both_variants_share_cancels_when_paired() -> None:
    verdict = judge(claim("lower_loss", better="a", worse="b"), frame(_shared_noise()), NEUTRAL)
    assert verdict.verdict == "supported"
    assert "paired by seed over 3 pairs" in verdict.reason
    numbers = verdict.numbers
    assert numbers["interval"] == "paired" and numbers["pairs"] == 3
    assert numbers["paired high"] < 0
    # The unpaired interval is reported beside it, and could not tell the two apart.
    welch = difference_interval(
        [r[3] for r in _shared_noise() if r[0] == "a"], list(SHARED.values())
    )
    assert numbers["unpaired low"] == pytest.approx(welch.low) and welch.low < 0 < welch.high
    (line,) = interval_lines(verdict)
    assert line.startswith("a minus b: paired -0.012 (")
    assert ", n=3 pairs; unpaired -0.012 (" in line and "n=3 and 3 runs" in line


def test_without_two_shared_seeds_the_verdict_uses_welch_and_says_so() -> None:
    rows = [("a", 1, "converged", 2.0), ("a", 2, "converged", 2.01)]
    rows += [("b", 3, "converged", 2.5), ("b", 4, "converged", 2.51), ("b", 1, "converged", 2.5)]
    verdict = judge(claim("lower_loss", better="a", worse="b"), frame(rows), NEUTRAL)
    assert verdict.verdict == "supported"
    assert "unpaired (Welch, 2 and 3 runs; 1 seed pair, 2 needed to pair)" in verdict.reason
    assert verdict.numbers["interval"] == "unpaired" and verdict.numbers["pairs"] == 1
    assert math.isnan(verdict.numbers["paired high"])
    expected = difference_interval([2.0, 2.01], [2.5, 2.51, 2.5])
    assert verdict.numbers["high"] == pytest.approx(expected.high)
    assert "paired: 1 pair, 2 needed" in interval_lines(verdict)[0]


def test_only_seeds_with_a_finite_value_on_both_sides_pair() -> None:
    rows = [("a", 1, "converged", 2.0), ("a", 2, "converged", 2.1), ("a", 3, "diverged", math.nan)]
    rows += [("b", 1, "converged", 2.2), ("b", 2, "converged", 2.4), ("b", 3, "converged", 9.0)]
    rows += [("b", 4, "", math.nan)]
    results = frame(rows)
    pairs = seed_pairs(results[results["variant"] == "a"], results[results["variant"] == "b"])
    assert pairs["seed"].tolist() == [1, 2]
    assert (pairs["a"] - pairs["b"]).tolist() == pytest.approx([-0.2, -0.3])


def test_a_group_spanning_variants_is_matched_on_the_other_swept_columns_per_seed() -> None:
    # Two norms at two depths; x at depth 12 diverged in seed 2. Depth costs a whole nat,
    # so averaging each side within the seed without matching would compare seed 2's
    # x (depth 6 only) with y's mean over both depths.
    loss = {("x", 6): 2.0, ("x", 12): 3.0, ("y", 6): 2.1, ("y", 12): 3.1}
    rows = []
    for (norm, depth), value in loss.items():
        for seed in (1, 2):
            broken = (norm, depth, seed) == ("x", 12, 2)
            rows.append(
                (
                    f"{norm} {depth}",
                    seed,
                    "diverged" if broken else "converged",
                    math.nan if broken else value + 0.01 * seed,
                    {"norm": norm, "depth": depth},
                )
            )
    results = frame(rows)
    x, y = results[results["norm"] == "x"], results[results["norm"] == "y"]
    on = match_columns(("norm", "depth"), {"norm": "x"}, {"norm": "y"})
    assert on == ["depth"]
    pairs = seed_pairs(x, y, on=on)
    assert (pairs["a"] - pairs["b"]).tolist() == pytest.approx([-0.1, -0.1])
    compared = compare(x, y, ("x", "y"), on=on)
    assert compared.pairs == 2  # seeds, not the 3 matched runs
    assert compared.paired.mean == pytest.approx(-0.1)
    study = StudyDef(
        key="t",
        title="t",
        question="q",
        claims=(),
        variants=(Variant("x 6", {}),),
        swept=("norm", "depth"),
        baseline="x 6",
    )
    verdict = judge(claim("lower_loss", better={"norm": "x"}, worse={"norm": "y"}), results, study)
    assert verdict.numbers["paired difference"] == pytest.approx(-0.1)
    assert "paired by seed over 2 pairs" in verdict.reason


def test_a_variant_label_fixes_every_swept_column() -> None:
    assert match_columns(("norm", "depth"), "a", {"norm": "y"}) == []
    assert match_columns(("lr", "norm", "depth"), {"norm": "x", "depth": 6}, {"norm": "y"}) == [
        "lr"
    ]
