"""The induction-heads rule on constructed series (core/findings/induction.py).

Each series is made up to sit just inside or just past the rule's thresholds; none says
what a configuration does (BENCHMARKS.md and docs/findings.md name the real runs).
"""

from __future__ import annotations

import numpy as np
import pytest

from blockviz.core import config as cfg
from blockviz.core import findings as fd
from blockviz.core import spec
from blockviz.core.findings.base import NO_DATA, ONE_BLOCK, Finding, num
from blockviz.core.findings.induction import formation_threshold, induction_heads, loss_bend
from blockviz.core.findings.thresholds import (
    BEND_FACTOR,
    BEND_WINDOW,
    BEND_Z,
    PREFIX_OVER_UNIFORM,
    PREFIX_RELEASE,
    PREFIX_REVOKE,
    PREFIX_THRESHOLD,
)
from blockviz.core.induction import repeat_half, uniform_prefix_score
from tests.helpers import head_rows, layers_frame, scalars, series

N_HEAD = 2
PROBES = tuple(range(0, 2001, 100))


def prefix_table(score_of: dict[tuple[int, int], dict[int, float]], n_layer: int = 2):
    """step -> [layer][head] prefix scores: 0.01 everywhere but the (layer, head) given."""
    return {
        step: [
            [score_of.get((layer, head), {}).get(step, 0.01) for head in range(N_HEAD)]
            for layer in range(n_layer)
        ]
        for step in PROBES
    }


def bent_loss(
    at: int, before: float, after: float, steps: int = 2001, noise: float = 0.01
) -> dict[int, float]:
    """A train loss falling `before` nats per 1,000 steps until `at`, `after` from then,
    each step `noise` above or below the line in turn (the batches' noise)."""
    return {
        step: 4.0
        - before * min(step, at) / 1000
        - after * max(0, step - at) / 1000
        + noise * (-1) ** step
        for step in range(steps)
    }


def run(scores: dict, loss: dict[int, float] | None = None, n_layer: int = 2, copy=None, **config):
    groups = [head_rows(spec.PREFIX_SCORE, prefix_table(scores, n_layer))]
    if copy is not None:
        groups.append(head_rows(spec.COPY_SCORE, {step: copy for step in PROBES}))
    loss = loss if loss is not None else bent_loss(1000, 1.0, 1.0)
    frame = layers_frame(*groups)
    return series(scalars(**{"train/loss": loss}), frame, n_layer=n_layer, **config)


def rising(start: int, value: float = 0.6) -> dict[int, float]:
    """A score at 0.01 before `start` and `value` from it on."""
    return {step: value if step >= start else 0.01 for step in PROBES}


def test_a_head_that_crosses_and_stays_formed_at_its_crossing_and_the_loss_bend_is_measured():
    copy = [[0.1, 0.2], [0.3, 0.9]]
    found = induction_heads(
        run({(1, 1): rising(800), (1, 0): rising(1200)}, bent_loss(800, 0.5, 2.0), copy=copy)
    )
    assert found.severity == "info" and found.title == "Induction heads formed at step 800"
    assert found.step == 800 and found.series == spec.PREFIX_SCORE
    evidence = found.evidence
    assert (evidence["layer"], evidence["head"], evidence["heads"]) == (1, 1, 2)
    assert evidence["score"] == pytest.approx(0.6) and evidence["copying"] == pytest.approx(0.9)
    bend = evidence["bend"]
    assert bend["before"] == pytest.approx(-0.5, rel=0.01)
    assert bend["after"] == pytest.approx(-2.0, rel=0.01)
    assert bend["ratio"] == pytest.approx(4.0, rel=0.01) and bend["bends"] is True
    assert bend["z"] > BEND_Z
    assert "block 1 head 1 reached 0.6 at step 800" in found.text
    assert "Also formed: block 1 head 0." in found.text
    assert "The training loss bends there" in found.text and "(steeper)." in found.text


