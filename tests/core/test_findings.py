"""The findings rules on constructed series, at their thresholds (core/findings/).

Each series here is made up to sit just inside or just past one documented threshold; no
series says what any configuration does (the real runs in test_findings_runs.py do that).
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from blockviz.core import config as cfg
from blockviz.core import findings as fd
from blockviz.core.findings.base import DIVERGENCE, SPIKE, Finding, RunSeries
from blockviz.core.findings.suggestions import EVIDENCE, UNTESTED
from blockviz.core.findings.thresholds import (
    ATTN_LOGIT_MAX,
    DEAD_FRAC,
    ENTROPY_FLOOR,
    GRAD_DEPTH_RATIO,
    LOG_Z_MAX,
    MASSIVE_RATIO,
    OUTPUT_LOGIT_MAX,
    OVERFIT_RISE,
    RANK_COS,
    RESID_GROWTH,
    RESID_RMS,
    SPIKE_FACTOR,
    SPIKE_WINDOW,
    STALL_MARGIN,
    STALL_MIN_STEPS,
    UPDATE_HIGH,
    UPDATE_LOW,
    UPDATE_NORMAL,
)
from blockviz.core.findings.training import headline
from blockviz.views import run_findings
from tests.helpers import (
    N_LAYER,
    UNIGRAM,
    flat_loss,
    head_rows,
    layer_rows,
    layers_frame,
    probed_at,
    scalars,
    series,
)


def rules(found: list[Finding]) -> set[str]:
    return {f.rule for f in found}


def only(rule: str, run: RunSeries) -> Finding:
    found = [f for f in fd.evaluate(run) if f.rule == rule]
    assert len(found) == 1, [f.rule for f in fd.evaluate(run)]
    return found[0]


# ----------------------------------------------------------------------------- healthy


def test_nothing_wrong_is_said_explicitly():
    found = fd.evaluate(series(scalars(**{"train/loss": flat_loss(200)})))
    assert [f.rule for f in found] == ["healthy"]
    assert found[0].severity == "ok"
    # only the loss was recorded: the rules that read the probes say they could not check
    assert "None of the 4 checks this run has the data for found a problem up to step 199" in (
        found[0].text
    )
    assert "Not checked, no data recorded: gradients across depth, slow updates" in found[0].text


STATE_CHECKS = (
    "gradients across depth, slow updates, large updates, dead FFN units, attention entropy "
    "collapse, attention-logit growth, rank collapse, residual-stream growth, massive "
    "activations, output-logit growth"
)


def test_a_run_probed_once_after_step_0_names_the_checks_it_could_not_make():
    found = fd.evaluate(probed_at((0, 299)))
    (finding,) = found  # no state rule can fire on one probe after step 0
    assert finding.rule == "healthy" and finding.severity == "info"
    assert finding.title == "10 of 16 checks could not be made: too few probes"
    assert finding.text.startswith(
        "None of the 5 checks that could be made found a problem up to step 299"
    )
    assert (
        f"Could not check {STATE_CHECKS}: only 1 probe after step 0, and a state needs 2 probes "
        "in a row after it, so a problem there would not show" in finding.text
    )
    assert "None of the 16 checks" not in finding.text and finding.title != "Healthy"
    assert finding.suggestion.changes == {"probe_interval": 30}
    assert finding.suggestion.source == "a rule of thumb; untested here"
    # Listed where runs are tabled (Compare, a study's runs): not just "Trains".
    titles = run_findings.RunFindings(headline(probed_at((0, 299)), found), found).titles
    assert titles == ["Trains", finding.title]


def test_a_run_probed_at_step_0_alone_says_no_probe_came_after_it():
    (finding,) = fd.evaluate(probed_at((0,)))
    assert f"Could not check {STATE_CHECKS}: no probe after step 0, and a state needs 2" in (
        finding.text
    )


def test_a_short_or_sparsely_logged_run_names_the_loss_checks_it_could_not_make():
    """A quick study run logs its loss every 10 steps: 30 values, and a spike is measured
    against the median of the 50 before it, so that check cannot be made; nor overfitting
    from 2 evaluations, nor a 100-step stall at step 60. It used to read Healthy."""
    loss = {step: 4.0 - step / 150 for step in range(0, 300, 10)}
    found = fd.evaluate(series(scalars(**{"train/loss": loss, "val/loss": {100: 3.0, 200: 2.7}})))
    (finding,) = found
    assert finding.severity == "info" and finding.title.startswith("2 of 16 checks could not")
    assert "too few logged losses, too few evaluations" in finding.title
    assert "Could not check loss spikes: only 30 logged losses, and a spike needs 51" in (
        finding.text
    )
    assert "Could not check overfitting: only 2 evaluations, and overfitting needs 3" in (
        finding.text
    )
    young = {step: 3.0 for step in range(60)}
    text = fd.evaluate(series(scalars(**{"train/loss": young})))[-1].text
    assert "only 60 steps so far, and a stall needs 100" in text
    # No "rerun with more probes" for gaps that are not about probes.
    assert finding.suggestion is None


def test_a_running_run_with_enough_probes_to_come_is_told_when_not_to_rerun():
    """A quick study run between its probes: the gap is real, but its schedule has enough
    probes, so it says when the next comes instead of suggesting a rerun."""
    run = probed_at((0, 100))
    running = dataclasses.replace(
        run, config=cfg.replace(run.config, probe_interval=100), status="running"
    )
    (finding,) = [f for f in fd.evaluate(running) if f.rule == "healthy"]
    assert "The next probe is at step 200." in finding.text
    assert finding.suggestion is None


def test_with_two_probes_after_step_0_the_same_values_make_findings():
    found = rules(fd.evaluate(probed_at((0, 150, 299))))
    assert "healthy" not in found
    assert {
        "dead_units",
        "attention_collapse",
        "attention_logit_growth",
        "large_updates",
        "residual_growth",
    } <= found


def test_an_info_finding_leaves_the_run_healthy():
    massive = layers_frame(
        layer_rows("tap", "resid_post", "max_over_median", {10: [1e3] * 3, 20: [1e3] * 3}),
        layer_rows("tap", "resid_post", "max_abs", {10: [100.0] * 3, 20: [100.0] * 3}),
    )
    assert rules(fd.evaluate(series(layer_frame=massive))) == {"massive_activations", "healthy"}


# ---------------------------------------------------------------------------- diverged


def test_diverged_names_the_step_the_last_finite_loss_and_the_first_gradient_to_grow():
    loss = scalars(**{"train/loss": {0: 4.0, 1: 3.9, 2: 3.8, 3: math.nan}})
    grads = layers_frame(
        layer_rows(
            "component",
            "block",
            "grad_norm",
            {0: [1.0, 1.0, 1.0], 1: [2.0, 9.0, 1.0], 2: [3.0, 11.0, 10.5], 3: [math.inf] * 3},
        )
    )
    finding = only("diverged", series(loss, grads, "diverged", 3))
    assert finding.severity == "error" and finding.step == 3
    assert finding.title == "Diverged at step 3"
    assert "The last finite training loss was 3.8 at step 2." in finding.text
    assert "At step 3: train/loss = NaN." in finding.text
    # block 1 reaches 11× at step 2 before block 2's 10.5×; both cross there, 1 is larger
    assert finding.evidence["grew_first"] == {"layer": 1, "step": 2, "factor": 11.0}
    assert "The first non-finite gradient norm: blocks 0–2 at step 3." in finding.text
    # Clipped, Pre-LN, warmed up (the defaults): what is left to try is a lower lr.
    assert finding.suggestion.changes == {"lr": 3.3e-4}  # two digits; min_lr 1e-4 stays


def test_growth_just_below_the_factor_is_not_growth():
    loss = scalars(**{"train/loss": {0: 4.0, 1: math.inf}})
    grads = layers_frame(
        layer_rows("component", "block", "grad_norm", {0: [1.0] * 3, 1: [9.99, 1.0, 1.0]})
    )
    finding = only("diverged", series(loss, grads, "diverged", 1))
    assert "grew_first" not in finding.evidence
    assert finding.evidence["grew_most"]["layer"] == 0


def test_too_few_probes_before_a_divergence_ask_for_probe_interval_1():
    loss = scalars(**{"train/loss": {0: 4.0, 1: 7e6, 2: math.nan}})
    grads = layers_frame(layer_rows("component", "block", "grad_norm", {0: [1.0] * 3}))
    finding = only("diverged", series(loss, grads, "diverged", 2, probe_interval=50))
    assert "too few to tell which layer's gradient grew first" in finding.text
    assert finding.suggestion.changes == {"probe_interval": 1}
    # Probed every step already: no such advice, and the gradients going non-finite
    # together is said when the non-finite ones were recorded.
    every = only("diverged", series(loss, grads, "diverged", 2, probe_interval=1, grad_clip=0.0))
    assert "too few to tell" in every.text and every.suggestion.changes == {"grad_clip": 1.0}
    broken = layers_frame(
        layer_rows("component", "block", "grad_norm", {0: [1.0] * 3, 1: [math.inf] * 3})
    )
    together = only("diverged", series(loss, broken, "diverged", 2, probe_interval=1))
    assert "finite only at step 0 and went non-finite at the next" in together.text


def test_a_non_finite_loss_is_a_divergence_whatever_the_status_says():
    loss = scalars(**{"train/loss": {0: 4.0, 1: math.inf}})
    assert "diverged" in rules(fd.evaluate(series(loss, status="running")))


# ----------------------------------------------------------------------------- stalled


def stall_loss(in_band_steps: int, level: float) -> pd.DataFrame:
    """40 steps well below the unigram entropy, then `in_band_steps` at `level`."""
    values = {step: 1.0 for step in range(40)}
    values.update({40 + i: level for i in range(in_band_steps + 1)})
    return scalars(**{"train/loss": values})


def test_stalled_needs_the_minimum_number_of_steps_at_the_unigram_entropy():
    level = UNIGRAM - STALL_MARGIN  # exactly at the band's floor counts as in it
    short = series(stall_loss(STALL_MIN_STEPS - 1, level))
    assert "stalled" not in rules(fd.evaluate(short))
    finding = only("stalled", series(stall_loss(STALL_MIN_STEPS + 20, level)))
    # the running median of 20 values crosses into the band 10 values after the jump
    assert finding.title == "Stalled at the unigram entropy since step 50"
    assert finding.evidence["since"] == 50 and finding.severity == "warning"


def test_a_loss_just_below_the_band_is_not_a_stall():
    level = UNIGRAM - STALL_MARGIN - 0.01
    assert "stalled" not in rules(fd.evaluate(series(stall_loss(300, level))))


def test_a_loss_above_the_initial_loss_is_said_to_be_worse_than_a_uniform_guess():
    values = dict.fromkeys(range(200), 25.0)
    finding = only("stalled", series(scalars(**{"train/loss": values})))
    assert finding.title == "Stalled above the unigram entropy since step 0"
    assert "worse than the loss at initialisation, 4" in finding.text


def test_a_stall_is_at_the_unigram_entropy_within_the_margin_and_above_it_beyond():
    at = only("stalled", series(stall_loss(200, UNIGRAM + STALL_MARGIN)))
    assert at.title == "Stalled at the unigram entropy since step 50"
    assert "It has learned the characters' frequencies and nothing more." in at.text
    above = only("stalled", series(stall_loss(200, UNIGRAM + STALL_MARGIN + 0.01)))
    assert above.title == "Stalled above the unigram entropy since step 50"
    assert "against 3 for predicting each character by its frequency alone (0.11 nats above" in (
        above.text
    )
    assert "It has not even learned the characters' frequencies." in above.text


def stall_with_updates(per_lr: list[float], lr: float = 1e-3, **config: object) -> RunSeries:
    """A stall at the unigram entropy whose blocks' weight matrices move by `per_lr` × lr
    per step at every probe after step 0."""
    loss = stall_loss(200, UNIGRAM)
    steps = sorted(set(loss["step"]))
    table = {0: [lr] * N_LAYER, 100: [v * lr for v in per_lr], 200: [v * lr for v in per_lr]}
    frame = layers_frame(layer_rows("component", "weights", "update_ratio", table))
    lrs = scalars(**{"train/lr": dict.fromkeys(steps, lr)})
    return series(pd.concat([loss, lrs]), frame, lr=lr, **config)


@pytest.mark.parametrize(
    ("per_lr", "changes"),
    [
        ([UPDATE_NORMAL] * 3, {"lr": 3e-3}),  # normal-sized for the lr: a higher lr
        ([UPDATE_NORMAL * 0.99, 5.0, 5.0], {"lr": 3.3e-4}),  # one block small: as before
        ([UPDATE_HIGH / 1e-3 * 1.01, 5.0, 5.0], {"lr": 3.3e-4}),  # large updates: lower
    ],
)
def test_a_stall_with_normal_sized_updates_suggests_a_higher_lr(per_lr, changes):
    finding = only("stalled", stall_with_updates(per_lr))
    assert finding.suggestion.changes == changes
    remedy = "higher_lr" if changes["lr"] > 1e-3 else "lower_lr"
    said = EVIDENCE.get(("stalled", remedy), UNTESTED)
    assert finding.suggestion.source == f"a rule of thumb; {said}"
    normal = changes["lr"] > 1e-3
    assert ("normal-sized steps for the lr" in finding.text) == normal
    if normal:
        assert finding.suggestion.text == "Raise the learning rate 3×."
        assert "move by 1 to 1 × lr of their norm per step (lr 0.001)" in finding.text


def test_a_post_ln_stall_without_warm_up_gets_pre_ln_whatever_its_update_sizes():
    """Pre-LN before the rule of thumb: it ended a Post-LN stall here that a warm-up (Xiong
    et al.'s remedy) did not (docs/findings.md, remedies), and no run here showed a higher
    lr rescuing Post-LN without a warm-up. With a warm-up, normal updates mean a higher lr."""
    pre = {"norm_position": "pre"}
    run = stall_with_updates([2.0] * 3, norm_position="post", warmup_steps=0, max_steps=300)
    assert only("stalled", run).suggestion.changes == pre
    slow = stall_with_updates([0.1, 2.0, 2.0], norm_position="post", warmup_steps=0, max_steps=300)
    assert only("stalled", slow).suggestion.changes == pre
    warmed = stall_with_updates([2.0] * 3, norm_position="post", warmup_steps=30, max_steps=300)
    assert only("stalled", warmed).suggestion.changes == {"lr": 3e-3}


def test_a_stall_behind_post_ln_without_warm_up_suggests_pre_ln_with_what_it_did_here():
    finding = only(
        "stalled",
        series(stall_loss(200, UNIGRAM), norm_position="post", warmup_steps=0, max_steps=300),
    )
    assert finding.suggestion.changes == {"norm_position": "pre"}
    said = EVIDENCE.get(("stalled", "pre_ln"), UNTESTED)
    assert finding.suggestion.source == f"Xiong et al. 2020; {said}"


# -------------------------------------------------------------------------- loss spike


def test_a_spike_is_a_loss_above_the_factor_times_the_median_before_it():
    values = {step: 2.0 for step in range(120)}
    values[80] = 2.0 * SPIKE_FACTOR + 0.01
    values[100] = 2.0 * SPIKE_FACTOR  # exactly the factor: not above it
    finding = only("loss_spike", series(scalars(**{"train/loss": values})))
    assert finding.step == 80 and finding.evidence["count"] == 1
    assert finding.title == "A loss spike, the largest at step 80"


def test_a_spike_cites_what_the_newest_replay_of_it_found():
    values = {step: 2.0 for step in range(120)}
    values[80] = 2.0 * SPIKE_FACTOR + 0.01
    found = dataclasses.replace(
        series(scalars(**{"train/loss": values})),
        replays=(
            {"event": SPIKE, "event_step": 80, "sentence": "An older replay."},
            {"event": SPIKE, "event_step": 95, "sentence": "Not a spike's replay."},
            {"event": DIVERGENCE, "event_step": 90, "sentence": "A divergence's replay."},
            {"event": SPIKE, "event_step": 80, "sentence": "Block 0's RMS left its range."},
        ),
    )
    finding = only("loss_spike", found)
    assert finding.text.endswith(" Block 0's RMS left its range.")
    assert "older" not in finding.text and "divergence's" not in finding.text
    assert "Not a spike's" not in finding.text


def test_no_spike_before_a_full_window():
    values = {step: 2.0 for step in range(SPIKE_WINDOW + 5)}
    values[SPIKE_WINDOW - 1] = 100.0
    assert "loss_spike" not in rules(fd.evaluate(series(scalars(**{"train/loss": values}))))


# --------------------------------------------------------------- gradients across depth


@pytest.mark.parametrize(
    ("first", "title"),
    [
        (1 / (GRAD_DEPTH_RATIO * 1.01), "Gradients vanish towards the input"),
        (GRAD_DEPTH_RATIO * 1.01, "Gradients grow towards the input"),
    ],
)
def test_gradient_depth_fires_past_its_bound_at_the_last_two_probes(first, title):
    table = {10: [1.0, 1.0, 1.0], 20: [first, 1.0, 1.0], 30: [first, 1.0, 1.0]}
    grads = layers_frame(layer_rows("component", "block", "grad_norm", table))
    finding = only("gradient_depth", series(layer_frame=grads))
    assert finding.title == title and finding.evidence["since"] == 20


def test_gradient_depth_at_the_bound_or_at_one_probe_only_is_silent():
    at_bound = {10: [GRAD_DEPTH_RATIO, 1, 1], 20: [GRAD_DEPTH_RATIO, 1, 1]}
    once = {10: [1.0, 1, 1], 20: [1e6, 1, 1]}
    for table in (at_bound, once):
        grads = layers_frame(layer_rows("component", "block", "grad_norm", table))
        assert "gradient_depth" not in rules(fd.evaluate(series(layer_frame=grads)))


# ----------------------------------------------------------------------- update ratios


def updates(values: list[float], lr: float = 1e-2) -> RunSeries:
    table = {step: values for step in (0, 10, 20)}
    frame = layers_frame(layer_rows("component", "weights", "update_ratio", table))
    lrs = scalars(**{"train/loss": flat_loss(21), "train/lr": dict.fromkeys(range(21), lr)})
    return series(lrs, frame, lr=lr)


def test_slow_updates_below_the_lr_multiple():
    low = UPDATE_LOW * 1e-2
    finding = only("slow_updates", updates([low * 0.99, low, 1e-2]))
    assert finding.evidence["layers"] == [0] and finding.evidence["since"] == 10
    assert "Weight decay alone moves them by 0.1 × lr" in finding.text


def test_large_updates_above_the_bound_and_step_0_never_counts():
    finding = only("large_updates", updates([1e-3, UPDATE_HIGH * 1.01, UPDATE_HIGH]))
    assert finding.evidence["layers"] == [1] and finding.evidence["since"] == 10
    frame = layers_frame(
        layer_rows("component", "weights", "update_ratio", {0: [1.0] * 3, 10: [1.0] * 3})
    )
    assert "large_updates" not in rules(fd.evaluate(series(layer_frame=frame)))


# ------------------------------------------------------------------- activations, heads


def test_dead_units_past_the_fraction():
    table = {10: [DEAD_FRAC, 0.3, 0.0], 20: [DEAD_FRAC, 0.3, 0.0]}
    frame = layers_frame(layer_rows("tap", "ffn_hidden", "dead_frac", table))
    finding = only("dead_units", series(layer_frame=frame, activation="relu"))
    assert finding.evidence["layers"] == [1]
    assert finding.suggestion.changes == {"activation": "gelu"}


def test_attention_collapse_needs_every_head_of_a_layer_below_the_floor():
    low = ENTROPY_FLOOR * 0.5
    table = {step: [[low, low], [low, ENTROPY_FLOOR], [2.0, 2.0]] for step in (10, 20)}
    frame = layers_frame(head_rows("attn_entropy", table))
    finding = only("attention_collapse", series(layer_frame=frame))
    assert finding.evidence["layers"] == [0]
    assert finding.suggestion.changes == {"qk_norm": True}


def test_attention_logit_growth_needs_the_bound_and_the_growth():
    bound = ATTN_LOGIT_MAX
    table = {
        0: [[1.0, 10.0], [1.0, 1.0], [1.0, 1.0]],
        10: [[bound * 1.1, bound * 1.1], [bound, 1.0], [1.0, 1.0]],
        20: [[bound * 1.2, bound * 1.2], [bound, 1.0], [1.0, 1.0]],
    }
    finding = only(
        "attention_logit_growth",
        series(layer_frame=layers_frame(head_rows("attn_logit_max", table))),
    )
    # head (0, 1) started at 10, so 60 is only 6×: not growth; head (1, 0) sits at the bound
    assert (finding.evidence["layer"], finding.evidence["head"]) == (0, 0)
    assert finding.evidence["heads"] == 1
    with_norm = series(layer_frame=layers_frame(head_rows("attn_logit_max", table)), qk_norm=True)
    assert only("attention_logit_growth", with_norm).suggestion.changes == {"lr": 3.3e-4}


def test_attention_logit_growth_reads_the_largest_magnitude_so_negative_logits_count():
    # A head whose logits grow large and negative: its signed largest logit stays small,
    # its largest |logit| passes the bound.
    signed = {step: [[2.0, 1.0]] * 3 for step in (0, 10, 20)}
    magnitude = {0: [[1.5, 1.0]] * 3, 10: [[120.0, 1.0]] * 3, 20: [[130.0, 1.0]] * 3}
    frame = layers_frame(
        head_rows("attn_logit_max", signed), head_rows("attn_logit_max_abs", magnitude)
    )
    finding = only("attention_logit_growth", series(layer_frame=frame))
    assert finding.series == "attn_logit_max_abs" and finding.tab == "Attention"
    assert finding.evidence["value"] == 130.0 and finding.evidence["first"] == 1.5
    assert "the largest |attention logit| of block 0 head 0 is 130" in finding.text
    # A run recorded before the |logit| statistic: its signed largest logit, said so.
    old = layers_frame(head_rows("attn_logit_max", magnitude))
    finding = only("attention_logit_growth", series(layer_frame=old))
    assert finding.series == "attn_logit_max"
    assert "predates the |logit| statistic" in finding.text


def test_rank_collapse_at_the_cosine_bound():
    table = {10: [0.5, RANK_COS, 0.98], 20: [0.5, RANK_COS, 0.98]}
    frame = layers_frame(layer_rows("tap", "resid_post", "token_cos", table))
    finding = only("rank_collapse", series(layer_frame=frame, residual=False))
    assert finding.evidence["layers"] == [1]
    assert finding.suggestion.changes == {"residual": True}


def resid_rms(start: list[float], later: list[float]) -> RunSeries:
    table = {0: start, 10: later, 20: later}
    return series(layer_frame=layers_frame(layer_rows("tap", "resid_post", "rms", table)))


def test_residual_growth_needs_both_the_growth_and_the_size():
    bound, size = RESID_GROWTH, RESID_RMS
    # block 0 at exactly both bounds; block 1 just short of the growth; block 2 grew 100×
    # but stays under the size (a GPT-2-init stream starts small)
    run = resid_rms([size / bound, size / bound * 1.01, 0.1], [size, size, size * 0.5])
    finding = only("residual_growth", run)
    assert finding.evidence["layers"] == [0] and finding.evidence["since"] == 10
    assert finding.evidence["start"] == pytest.approx(0.4) and finding.evidence["value"] == 20
    assert finding.title == "The residual stream grew 50× in block 0"
    assert "leaving block 0 is 20, against 0.4 at step 0: 50× its start" in finding.text
    assert finding.series == "rms" and finding.tab == "Activations"
    assert finding.suggestion.changes == {"lr": 3.3e-4}
    said = EVIDENCE.get(("residual_growth", "lower_lr"), UNTESTED)
    assert finding.suggestion.source == f"a rule of thumb; {said}"
    short = resid_rms([0.41, 1.0, 0.1], [size, size, size * 0.99])
    assert "residual_growth" not in rules(fd.evaluate(short))


def test_massive_activations_need_both_the_ratio_and_the_size():
    ratio = {10: [MASSIVE_RATIO] * 3, 20: [MASSIVE_RATIO, MASSIVE_RATIO, 999.0]}
    size = {10: [100.0, 99.0, 100.0], 20: [100.0, 99.0, 100.0]}
    frame = layers_frame(
        layer_rows("tap", "resid_post", "max_over_median", ratio),
        layer_rows("tap", "resid_post", "max_abs", size),
    )
    finding = only("massive_activations", series(layer_frame=frame))
    assert finding.evidence["layers"] == [0] and finding.severity == "info"


def test_output_logit_growth_by_either_bound():
    steps = (10, 20)
    big_logit = scalars(
        **{
            "train/loss": flat_loss(21),
            "probe/logit_max_abs": dict.fromkeys(steps, OUTPUT_LOGIT_MAX + 1),
            "probe/log_z": dict.fromkeys(steps, 5.0),
        }
    )
    finding = only("output_logit_growth", series(big_logit))
    assert finding.suggestion.changes == {"z_loss": 1e-4}
    negative_z = scalars(
        **{
            "train/loss": flat_loss(21),
            "probe/logit_max_abs": dict.fromkeys(steps, 10.0),
            "probe/log_z": dict.fromkeys(steps, -LOG_Z_MAX - 1),
        }
    )
    capped = only("output_logit_growth", series(negative_z, z_loss=1e-4))
    assert capped.suggestion.changes == {"logit_softcap": 30.0}
    at_bounds = scalars(
        **{
            "train/loss": flat_loss(21),
            "probe/logit_max_abs": dict.fromkeys(steps, OUTPUT_LOGIT_MAX),
            "probe/log_z": dict.fromkeys(steps, LOG_Z_MAX),
        }
    )
    assert "output_logit_growth" not in rules(fd.evaluate(series(at_bounds)))


# -------------------------------------------------------------------------- overfitting


def overfit(val_last: float, train_last: float) -> RunSeries:
    """Val 2.0 at 100, 1.8 at 200, `val_last` at 300; train 1.7 up to 200, then
    `train_last`."""
    train = {step: 1.7 for step in range(201)}
    train.update({step: train_last for step in range(201, 301)})
    val = {100: 2.0, 200: 1.8, 300: val_last}
    return series(scalars(**{"train/loss": train, "val/loss": val}))


def test_overfitting_when_val_rises_and_the_gap_widens():
    finding = only("overfitting", overfit(1.8 + OVERFIT_RISE + 0.01, 1.6))
    assert finding.title == "Overfitting since step 200"
    assert "best.ckpt holds the weights of step 200" in finding.text
    assert finding.suggestion.changes == {"dropout": 0.1}


@pytest.mark.parametrize(
    ("val_last", "train_last"),
    [
        (1.8 + OVERFIT_RISE - 0.01, 1.5),  # val rose less than the margin
        (2.0, 1.95),  # val rose, but so did train: a worse run, not overfitting
    ],
)
def test_no_overfitting_without_a_rise_or_with_train_rising_too(val_last, train_last):
    assert "overfitting" not in rules(fd.evaluate(overfit(val_last, train_last)))


# ------------------------------------------------------------------ headline and order


def test_the_headline_says_trains_below_the_unigram_entropy_else_learning():
    trains = series(scalars(**{"train/loss": {0: 4.0, **flat_loss(30, 1.0)}}))
    assert headline(trains, fd.evaluate(trains)).title == "Trains"
    learning = series(scalars(**{"train/loss": flat_loss(30, UNIGRAM)}))
    assert headline(learning, fd.evaluate(learning)).title == "Learning"
    empty = series(scalars())
    assert headline(empty, fd.evaluate(empty)).title == "No loss yet"


def test_findings_come_newest_first_and_the_headline_is_a_divergence_or_stall():
    loss = {step: 2.8 for step in range(40)}  # below the band, and no spike into it
    loss.update({40 + i: UNIGRAM for i in range(300)})
    grads = layers_frame(
        layer_rows("tap", "resid_post", "token_cos", {60: [1.0] * 3, 70: [1.0] * 3})
    )
    run = series(scalars(**{"train/loss": loss}), grads)
    found = fd.evaluate(run)
    assert [f.rule for f in found] == ["rank_collapse", "stalled"]  # since 60, since 50
    assert headline(run, found).rule == "stalled"


def test_nan_gradient_norms_are_reported_not_dropped():
    loss = scalars(**{"train/loss": {0: 4.0, 1: 3.0, 2: math.nan}})
    table = {0: [1.0] * 3, 1: [1.0] * 3, 2: [math.nan] * 3}
    grads = layers_frame(layer_rows("component", "block", "grad_norm", table))
    finding = only("diverged", series(loss, grads, "diverged", 2))
    assert finding.evidence["first_nonfinite_gradients"] == {"step": 2, "layers": [0, 1, 2]}


def test_large_updates_that_are_mostly_weight_decay_say_so():
    # lr 1 with weight decay 0.1: decay alone moves the weights by 0.1 of their norm
    finding = only("large_updates", updates([0.1, 0.01, 0.01], lr=1.0))
    assert "Most of it is weight decay: lr × weight_decay = 0.1 of the weights" in finding.text
    plain = only("large_updates", updates([0.3, 0.01, 0.01], lr=1.0))
    assert "weight decay" not in plain.text


def test_a_lower_lr_keeps_min_lr_at_or_below_it_so_the_config_validates():
    table = {step: [[60.0, 1.0]] * 3 for step in (10, 20)}
    table[0] = [[1.0, 1.0]] * 3
    frame = layers_frame(head_rows("attn_logit_max", dict(sorted(table.items()))))
    run = series(layer_frame=frame, qk_norm=True, lr=2e-4, min_lr=1e-4)
    changes = only("attention_logit_growth", run).suggestion.changes
    assert changes == {"lr": 6.7e-5, "min_lr": 6.7e-5}
    cfg.replace(run.config, **changes).validate()


def test_a_rule_that_fails_is_said_not_raised(monkeypatch):
    def broken(series):
        raise ZeroDivisionError("float division by zero")

    rule = fd.RULES["dead_units"]
    monkeypatch.setitem(fd.RULES, "dead_units", dataclasses.replace(rule, find=broken))
    finding = only("dead_units", series())
    assert finding.severity == "info" and finding.title == "Could not check dead FFN units"


def test_zero_gradients_in_the_first_block_read_as_vanishing_not_a_crash():
    table = {10: [1.0, 1.0, 1.0], 20: [0.0, 1.0, 1.0], 30: [0.0, 1.0, 1.0]}
    grads = layers_frame(layer_rows("component", "block", "grad_norm", table))
    finding = only("gradient_depth", series(layer_frame=grads))
    assert "first block's gradient norm (0) is zero, against the last block's" in finding.text


def test_a_loss_still_falling_is_not_a_stall():
    falling = {step: 3.45 - 0.5 * step / 160 for step in range(161)}  # into the band, falling
    assert "stalled" not in rules(fd.evaluate(series(scalars(**{"train/loss": falling}))))


def test_no_healthy_beside_a_loss_worse_than_a_uniform_guess():
    run = series(scalars(**{"train/loss": flat_loss(60, 25.0)}))
    found = fd.evaluate(run)
    assert "healthy" not in rules(found)
    assert headline(run, found).title == "Worse than a uniform guess"


def test_without_a_readable_config_the_depth_comes_from_the_probes():
    table = {10: [0.0, 0.5, 0.5], 20: [0.0, 0.5, 0.5]}
    frame = layers_frame(layer_rows("tap", "ffn_hidden", "dead_frac", table))
    frame = pd.concat(
        [frame, layers_frame(layer_rows("component", "head", "grad_norm", {10: [0, 0, 0, 1.0]}))]
    )
    run = series(layer_frame=frame)
    unreadable = RunSeries(run.status, None, None, UNIGRAM, 4.0, run.scalars, frame)
    assert unreadable.n_layer == 3
    assert only("dead_units", unreadable).evidence["layers"] == [1, 2]


def test_a_one_block_model_says_why_depth_is_not_compared():
    frame = layers_frame(
        layer_rows("component", "block", "grad_norm", {0: [1.0], 100: [1.0], 200: [1.0]})
    )
    run = series(scalars(**{"train/loss": flat_loss(200)}), frame)
    run = dataclasses.replace(run, config=cfg.replace(run.config, n_layer=1))
    (finding,) = [f for f in fd.evaluate(run) if f.rule == "healthy"]
    assert "Not checked, the model has one block, so no depth to compare: gradients across" in (
        finding.text
    )
    assert "no data recorded: gradients across depth" not in finding.text
    assert finding.severity == "ok"
