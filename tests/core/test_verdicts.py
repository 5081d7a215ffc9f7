"""Outcomes, LR sensitivity, per-variant summaries and verdict rules on constructed results.

The results are built by hand with neutral variant names ("a", "b", ...) and numbers chosen
to hit each branch of each rule; they say nothing about what any configuration does.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from blockviz.core.studies import outcomes
from blockviz.core.studies.define import StudyDef
from blockviz.core.studies.rules.base import select
from blockviz.core.studies.rules.counts import max_stable
from blockviz.core.studies.rules.sweep import sensitivity_table
from blockviz.core.studies.stats import difference_interval
from blockviz.core.studies.summary import summarize
from blockviz.core.studies.verdicts import RULES, judge
from tests.helpers import NEUTRAL, claim, frame

# ---------------------------------------------------------------- outcomes


@pytest.mark.parametrize(
    ("status", "loss", "expected"),
    [
        ("diverged", None, "diverged"),
        ("completed", 2.0, "converged"),
        ("completed", 3.0 - outcomes.STALL_MARGIN, "stalled"),
        ("completed", 3.5, "stalled"),
        ("completed", 3.0 - outcomes.STALL_MARGIN - 0.01, "converged"),
        ("completed", None, "diverged"),
        ("completed", float("inf"), "diverged"),
        ("running", 2.0, ""),
        ("stopped", 2.0, ""),
        ("failed", None, ""),
        ("queued", None, ""),
    ],
)
def test_classify(status: str, loss: float | None, expected: str) -> None:
    assert outcomes.classify(status, loss, 3.0) == expected


def test_classify_without_a_unigram_reference_never_calls_a_run_stalled() -> None:
    assert outcomes.classify("completed", 9.0, None) == "converged"


@pytest.mark.parametrize(
    ("loss", "expected"),
    [
        (4.0 + outcomes.BLOWUP_MARGIN + 0.01, "blew up"),
        (40.0, "blew up"),
        (4.0 + outcomes.BLOWUP_MARGIN, "stalled"),
        (4.2, "stalled"),  # no better than a uniform guess, but no blow-up
        (2.0, "converged"),
    ],
)
def test_a_finite_loss_far_above_the_uniform_guess_blew_up(loss: float, expected: str) -> None:
    assert outcomes.classify("completed", loss, 3.0, 4.0) == expected
    assert outcomes.classify("completed", loss, None, 4.0) == expected.replace(
        "stalled", "converged"
    )
    assert "blew up" in outcomes.FAILED


def test_lr_sensitivity_by_hand() -> None:
    # best 2.0; capped losses 2.0, 3.0, 4.0 (5.0 capped at init 4.0) -> mean(0, 1, 2) = 1
    assert outcomes.lr_sensitivity([1, 2, 3], [2.0, 3.0, 5.0], 4.0) == pytest.approx(1.0)
    # a diverged run counts as the init loss: mean(0, 2) = 1
    assert outcomes.lr_sensitivity([1, 2], [2.0, float("nan")], 4.0) == pytest.approx(1.0)
    assert outcomes.lr_sensitivity([1, 2, 3], [2.5, 2.5, 2.5], 4.0) == 0.0
    assert math.isnan(outcomes.lr_sensitivity([1], [float("nan")], 4.0))
    with pytest.raises(ValueError, match="2 learning rates but 1 losses"):
        outcomes.lr_sensitivity([1, 2], [2.0], 4.0)


def test_results_frame_from_store_rows() -> None:
    runs = pd.DataFrame(
        {
            "id": [1, 2],
            "variant": ["a", "b"],
            "seed": [1, 1],
            "status": ["completed", "diverged"],
            "diverged_step": [None, 7],
            "n_params": [10, 20],
            "final": [{"val_loss": 2.5, "train_loss": 2.4, "time_s": 3.0}, {}],
            "dataset": [{"unigram_nats": 3.0, "init_loss": 4.1}, {}],
        }
    )
    study = StudyDef(**{**NEUTRAL.__dict__, "swept": ("ffn_mult",)})
    results = outcomes.results_frame(runs, study)
    assert results["outcome"].tolist() == ["converged", "diverged"]
    blown = runs.assign(final=[{"val_loss": 31.0}, {}])  # init_loss 4.1: far above it
    assert outcomes.results_frame(blown, study)["outcome"].tolist() == ["blew up", "diverged"]
    assert results["diverged_step"].tolist()[1] == 7
    assert results["ffn_mult"].tolist() == [4, 2]
    assert results.loc[0, "unigram_nats"] == 3.0 and math.isnan(results.loc[1, "val_loss"])
    empty = outcomes.results_frame(runs.iloc[:0], study)
    assert list(empty.columns) == [*outcomes.RESULT_COLUMNS, "ffn_mult"] and empty.empty


# ---------------------------------------------------------------- summary


def test_summarize_counts_and_intervals() -> None:
    results = frame(
        [
            ("a", 1, "converged", 2.0),
            ("a", 2, "converged", 2.2),
            ("a", 3, "diverged", math.nan),
            ("b", 1, "", math.nan),
            ("c", 1, "blew up", 30.0),
            ("c", 2, "stalled", 3.1),
        ]
    )
    results.loc[2, "train_loss"] = 2851.0  # the last finite train loss before it blew up
    summary = summarize(results).set_index("variant")
    a = summary.loc["a"]
    assert (a["runs"], a["finished"], a["converged"], a["diverged"]) == (3, 3, 2, 1)
    c = summary.loc["c"]
    assert (c["blew_up"], c["stalled"], c["converged"], c["diverged"]) == (1, 1, 0, 0)
    assert a["mean"] == pytest.approx(2.1) and a["sd"] == pytest.approx(math.sqrt(0.02))
    assert a["train_loss"] == pytest.approx(2.1)  # the diverged run's is left out
    assert a["low"] < 2.1 < a["high"]
    b = summary.loc["b"]
    assert (b["finished"], math.isnan(b["mean"])) == (0, True)
    assert list(summarize(results)["variant"]) == ["a", "b", "c"]


def test_select_by_label_or_columns() -> None:
    results = frame(
        [("a", 1, "converged", 2.0, {"lr": 0.1}), ("b", 1, "converged", 2.0, {"lr": 0.2})]
    )
    assert select(results, "b")["run_id"].tolist() == [2]
    assert select(results, {"lr": 0.1})["run_id"].tolist() == [1]
    with pytest.raises(ValueError, match="no column 'depth'"):
        select(results, {"depth": 2})


# ---------------------------------------------------------------- rules


def _verdict(rule: str, rows: list[tuple], **args) -> str:
    return judge(claim(rule, **args), frame(rows), NEUTRAL).verdict


def test_converges() -> None:
    ok = [("a", 1, "converged", 2.0), ("a", 2, "converged", 2.1)]
    assert _verdict("converges", ok, groups=["a"]) == "supported"
    bad = [("a", 1, "diverged", math.nan), ("a", 2, "stalled", 3.2), ("a", 3, "converged", 2)]
    assert _verdict("converges", bad, groups=["a"]) == "contradicted"
    half = [("a", 1, "diverged", math.nan), ("a", 2, "converged", 2.0)]
    assert _verdict("converges", half, groups=["a"]) == "inconclusive"
    assert _verdict("converges", ok[:1], groups=["a"]) == "inconclusive"


def test_fails_often() -> None:
    half = [("a", 1, "diverged", math.nan), ("a", 2, "converged", 2.0)]
    assert _verdict("fails_often", half, groups=["a"]) == "supported"
    none = [("a", 1, "converged", 2.0), ("a", 2, "converged", 2.1)]
    assert _verdict("fails_often", none, groups=["a"]) == "contradicted"
    few = [("a", s, "converged", 2.0) for s in (1, 2, 3)] + [("a", 4, "stalled", 3.5)]
    assert _verdict("fails_often", few, groups=["a"]) == "inconclusive"


def test_a_blown_up_run_failed_to_train() -> None:
    rows = [("a", 1, "blew up", 31.0), ("a", 2, "converged", 2.0)]
    verdict = judge(claim("converges", groups=["a"]), frame(rows), NEUTRAL)
    assert verdict.verdict == "inconclusive"
    assert verdict.reason == "1 of 2 finished runs of a converged; 1 failed to train (1 blew up)."
    assert _verdict("fails_often", rows, groups=["a"]) == "supported"


@pytest.mark.parametrize("rule", ["converges", "fails_often"])
def test_pooled_groups_wait_for_every_run(rule: str) -> None:
    a = [("a", 1, "converged", 2.0), ("a", 2, "converged", 2.1)]
    waiting = [("b", 1, "", math.nan), ("b", 2, "", math.nan)]
    verdict = judge(claim(rule, groups=["a", "b"]), frame(a + waiting), NEUTRAL)
    assert verdict.verdict == "pending"
    assert verdict.reason == "Pending: 2 of the 4 runs it rests on have not ended (2 running)."
    # A dict group spanning two variants: each of them needs its runs ended.
    spanned = [(v, s, o, x, {"kind": "k"}) for v, s, o, x in a + waiting]
    assert judge(claim(rule, groups=[{"kind": "k"}]), frame(spanned), NEUTRAL).verdict == "pending"
    # A group with no run at all cannot be judged (and is named).
    verdict = judge(claim(rule, groups=["a", "c"]), frame(a), NEUTRAL)
    assert verdict.verdict == "inconclusive" and verdict.reason.startswith("No run of c has")
    done = [("b", 1, "converged", 2.0), ("b", 2, "converged", 2.0)]
    expected = {"converges": "supported", "fails_often": "contradicted"}[rule]
    assert _verdict(rule, a + done, groups=["a", "b"]) == expected


def test_lower_loss() -> None:
    apart = [
        ("a", 1, "converged", 2.0),
        ("a", 2, "converged", 2.01),
        ("b", 1, "converged", 2.5),
        ("b", 2, "converged", 2.51),
    ]
    assert _verdict("lower_loss", apart, better="a", worse="b") == "supported"
    assert _verdict("lower_loss", apart, better="b", worse="a") == "contradicted"
    overlap = [
        ("a", 1, "converged", 2.0),
        ("a", 2, "converged", 2.6),
        ("b", 1, "converged", 2.1),
        ("b", 2, "converged", 2.5),
    ]
    assert _verdict("lower_loss", overlap, better="a", worse="b") == "inconclusive"
    blown = [
        ("a", 1, "converged", 2.0),
        ("a", 2, "converged", 2.1),
        ("b", 1, "diverged", math.nan),
        ("b", 2, "diverged", math.nan),
    ]
    assert _verdict("lower_loss", blown, better="a", worse="b") == "supported"
    assert _verdict("lower_loss", blown, better="b", worse="a") == "contradicted"
    verdict = judge(claim("lower_loss", better="a", worse="b"), frame(apart), NEUTRAL)
    expected = difference_interval([2.0, 2.01], [2.5, 2.51])
    assert verdict.numbers["unpaired high"] == pytest.approx(expected.high)
    assert verdict.numbers["paired difference"] == pytest.approx(-0.5)
    assert "minus b, paired by seed over 2 pairs: -0.500" in verdict.reason


def test_when_one_side_has_no_finite_loss_the_sentence_says_what_each_side_did() -> None:
    rows = [
        ("a", 1, "converged", 2.0),
        ("a", 2, "stalled", 3.2),
        ("b", 1, "diverged", math.nan),
        ("b", 2, "diverged", math.nan),
    ]
    verdict = judge(claim("lower_loss", better="a", worse="b"), frame(rows), NEUTRAL)
    assert verdict.verdict == "supported"
    assert "No finished run of b ended with a final val loss to compare (2 diverged)" in (
        verdict.reason
    )
    assert "a: 1 converged, 1 stalled" in verdict.reason
    reverse = judge(claim("lower_loss", better="b", worse="a"), frame(rows), NEUTRAL)
    assert reverse.verdict == "contradicted" and "a: 1 converged, 1 stalled" in reverse.reason


def test_a_blown_up_loss_is_no_level_to_compare() -> None:
    """A run that blew up ends with a finite loss far above a uniform guess: it failed to
    train, like a diverged run, and its number must not enter means and intervals (a side
    that only blew up read 'inconclusive', -35.975 (-124.6 to +52.7))."""
    rows = [
        ("a", 1, "converged", 2.0),
        ("a", 2, "converged", 2.05),
        ("b", 1, "blew up", 31.0),
        ("b", 2, "blew up", 45.0),
    ]
    verdict = judge(claim("lower_loss", better="a", worse="b"), frame(rows), NEUTRAL)
    assert verdict.verdict == "supported"
    assert "No finished run of b ended with a final val loss to compare (2 blew up)" in (
        verdict.reason
    )
    summary = summarize(frame(rows)).set_index("variant")
    assert summary.loc["a", "mean"] == pytest.approx(2.025)
    assert math.isnan(summary.loc["b", "mean"]) and summary.loc["b", "blew_up"] == 2
    # One blown-up run beside a converged one: the level is the converged run's alone.
    mixed = frame([*rows[:3], ("b", 2, "converged", 2.5)])
    assert summarize(mixed).set_index("variant").loc["b", "mean"] == pytest.approx(2.5)


def test_not_worse_is_judged_against_its_margin_not_zero() -> None:
    def rows(differences: tuple[float, float]) -> list[tuple]:
        base = {1: 2.0, 2: 2.4}
        return [("b", s, "converged", x) for s, x in base.items()] + [
            ("a", s, "converged", base[s] + d) for s, d in zip(base, differences, strict=True)
        ]

    args = {"better": "a", "worse": "b", "margin": 0.02}
    same = judge(claim("not_worse", **args), frame(rows((-0.001, 0.001))), NEUTRAL)
    assert same.verdict == "supported"  # lower_loss would call this inconclusive
    assert "upper bound is below the margin of +0.020 nats" in same.reason
    assert same.numbers["margin"] == 0.02 and same.numbers["high"] < 0.02
    assert _verdict("lower_loss", rows((-0.001, 0.001)), better="a", worse="b") == "inconclusive"
    worse = judge(claim("not_worse", **args), frame(rows((0.1, 0.101))), NEUTRAL)
    assert worse.verdict == "contradicted"
    assert "lower bound is above the margin of +0.020 nats" in worse.reason
    unclear = judge(claim("not_worse", **args), frame(rows((0.01, 0.03))), NEUTRAL)
    assert unclear.verdict == "inconclusive"
    assert "which includes the margin of +0.020 nats" in unclear.reason
    with pytest.raises(ValueError, match="margin must be a number of nats >= 0, not -1"):
        judge(claim("not_worse", better="a", worse="b", margin=-1), frame(rows((0, 0))), NEUTRAL)
    with pytest.raises(ValueError, match="needs the argument 'margin'"):
        judge(claim("not_worse", better="a", worse="b"), frame(rows((0, 0))), NEUTRAL)


def _sweep(variant: str, seed: int, losses: list[float]) -> list[tuple]:
    return [
        (variant, seed, "diverged" if math.isnan(x) else "converged", x, {"lr": lr})
        for lr, x in zip((0.01, 0.1, 1.0), losses, strict=True)
    ]


def test_less_sensitive() -> None:
    flat = _sweep("a", 1, [2.0, 2.0, 2.1]) + _sweep("a", 2, [2.0, 2.05, 2.1])
    steep = _sweep("b", 1, [2.0, 3.0, math.nan]) + _sweep("b", 2, [2.0, 3.1, math.nan])
    args = {"better": "a", "worse": "b", "field": "lr"}
    assert _verdict("less_sensitive", flat + steep, **args) == "supported"
    args = {"better": "b", "worse": "a", "field": "lr"}
    assert _verdict("less_sensitive", flat + steep, **args) == "contradicted"
    assert _verdict("less_sensitive", flat + steep[:3], **args) == "inconclusive"  # 1 seed


def test_lower_max_stable_lr() -> None:
    low = _sweep("a", 1, [2.0, math.nan, math.nan]) + _sweep("a", 2, [2.0, math.nan, math.nan])
    high = _sweep("b", 1, [2.0, 2.0, 2.0]) + _sweep("b", 2, [2.0, 2.0, 2.0])
    results = frame(low + high)
    assert max_stable(select(results, "a"), "lr") == 0.01
    args = {"lower": "a", "than": "b", "field": "lr", "factor": 3}
    assert _verdict("lower_max_stable_lr", low + high, **args) == "supported"
    args = {"lower": "b", "than": "a", "field": "lr", "factor": 3}
    assert _verdict("lower_max_stable_lr", low + high, **args) == "contradicted"
    near = _sweep("a", 1, [2.0, 2.0, math.nan]) + _sweep("a", 2, [2.0, 2.0, math.nan])
    args = {"lower": "a", "than": "b", "field": "lr", "factor": 30}
    assert _verdict("lower_max_stable_lr", near + high, **args) == "inconclusive"


def test_fails_deep() -> None:
    args = {"deep": "a", "reference": "b"}
    ref = [("b", 1, "converged", 2.0), ("b", 2, "converged", 2.01)]
    failing = [("a", 1, "stalled", 3.2), ("a", 2, "diverged", math.nan)]
    assert _verdict("fails_deep", failing + ref, **args) == "supported"
    fine = [("a", 1, "converged", 1.9), ("a", 2, "converged", 2.0)]
    assert _verdict("fails_deep", fine + ref, **args) == "contradicted"
    worse = [("a", 1, "converged", 2.5), ("a", 2, "converged", 2.51)]
    assert _verdict("fails_deep", worse + ref, **args) == "inconclusive"
    # With one finished reference run there is nothing to compare with: no contradiction.
    verdict = judge(claim("fails_deep", **args), frame(fine + ref[:1]), NEUTRAL)
    assert verdict.verdict == "inconclusive" and "only 1 finished run(s) of b" in verdict.reason


def _ffn(mult: int, losses: tuple[float, ...], outcome: str = "converged") -> list[tuple]:
    """One run per loss (seeds 1, 2, ...) of the variant `FFN <mult>×`."""
    return [(f"FFN {mult}×", s + 1, outcome, x, {"ffn_mult": mult}) for s, x in enumerate(losses)]


SWEET_4 = {"at": {"ffn_mult": 4}, "field": "ffn_mult"}
SMALLER_WORSE = _ffn(1, (2.5, 2.53)) + _ffn(2, (2.3, 2.33))


def test_sweet_spot() -> None:
    best_at_4 = _ffn(1, (2.5, 2.51)) + _ffn(4, (2.0, 2.01)) + _ffn(16, (2.0, 2.02))
    verdict = judge(claim("sweet_spot", **SWEET_4), frame(best_at_4), NEUTRAL)
    assert verdict.verdict == "supported"
    assert "and no larger one is lower in the mean or in half of the seeds" in verdict.reason
    bigger_wins = _ffn(1, (2.5, 2.51)) + _ffn(4, (2.0, 2.01)) + _ffn(16, (1.5, 1.51))
    verdict = judge(claim("sweet_spot", **SWEET_4), frame(bigger_wins), NEUTRAL)
    assert verdict.verdict == "contradicted"
    assert "FFN 16× is lower than FFN 4×, significantly" in verdict.reason
    unclear = _ffn(1, (2.0, 2.6)) + _ffn(4, (2.0, 2.4))
    verdict = judge(claim("sweet_spot", **SWEET_4), frame(unclear), NEUTRAL)
    assert verdict.verdict == "inconclusive"
    assert "FFN 4× is not significantly lower than FFN 1×" in verdict.reason


def test_sweet_spot_is_not_supported_when_larger_values_are_lower_in_the_mean() -> None:
    # 8× and 16× are lower than 4× in every seed, by too little for the interval to say so.
    rows = SMALLER_WORSE + _ffn(4, (2.0, 2.02)) + _ffn(8, (1.998, 2.0)) + _ffn(16, (1.99, 2.001))
    verdict = judge(claim("sweet_spot", **SWEET_4), frame(rows), NEUTRAL)
    assert verdict.verdict == "inconclusive"
    assert (
        "FFN 8× and FFN 16× are lower than FFN 4× in the mean (by 0.011 and 0.015), "
        "not significantly" in verdict.reason
    )
    assert verdict.numbers["lower than"] == "1, 2"
    assert len(verdict.comparisons) == 4


def test_sweet_spot_is_pending_while_runs_of_the_field_have_not_finished() -> None:
    running = _ffn(8, (math.nan, math.nan), "") + _ffn(16, (math.nan, math.nan), "")
    rows = SMALLER_WORSE + _ffn(4, (2.0, 2.02)) + running
    verdict = judge(claim("sweet_spot", **SWEET_4), frame(rows), NEUTRAL)
    assert verdict.verdict == "pending"
    assert verdict.reason == "Pending: 4 of the 10 runs it rests on have not ended (4 running)."
    # Finished and higher, with one seed of 16× still to come: not yet.
    behind = _ffn(8, (2.2, 2.23)) + _ffn(16, (2.2, 2.23, math.nan))
    rows = SMALLER_WORSE + _ffn(4, (2.0, 2.02)) + behind
    rows[-1] = (*rows[-1][:2], "", *rows[-1][3:])
    assert judge(claim("sweet_spot", **SWEET_4), frame(rows), NEUTRAL).verdict == "pending"
    rows[-1] = (*rows[-1][:2], "converged", 2.25, *rows[-1][4:])
    assert judge(claim("sweet_spot", **SWEET_4), frame(rows), NEUTRAL).verdict == "supported"


def test_sweet_spot_when_every_run_of_it_failed_or_nothing_smaller_ran() -> None:
    # Every run of 4× diverged: no interval exists, so no "significantly".
    rows = SMALLER_WORSE + _ffn(4, (math.nan, math.nan), "diverged") + _ffn(8, (2.2, 2.21))
    verdict = judge(claim("sweet_spot", **SWEET_4), frame(rows), NEUTRAL)
    assert verdict.verdict == "contradicted"
    assert "Every finished run of FFN 4× failed to train, while FFN 1×, FFN 2× and FFN 8× " in (
        verdict.reason
    )
    assert "significantly" not in verdict.reason
    # Nothing smaller than 4× ran: the sentence after the numbers starts with a capital.
    rows = _ffn(4, (2.0, 2.02)) + _ffn(8, (2.2, 2.23))
    verdict = judge(claim("sweet_spot", **SWEET_4), frame(rows), NEUTRAL)
    assert verdict.verdict == "inconclusive"
    assert ". No ffn_mult smaller than 4 was run." in verdict.reason


def test_param_share_is_computed_from_the_config() -> None:
    verdict = judge(
        claim("param_share", variant="a", part="ffn", low=0.6, high=0.72), frame([]), NEUTRAL
    )
    config = NEUTRAL.config_for("a").model
    d, f = config.d_model, config.d_ff
    ffn = 2 * d * f + f + d  # two matrices with biases
    share = verdict.numbers["share"]
    assert share == pytest.approx(ffn / verdict.numbers["block parameters"])
    assert verdict.verdict == ("supported" if 0.6 <= share <= 0.72 else "contradicted")
    narrow = claim("param_share", variant="a", part="ffn", low=0.0, high=0.1)
    assert judge(narrow, frame([]), NEUTRAL).verdict == "contradicted"


def test_no_finished_run_is_pending_and_bad_rules_are_refused() -> None:
    assert judge(claim("converges", groups=["a"]), frame([]), NEUTRAL).verdict == "pending"
    running = frame([("a", 1, "", math.nan), ("a", 2, "", math.nan)])
    verdict = judge(claim("converges", groups=["a"]), running, NEUTRAL)
    assert verdict.verdict == "pending" and "2 of the 2 runs" in verdict.reason
    with pytest.raises(ValueError, match="'guess' is not one of"):
        judge(claim("guess"), running, NEUTRAL)
    with pytest.raises(ValueError, match="needs the argument 'groups'"):
        judge(claim("converges"), running, NEUTRAL)
    assert set(RULES) >= {"converges", "lower_loss", "param_share"}


def test_sensitivity_table_per_group() -> None:
    flat = _sweep("a", 1, [2.0, 2.0, 2.1]) + _sweep("a", 2, [2.0, 2.05, 2.1])
    steep = _sweep("b", 1, [2.0, 3.0, math.nan])
    rows = [(v, s, o, x, {**extra, "group": v}) for v, s, o, x, extra in flat + steep]
    table = sensitivity_table(frame(rows), "lr", "group").set_index("group")
    per_seed = [(0 + 0 + 0.1) / 3, (0 + 0.05 + 0.1) / 3]  # best 2.0 in both seeds
    assert table.loc["a", "sensitivity"] == pytest.approx(sum(per_seed) / 2)
    assert table.loc["a", "seeds"] == 2 and table.loc["a", "low"] < table.loc["a", "high"]
    assert table.loc["b", "sensitivity"] == pytest.approx((0 + 1 + 2) / 3)  # nan -> init 4
    assert math.isnan(table.loc["b", "low"])
    # The best loss over the sweep: each seed's lowest finite loss, then their mean.
    assert table.loc["a", "best"] == pytest.approx(2.0)
    assert table.loc["b", "best"] == pytest.approx(2.0) and math.isnan(table.loc["b", "best_low"])
    uneven = _sweep("c", 1, [2.2, 2.0, 2.1]) + _sweep("c", 2, [2.4, 2.3, math.nan])
    rows = [(v, s, o, x, {**extra, "group": v}) for v, s, o, x, extra in uneven]
    table = sensitivity_table(frame(rows), "lr", "group").set_index("group")
    assert table.loc["c", "best"] == pytest.approx((2.0 + 2.3) / 2)
    assert table.loc["c", "best_low"] < 2.15 < table.loc["c", "best_high"]


# ----------------------------------------------- adversarial frames (issue 38's audit)


def test_a_diverged_seed_of_the_winning_side_is_evidence_not_absence() -> None:
    """LayerNorm diverged in 1 of 3 seeds and was lower in the other 2: main said
    'supported, over 2 pairs' (the diverged seed dropped), while a stall in that seed made
    it inconclusive. A divergence is the worst outcome: never better than a stall."""
    norm = [("a", 1, "converged", 2.0), ("a", 2, "converged", 2.01)]
    batch = [("b", s, "converged", 2.1 + s / 100) for s in (1, 2, 3)]
    args = {"better": "a", "worse": "b"}
    diverged = judge(
        claim("lower_loss", **args), frame([*norm, ("a", 3, "diverged", math.nan), *batch]), NEUTRAL
    )
    stalled = judge(
        claim("lower_loss", **args), frame([*norm, ("a", 3, "stalled", 3.2), *batch]), NEUTRAL
    )
    assert stalled.verdict == "inconclusive"
    assert diverged.verdict == "inconclusive"
    assert diverged.reason.endswith(
        "below zero, but a failed to train in 1 seed where b trained: a failure is the worst "
        "outcome, not a missing one."
    )
    blew_up = frame([*norm, ("a", 3, "blew up", 31.0), *batch])
    assert judge(claim("lower_loss", **args), blew_up, NEUTRAL).verdict == "inconclusive"
    margin = claim("not_worse", margin=0.05, **args)
    assert judge(
        margin, frame([*norm, ("a", 3, "diverged", math.nan), *batch]), NEUTRAL
    ).verdict == ("inconclusive")
    assert judge(margin, frame([*norm, *batch[:2]]), NEUTRAL).verdict == "supported"


def test_a_failure_of_the_losing_side_never_weakens_the_winner() -> None:
    """A capped or dropped failure must not widen the winner's interval into 'inconclusive':
    the loser failing alone in a seed is named and the verdict stands."""
    trained = [("a", s, "converged", 2.3 + s / 100) for s in (1, 2)]
    batch = [("b", s, "converged", 2.1 + s / 100) for s in (1, 2, 3)]
    rows = [*trained, ("a", 3, "diverged", math.nan), *batch]
    verdict = judge(claim("lower_loss", better="b", worse="a"), frame(rows), NEUTRAL)
    assert verdict.verdict == "supported"
    assert "below zero; a failed to train in 1 seed where b trained." in verdict.reason
    # Both sides failed in the same seed: no seed where one failed alone.
    both = [*rows, ("b", 4, "diverged", math.nan), ("a", 4, "diverged", math.nan)]
    verdict = judge(claim("lower_loss", better="b", worse="a"), frame(both), NEUTRAL)
    assert verdict.comparisons[0].lone_failures == (0, 1)  # (b's, a's): seed 3 only
    # Claimed the other way round: a is higher and failed alone too, a contradiction.
    reverse = judge(claim("lower_loss", better="a", worse="b"), frame(rows), NEUTRAL)
    assert reverse.verdict == "contradicted"


# Per rule: args and a frame that supports the claim. The adversarial frames below change it.
SUPPORTING: dict[str, tuple[dict, list[tuple]]] = {
    "converges": ({"groups": ["a"]}, [("a", 1, "converged", 2.0), ("a", 2, "converged", 2.1)]),
    "fails_often": ({"groups": ["a"]}, [("a", 1, "diverged", math.nan), ("a", 2, "stalled", 3.2)]),
    "lower_loss": (
        {"better": "a", "worse": "b"},
        [
            *[("a", 1, "converged", 2.0), ("a", 2, "converged", 2.01)],
            *[("b", 1, "converged", 2.5), ("b", 2, "converged", 2.51)],
        ],
    ),
    "not_worse": (
        {"better": "a", "worse": "b", "margin": 0.05},
        [
            *[("a", 1, "converged", 2.0), ("a", 2, "converged", 2.4)],
            *[("b", 1, "converged", 2.001), ("b", 2, "converged", 2.399)],
        ],
    ),
    "less_sensitive": (
        {"better": "a", "worse": "b", "field": "lr"},
        _sweep("a", 1, [2.0, 2.0, 2.1])
        + _sweep("a", 2, [2.0, 2.05, 2.1])
        + _sweep("b", 1, [2.0, 3.0, math.nan])
        + _sweep("b", 2, [2.0, 3.1, math.nan]),
    ),
    "lower_max_stable_lr": (
        {"lower": "a", "than": "b", "field": "lr", "factor": 3},
        _sweep("a", 1, [2.0, math.nan, math.nan])
        + _sweep("a", 2, [2.0, math.nan, math.nan])
        + _sweep("b", 1, [2.0, 2.0, 2.0])
        + _sweep("b", 2, [2.0, 2.0, 2.0]),
    ),
    "fails_deep": (
        {"deep": "a", "reference": "b"},
        [
            *[("a", 1, "stalled", 3.2), ("a", 2, "diverged", math.nan)],
            *[("b", 1, "converged", 2.0), ("b", 2, "converged", 2.01)],
        ],
    ),
    "sweet_spot": (SWEET_4, SMALLER_WORSE + _ffn(4, (2.0, 2.02)) + _ffn(8, (2.2, 2.23))),
}


def _with(row: tuple, **fields) -> tuple:
    """A frame row with its outcome / loss / status changed."""
    variant, seed, outcome, loss, *extra = row
    extra_fields = dict(extra[0]) if extra else {}
    outcome, loss = fields.pop("outcome", outcome), fields.pop("loss", loss)
    return (variant, seed, outcome, loss, {**extra_fields, **fields})


@pytest.mark.parametrize("rule", sorted(SUPPORTING))
def test_every_rule_against_adversarial_frames(rule: str) -> None:
    """Each rule, from a frame that supports its claim: a run still running makes it
    pending; a run stopped without a result, or a whole side missing, is never support;
    every run diverging supports only a claim that runs fail."""
    args, rows = SUPPORTING[rule]
    assert _verdict(rule, rows, **args) == "supported"
    running = [_with(rows[0], outcome="", loss=math.nan), *rows[1:]]
    verdict = judge(claim(rule, **args), frame(running), NEUTRAL)
    assert verdict.verdict == "pending" and "1 running" in verdict.reason
    stopped = [_with(rows[0], outcome="", loss=math.nan, status="stopped"), *rows[1:]]
    verdict = judge(claim(rule, **args), frame(stopped), NEUTRAL)
    assert verdict.verdict == "inconclusive"
    assert verdict.reason.startswith("Cannot judge: 1 of the ") and "(1 stopped)" in verdict.reason
    if rule not in ("converges", "fails_often"):  # pooled over one group here
        last = rows[-1][0]
        one_sided = [r for r in rows if r[0] != last]
        assert _verdict(rule, one_sided, **args) != "supported"
    diverged = [_with(r, outcome="diverged", loss=math.nan) for r in rows]
    expected = "supported" if rule == "fails_often" else None
    got = _verdict(rule, diverged, **args)
    assert got == expected if expected else got != "supported"


def test_sweet_spot_needs_a_larger_value_and_the_seeds_not_only_the_mean() -> None:
    """Main said supported with only 1, 2 and 4 run; and with 8× lower than 4× in 2 of 3
    seeds while one outlier seed made 4× lower in the mean."""
    smaller = _ffn(1, (2.5, 2.53, 2.52)) + _ffn(2, (2.3, 2.33, 2.31))
    nothing_larger = smaller + _ffn(4, (2.0, 2.02, 2.01))
    verdict = judge(claim("sweet_spot", **SWEET_4), frame(nothing_larger), NEUTRAL)
    assert verdict.verdict == "inconclusive"
    assert "No ffn_mult larger than 4 was run." in verdict.reason
    # 8× beats 4× by 0.01 in seeds 1 and 2, loses by 0.3 in seed 3: 4× is lower in the mean.
    outlier = nothing_larger + _ffn(8, (1.99, 2.01, 2.31))
    verdict = judge(claim("sweet_spot", **SWEET_4), frame(outlier), NEUTRAL)
    assert verdict.verdict == "inconclusive"
    assert verdict.reason.endswith("FFN 8× is lower than FFN 4× in 2 of 3 seeds.")
    fine = nothing_larger + _ffn(8, (2.2, 2.23, 2.21))
    assert judge(claim("sweet_spot", **SWEET_4), frame(fine), NEUTRAL).verdict == "supported"


def test_lower_max_stable_lr_waits_for_the_runs_that_decide_it() -> None:
    """Main said supported while b's runs at the largest lr were still running: had they
    diverged, b's largest stable lr would have been lower."""
    low = _sweep("a", 1, [2.0, math.nan, math.nan]) + _sweep("a", 2, [2.0, math.nan, math.nan])
    high = _sweep("b", 1, [2.0, 2.0, math.nan]) + _sweep("b", 2, [2.0, 2.0, math.nan])
    high = [_with(r, outcome="") if r[4]["lr"] == 1.0 else r for r in high]
    args = {"lower": "a", "than": "b", "field": "lr", "factor": 3}
    assert _verdict("lower_max_stable_lr", low + high, **args) == "pending"


def test_fails_deep_is_judged_against_its_contrast() -> None:
    """Main said supported when the deep reference (residuals on) failed as well."""
    args = {"deep": "a", "reference": "b"}
    failing = [("a", 1, "stalled", 3.2), ("a", 2, "diverged", math.nan)]
    ref_fails = [("b", 1, "diverged", math.nan), ("b", 2, "converged", 2.0)]
    verdict = judge(claim("fails_deep", **args), frame(failing + ref_fails), NEUTRAL)
    assert verdict.verdict == "inconclusive"
    assert verdict.reason.endswith(
        "but of 2 of b, 1 failed to train (1 diverged) as well, so the failure is not the deep "
        "group's own."
    )
    one_ref = [("b", 1, "converged", 2.0)]
    verdict = judge(claim("fails_deep", **args), frame(failing + one_ref), NEUTRAL)
    assert verdict.verdict == "inconclusive" and "of b, the contrast; 2 needed" in verdict.reason