@pytest.mark.parametrize(
    ("after", "bends"),
    [
        (1.0, False),
        (BEND_FACTOR * 0.99, False),
        (BEND_FACTOR * 1.01, True),
        (0.99 / BEND_FACTOR, True),
    ],
)
def test_the_bend_test_asks_for_a_factor_either_way(after, bends):
    found = induction_heads(run({(1, 0): rising(1000)}, bent_loss(1000, 0.5, 0.5 * after)))
    assert found.evidence["bend"]["bends"] is bends
    assert ("bends there" in found.text) is bends


def test_a_bend_lost_in_the_batches_noise_is_not_a_bend():
    """The same 4× change of slope, but each loss 0.5 nats off the line: the change is
    under BEND_Z standard errors."""
    noisy = induction_heads(run({(1, 0): rising(1000)}, bent_loss(1000, 0.5, 2.0, noise=0.5)))
    bend = noisy.evidence["bend"]
    assert bend["ratio"] == pytest.approx(4.0, rel=0.1) and bend["z"] < BEND_Z
    assert bend["bends"] is False and "does not bend" in noisy.text


@pytest.mark.parametrize("block_size", [64, 256, 16])
def test_a_score_at_the_threshold_counts_and_one_just_below_does_not(block_size):
    threshold = formation_threshold(block_size)
    at = run({(1, 0): rising(500, threshold)}, block_size=block_size)
    assert induction_heads(at).step == 500
    just_below = rising(500, threshold - 1e-3)
    below = induction_heads(run({(1, 0): just_below}, block_size=block_size))
    assert below.title == "No induction heads yet"
    assert below.evidence["largest"] == pytest.approx(threshold - 1e-3)


def test_the_threshold_is_a_multiple_of_uniform_attention_in_short_contexts():
    """At block_size 16 a head attending uniformly scores 0.083, over PREFIX_THRESHOLD: the
    threshold is then PREFIX_OVER_UNIFORM times that, and a uniform head never forms."""
    for block_size in (16, 64, 256):
        uniform = uniform_prefix_score(repeat_half(block_size))
        expected = max(PREFIX_THRESHOLD, PREFIX_OVER_UNIFORM * uniform)
        assert formation_threshold(block_size) == pytest.approx(expected)
    assert formation_threshold(16) > PREFIX_THRESHOLD > formation_threshold(256) / 2
    assert formation_threshold(None) == PREFIX_THRESHOLD
    uniform_16 = uniform_prefix_score(repeat_half(16))
    flat = {step: uniform_16 for step in PROBES}
    found = induction_heads(run({(1, 0): flat, (1, 1): flat}, block_size=16))
    assert found.title == "No induction heads yet"
    assert f"at or above {num(formation_threshold(16))} at 2 probes in a row" in found.text


def test_a_score_that_crosses_and_falls_back_has_not_formed():
    spike = {step: 0.7 if 600 <= step <= 900 else 0.02 for step in PROBES}
    found = induction_heads(run({(1, 1): spike}))
    assert found.title == "No induction heads yet" and found.severity == "info"
    assert found.step is None and found.evidence["step"] == PROBES[-1]  # nothing to mark
    assert found.evidence["largest"] == pytest.approx(0.7) and found.evidence["at"] == 600
    assert "which fell back to 0.02" in found.text
    half = repeat_half(cfg.RunConfig().model.block_size)
    assert f"(attending uniformly scores {num(uniform_prefix_score(half))})" in found.text
    # it crosses again and stays: formed from the second crossing
    again = {step: 0.7 if 600 <= step <= 900 or step >= 1500 else 0.02 for step in PROBES}
    assert induction_heads(run({(1, 1): again})).step == 1500


def test_a_head_that_crosses_at_the_newest_probe_alone_has_not_formed_yet():
    found = induction_heads(run({(0, 1): rising(PROBES[-1])}))
    assert found.title == "No induction heads yet"


def test_the_bend_needs_a_window_of_logged_loss_on_each_side():
    found = induction_heads(run({(1, 0): rising(1900)}))
    assert found.evidence["bend"]["bends"] is None and found.evidence["bend"]["after"] is None
    assert f"needs {BEND_WINDOW:,} logged steps on each side of step 1,900" in found.text


