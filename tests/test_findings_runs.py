"""Each findings rule fires on a real tiny run that shows it, and a healthy run says so.

The runs (tests/finding_runs.py) train once per test run, when the first test asks.
"""

from __future__ import annotations

import pytest

from blockviz.store import RunStore
from blockviz.views.run_findings import RunFindings, read_findings


@pytest.fixture(scope="module")
def found(finding_runs) -> dict[str, RunFindings]:
    with RunStore(finding_runs.path, readonly=True) as store:
        return {
            label: read_findings(store, store.get_run(run_id))
            for label, run_id in finding_runs.ids.items()
        }


def rules(found: RunFindings) -> set[str]:
    return {finding.rule for finding in found.findings}


def the(found: RunFindings, rule: str):
    (finding,) = [f for f in found.findings if f.rule == rule]
    return finding


def test_a_healthy_tiny_run_trains_and_says_none_of_the_checks_fired(found):
    healthy = found["healthy"]
    assert healthy.headline.title == "Trains"
    # the induction-heads timeline is informational: it says, never alarms
    assert rules(healthy) == {"healthy", "induction_heads"}
    assert the(healthy, "induction_heads").severity == "info"


def test_no_norms_no_clipping_lr_0_1_diverges_at_step_2(found):
    run = found["starter-none"]
    assert run.headline.rule == "diverged" and run.headline.title == "Diverged at step 2"
    finding = the(run, "diverged")
    assert finding.evidence["last_finite_step"] == 1
    assert (
        finding.evidence["nonfinite"]["train/loss"] != finding.evidence["nonfinite"]["train/loss"]
    )
    # probed only at step 0 (probe_interval 50): the finding says so and names the setting
    assert finding.suggestion.changes == {"probe_interval": 1}


def test_post_ln_at_lr_1e_2_without_warm_up_stalls_at_the_unigram_entropy(found):
    run = found["starter-post"]
    assert run.headline.rule == "stalled"
    assert run.headline.title.startswith("Stalled at the unigram entropy since step ")
    assert run.headline.evidence["since"] < 20
    # Pre-LN, not the warm-up that did not end a held-out Post-LN stall (docs/findings.md)
    assert run.headline.suggestion.changes == {"norm_position": "pre"}
    # What goes with it in this run: the first blocks' gradients vanish, their weights
    # move by weight decay alone, and the later blocks' positions point one way.
    assert {"gradient_depth", "slow_updates", "rank_collapse"} <= rules(run)
    assert the(run, "gradient_depth").title == "Gradients vanish towards the input"
    assert 0 in the(run, "slow_updates").evidence["layers"]


def test_relu_at_a_high_learning_rate_has_dead_units(found):
    run = found["relu"]
    finding = the(run, "dead_units")
    assert finding.suggestion.changes == {"activation": "gelu"}
    assert {"attention_collapse", "attention_logit_growth"} <= rules(run)
    assert the(run, "attention_logit_growth").suggestion.changes == {"qk_norm": True}
    # Its residual stream: RMS 1.5 at step 0, hundreds by the end (our calibration run of
    # this config: 230-480× from step 10 on).
    growth = the(run, "residual_growth")
    assert growth.evidence["start"] < 2 and growth.evidence["value"] > 100


def test_lr_1_moves_weights_by_more_than_the_bound_each_step(found):
    finding = the(found["lr-1"], "large_updates")
    assert finding.evidence["layers"] == [0, 1] and finding.evidence["since"] <= 20
    assert "Most of it is weight decay" in finding.text
    assert finding.suggestion.changes == {"lr": 0.33}


def test_a_blow_up_without_nan_grows_the_output_logits(found):
    run = found["blow-up"]
    assert run.headline.title == "Worse than a uniform guess"
    # Issue 39, defect 8: not the z-loss, which did not stop this blow-up here, nor
    # clipping (docs/findings.md, remedies): norms before each sublayer, which did.
    tip = the(run, "output_logit_growth").suggestion
    assert tip.changes == {"norm_position": "pre"}
    assert tip.source.endswith("; it helped in a run here")


def test_a_block_of_noise_in_the_text_makes_loss_spikes(found):
    finding = the(found["spiky"], "loss_spike")
    assert finding.evidence["count"] >= 1
    assert found["spiky"].headline.title == "Trains"


def test_lr_0_1_without_decay_stops_just_below_the_unigram_entropy(found):
    """Issue 39, defect 7: a loss that stopped improving 0.1 nat below the unigram entropy
    read "Trains"."""
    run = found["plateau"]
    assert run.headline.rule == "plateau"
    finding = the(run, "plateau")
    assert finding.evidence["unigram"] - 0.3 <= finding.evidence["median_loss"]
    assert finding.evidence["median_loss"] < finding.evidence["unigram"]
    assert finding.suggestion.changes == {"lr": 0.033}
    # the other runs that train (healthy, spiky, overfit) do not fire it
    assert not any("plateau" in rules(found[label]) for label in ("healthy", "spiky", "overfit"))


def test_a_small_text_trained_long_overfits(found):
    finding = the(found["overfit"], "overfitting")
    assert finding.evidence["val"] > finding.evidence["best_val"]
    assert finding.evidence["gap_now"] > finding.evidence["gap_then"]


def test_every_suggestion_the_real_runs_get_gives_a_config_that_validates(found, finding_runs):
    from blockviz.core import config as cfg

    with RunStore(finding_runs.path, readonly=True) as store:
        configs = {
            label: cfg.RunConfig.from_dict(store.get_run(run_id).config)
            for label, run_id in finding_runs.ids.items()
        }
    tried = 0
    for label, run in found.items():
        for finding in [run.headline, *run.findings]:
            if finding.suggestion is not None and finding.suggestion.changes:
                cfg.replace(configs[label], **finding.suggestion.changes).validate()
                tried += 1
    assert tried >= 8