def test_a_flat_loss_before_the_step_gives_no_ratio():
    loss = {step: 2.0 for step in range(2001)}
    bend = loss_bend(run({}, loss), 1000)
    assert bend["ratio"] is None and bend["bends"] is None


def test_a_window_before_step_0_or_past_the_newest_logged_loss_has_no_slope():
    loss = bent_loss(1000, 1.0, 1.0)
    assert loss_bend(run({}, loss), BEND_WINDOW - 1)["before"] is None
    assert loss_bend(run({}, loss), BEND_WINDOW)["before"] == pytest.approx(-1.0, rel=0.01)
    last = max(loss)
    assert loss_bend(run({}, loss), last - BEND_WINDOW + 2)["after"] is None
    assert loss_bend(run({}, loss), last - BEND_WINDOW + 1)["after"] == pytest.approx(
        -1.0, rel=0.01
    )
    sparse = {step: value for step, value in loss.items() if step % 50 == 0}  # 5 a window
    assert loss_bend(run({}, sparse), 1000)["before"] is None


def rule_gap(found: list[Finding]) -> str:
    (healthy,) = [f for f in found if f.rule == "healthy"]
    return healthy.text


def test_a_one_block_model_is_not_checked():
    one = run({(0, 0): rising(500)}, n_layer=1)
    assert induction_heads(one) is None
    assert fd.RULES["induction_heads"].gap(one) == ONE_BLOCK


def test_a_model_without_attention_records_nothing_to_check():
    no_heads = series(scalars(**{"train/loss": bent_loss(1000, 1.0, 1.0)}), n_layer=2)
    assert induction_heads(no_heads) is None
    assert fd.RULES["induction_heads"].gap(no_heads) == NO_DATA


def test_too_few_probes_are_not_enough_to_say_a_head_formed():
    few = series(
        scalars(**{"train/loss": bent_loss(1000, 1.0, 1.0)}),
        layers_frame(head_rows(spec.PREFIX_SCORE, {0: [[0.01, 0.01]] * 2, 100: [[0.9, 0.9]] * 2})),
        n_layer=2,
    )
    assert induction_heads(few).title == "No induction heads yet"
    gap = fd.RULES["induction_heads"].gap(few)
    assert gap is not None and "only 1 probe after step 0" in gap
    found = fd.evaluate(few)
    assert "induction heads" in rule_gap(found)


# -- issue 39: a formation that does not flip on noise, and collapsed heads ----------------

DENSE = tuple(range(0, 3001, 25))  # the control's probes: every 25 steps up to 3,000


def settling_run(
    score: dict[int, float], error: float, entropy: dict[int, float] | None = None, head=(1, 0)
):
    """A 2-block, 2-head run probed every 25 steps: `score` and `error` (its standard
    error) at `head`, 0.01 ± 0.002 elsewhere; every head's attention entropy 1.5 nats but
    `head`'s where `entropy` says."""
    entropy = entropy or {}

    def grid(value_of, other):
        return {
            step: [
                [value_of(step) if (lay, h) == head else other for h in range(N_HEAD)]
                for lay in range(2)
            ]
            for step in DENSE
        }

    frame = layers_frame(
        head_rows(spec.PREFIX_SCORE, grid(lambda s: score[s], 0.01)),
        head_rows(spec.PREFIX_SCORE_SE, grid(lambda s: error, 0.002)),
        head_rows(spec.ATTN_ENTROPY, grid(lambda s: entropy.get(s, 1.5), 1.5)),
    )
    return series(scalars(**{"train/loss": bent_loss(1500, 0.5, 1.5, steps=3001)}), frame)


def prefix(run, step: int):
    """The run as it was when its newest probe was `step`."""
    return series(
        run.scalars[run.scalars.step <= step], run.layers[run.layers.step <= step], n_layer=2
    )


def settles_at(level: float, rise: int = 1550, noise: float = 0.006, seed: int = 3):
    """0.01 until `rise`, 0.13 for 300 steps, then `level` with noise: the control's shape."""
    draws = np.random.default_rng(seed)
    return {
        step: 0.01 if step < rise else 0.13 if step < rise + 300 else level + draws.normal(0, noise)
        for step in DENSE
    }


def test_a_score_that_settles_near_the_threshold_names_one_step_at_every_prefix():
    """Issue 39, defect 4: on the control the finding said "formed at 1,575", then "No
    induction heads yet" (2,850), then "formed at 2,875", as scores settled near 0.05. Read
    at every probe of the run, the finding names one step from its formation on."""
    run = settling_run(settles_at(PREFIX_THRESHOLD), error=0.006)
    steps = []
    for step in DENSE:
        found = induction_heads(prefix(run, step))
        steps.append(found.step)
    assert steps[: DENSE.index(1550) + 1] == [None] * (DENSE.index(1550) + 1)
    assert set(steps[DENSE.index(1575) :]) == {1550}  # formed at 1,550, seen from 1,575
    found = induction_heads(run)
    assert found.evidence["score_se"] == pytest.approx(0.006)
    assert "reached 0.13 ± 0.006 at step 1,550" in found.text


def test_a_score_within_two_standard_errors_of_the_threshold_has_not_formed():
    flat = dict.fromkeys(DENSE, PREFIX_THRESHOLD + 0.01)
    assert induction_heads(settling_run(flat, error=0.0051)).title == "No induction heads yet"
    formed = induction_heads(settling_run(flat, error=0.0049))
    assert formed.title == "Induction heads formed at step 0"


def test_a_formed_head_un_forms_only_after_its_revoke_streak_clearly_below():
    """Once formed, a head un-forms after PREFIX_REVOKE probes in a row whose upper bound
    is under PREFIX_RELEASE × the threshold; PREFIX_REVOKE − 1 such probes change nothing."""
    low = PREFIX_RELEASE * PREFIX_THRESHOLD - 0.01  # with 2 standard errors of 0.002 below
    for count, formed in ((PREFIX_REVOKE - 1, True), (PREFIX_REVOKE, False)):
        drop = set(DENSE[-count:])
        score = {step: 0.01 if step < 500 else low if step in drop else 0.2 for step in DENSE}
        found = induction_heads(settling_run(score, error=0.002))
        assert (found.step == 500) is formed, count
    # an upper bound over the release level is not clearly below, however long it lasts
    near = {step: 0.01 if step < 500 else 0.2 if step < 1000 else 0.02 for step in DENSE}
    assert induction_heads(settling_run(near, error=0.004)).step == 500


def test_runs_recorded_without_standard_errors_count_their_scores_as_exact():
    run = settling_run(settles_at(0.2), error=0.0)
    old = series(run.scalars, run.layers[run.layers.stat != spec.PREFIX_SCORE_SE], n_layer=2)
    found = induction_heads(old)
    assert found.step == 1550 and found.evidence["score_se"] is None
    assert "recorded no standard error" in found.text and "±" not in found.text


def test_a_collapsed_head_scoring_by_chance_is_not_an_induction_head():
    """Issue 39, defect 6: a first-block head attending to one position (entropy 0.0002 to
    0.011 nats) scored exactly 3/32 and 2.5/32 and fired the finding."""
    chance = {step: 0.01 if step < 500 else (3 / 32 if step % 50 else 2.5 / 32) for step in DENSE}
    shut = {step: 0.0002 + 0.011 * (step % 100) / 100 for step in DENSE if step >= 500}
    found = induction_heads(settling_run(chance, error=0.004, entropy=shut, head=(0, 1)))
    assert found.title == "No induction heads yet"
    assert "Not counted: block 0 head 1, whose attention had collapsed" in found.text
    assert found.evidence["collapsed"] == [[0, 1]]
    # the same scores from a head whose attention spreads: formed
    spread = induction_heads(settling_run(chance, error=0.004, head=(0, 1)))
    assert spread.title == "Induction heads formed at step 500"
    # a formed head whose attention collapses later un-forms after PREFIX_REVOKE probes
    later = {step: 0.0005 for step in DENSE if step >= 2000}
    score = {step: 0.01 if step < 500 else 0.3 for step in DENSE}
    collapsed = induction_heads(settling_run(score, error=0.004, entropy=later))
    assert collapsed.title == "No induction heads yet"
