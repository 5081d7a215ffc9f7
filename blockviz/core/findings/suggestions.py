"""What to try against each problem, given what the run already has, and what runs of this
code showed of it.

A suggestion names config fields and values (the Try button loads them), where the idea
comes from (a paper, or "a rule of thumb" where no paper is behind it) and, after that, what
a run here showed: `EVIDENCE` holds, per (rule, remedy), what
benchmarks/findings_calibration.py measured (the remedy on a held-out run that showed the
rule's problem; docs/findings.md's remedies table is generated from its results and
tests/core/test_findings_evidence.py checks this table against them); every other pair says
"untested here". Every suggestion's values pass the config's validation on the run's config
(tests/test_findings_runs.py checks each one the real runs get). Torch-free.
"""

from __future__ import annotations

import dataclasses

from blockviz.core.config import BOUNDS, RunConfig
from blockviz.core.findings.base import Finding, RunSeries, Suggestion
from blockviz.core.findings.thresholds import PERSIST
from blockviz.core.probe_schedule import probe_steps

RULE_OF_THUMB = "a rule of thumb"
XIONG = "Xiong et al. 2020"
# What runs of this code showed of a suggestion, as its label says it.
HELPED = "it helped in a run here"
NOT_HELPED = "it did not help in a run here"
UNTESTED = "untested here"
# Every remedy each rule can suggest (its code picks one by what the run had), by the
# `Suggestion.remedy` that names it: docs/findings.md's remedies table lists each pair.
SUGGESTS: dict[str, tuple[str, ...]] = {
    "diverged": ("probe_every_step", "pre_ln", "warmup", "clip", "lower_lr"),
    "stalled": ("residual", "pre_ln", "higher_lr", "lower_lr"),
    "plateau": ("lower_lr",),
    "loss_spike": ("clip",),
    "gradient_depth": ("residual", "pre_ln"),
    "slow_updates": ("pre_ln", "residual"),
    "large_updates": ("lower_lr",),
    "dead_units": ("gelu", "lower_lr"),
    "attention_collapse": ("qk_norm", "lower_lr"),
    "attention_logit_growth": ("qk_norm", "lower_lr"),
    "rank_collapse": ("residual",),
    "residual_growth": ("lower_lr",),
    "output_logit_growth": ("pre_ln", "warmup", "clip", "lower_lr", "z_loss", "softcap"),
    "overfitting": ("dropout",),
    "healthy": ("probe_more",),
}
# (rule, remedy) -> what benchmarks/findings_calibration.py's remedy runs showed, in
# `measured`'s words: each a held-out run that showed the rule's problem, with the change.
# Copied from benchmarks/results/findings-calibration.json, which
# tests/core/test_findings_evidence.py checks it against; a pair not here is untested.
EVIDENCE: dict[tuple[str, str], str] = {
    ("diverged", "clip"): "it did not help in a run here",
    ("stalled", "residual"): "it helped in a run here",
    ("stalled", "pre_ln"): "it helped in a run here",
    ("stalled", "higher_lr"): "it helped in a run here",
    ("stalled", "lower_lr"): "it helped in a run here",
    ("plateau", "lower_lr"): "it helped in 2 runs here",
    ("loss_spike", "clip"): "it did not help in a run here",
    ("gradient_depth", "residual"): "it helped in a run here",
    ("gradient_depth", "pre_ln"): "it helped in a run here",
    ("slow_updates", "pre_ln"): "it helped in a run here",
    ("slow_updates", "residual"): "it helped in a run here",
    ("large_updates", "lower_lr"): "it helped in 3 runs here",
    ("dead_units", "gelu"): "it did not help in a run here",
    ("dead_units", "lower_lr"): "it did not help in 2 runs here",
    ("attention_collapse", "qk_norm"): "it helped in a run here",
    ("attention_collapse", "lower_lr"): "it helped in 2 of 5 runs here",
    ("attention_logit_growth", "qk_norm"): "it did not help in a run here",
    ("attention_logit_growth", "lower_lr"): "it helped in 2 of 5 runs here",
    ("rank_collapse", "residual"): "it helped in a run here",
    ("residual_growth", "lower_lr"): "it helped in 2 of 5 runs here",
    ("output_logit_growth", "pre_ln"): "it helped in a run here",
    ("output_logit_growth", "clip"): "it did not help in 3 runs here",
    ("output_logit_growth", "lower_lr"): "it did not help in a run here",
    ("output_logit_growth", "z_loss"): "it did not help in a run here",
    ("overfitting", "dropout"): "it did not help in a run here",
}


def measured(helped: int, tried: int) -> str:
    """What `tried` remedy runs of one (rule, remedy) showed, `helped` of them helping."""
    if helped == tried:
        return HELPED if tried == 1 else f"it helped in {tried} runs here"
    if helped == 0:
        return NOT_HELPED if tried == 1 else f"it did not help in {tried} runs here"
    return f"it helped in {helped} of {tried} runs here"


def labelled(rule: str, finding: Finding) -> Finding:
    """The finding with its suggestion's source followed by what runs here showed of it."""
    tip = finding.suggestion
    if tip is None:
        return finding
    said = EVIDENCE.get((rule, tip.remedy), UNTESTED)
    source = f"{tip.source}; {said}" if tip.source else said
    return dataclasses.replace(finding, suggestion=dataclasses.replace(tip, source=source))


def probe_more(series: RunSeries) -> Suggestion | None:
    """Ten probes over the run, when its whole schedule has too few probes after step 0
    for a state rule (a run still on its way to enough gets none: it only has to go on)."""
    if series.config is None:
        return None
    train = series.config.train
    if len(probe_steps(train.max_steps, train.probe_interval)) - 1 >= PERSIST:
        return None
    interval = max(1, train.max_steps // 10)
    if interval >= train.probe_interval:
        return None
    return Suggestion(
        f"Rerun with probe_interval {interval:,}: ten probes over the run.",
        {"probe_interval": interval},
        RULE_OF_THUMB,
        "probe_more",
    )


def probe_every_step() -> Suggestion:
    return Suggestion(
        "Rerun with probe_interval 1 to record every step's gradients.",
        {"probe_interval": 1},
        RULE_OF_THUMB,
        "probe_every_step",
    )


def lower_lr(config: RunConfig) -> Suggestion:
    """A learning rate 3× lower (two significant digits), min_lr kept at or below it."""
    lr = float(f"{config.train.lr / 3:.2g}")
    changes: dict[str, float] = {"lr": lr}
    if config.train.min_lr > lr:
        changes["min_lr"] = lr
    return Suggestion("Lower the learning rate 3×.", changes, RULE_OF_THUMB, "lower_lr")


def higher_lr(config: RunConfig) -> Suggestion | None:
    """A learning rate 3× higher (two significant digits), within the lr's bound."""
    lr = min(float(f"{config.train.lr * 3:.2g}"), BOUNDS["lr"].high)
    if lr <= config.train.lr:
        return None
    return Suggestion("Raise the learning rate 3×.", {"lr": lr}, RULE_OF_THUMB, "higher_lr")


def pre_ln() -> Suggestion:
    return Suggestion(
        "Put the norms before each sublayer (Pre-LN).", {"norm_position": "pre"}, XIONG, "pre_ln"
    )


def residual_on(source: str = "He et al. 2016") -> Suggestion:
    return Suggestion("Turn the residual connections on.", {"residual": True}, source, "residual")


def clip() -> Suggestion:
    return Suggestion(
        "Clip the gradient norm at 1.", {"grad_clip": 1.0}, "Pascanu et al. 2013", "clip"
    )


def warmup(config: RunConfig) -> Suggestion:
    """A linear warm-up over a tenth of the run (at least 100 steps, at most the run)."""
    steps = max(1, min(config.train.max_steps, max(100, config.train.max_steps // 10)))
    return Suggestion(
        f"Warm the learning rate up over {steps:,} steps.",
        {"warmup_steps": steps},
        f"{XIONG}: Post-LN needs a warm-up",
        "warmup",
    )


def gelu() -> Suggestion:
    return Suggestion(
        "Use GELU, which has no flat zero region.",
        {"activation": "gelu"},
        "Hendrycks & Gimpel 2016",
        "gelu",
    )


def dropout() -> Suggestion:
    return Suggestion("Add dropout 0.1.", {"dropout": 0.1}, "Srivastava et al. 2014", "dropout")


def stability(series: RunSeries) -> Suggestion | None:
    """What to try first against a blow-up, given what the run had: norms before each
    sublayer for a model without norms (they stopped a blow-up here that clipping, a 3×
    lower lr and a z-loss did not stop), Post-LN's warm-up, clipping, Pre-LN, a lower lr."""
    if series.config is None:
        return None
    train, model = series.config.train, series.config.model
    if model.norm_position == "none":
        return pre_ln()
    if model.norm_position == "post" and train.warmup_steps == 0:
        return warmup(series.config)
    if train.grad_clip == 0:
        return clip()
    if model.norm_position != "pre":
        return pre_ln()
    return lower_lr(series.config)


def tame_logits(series: RunSeries) -> Suggestion | None:
    """Against output logits that grew: in a model without Pre-LN, what a blow-up needs
    first (`stability`); in a Pre-LN one, a z-loss, then a cap on the logits."""
    if series.config is None:
        return None
    train, model = series.config.train, series.config.model
    if model.norm_position != "pre":
        return stability(series)
    if train.z_loss == 0:
        return Suggestion(
            "Add a z-loss of 1e-4 (it pulls log Z towards 0).",
            {"z_loss": 1e-4},
            "Chowdhery et al. 2022; Wortsman et al. 2023",
            "z_loss",
        )
    if model.logit_softcap == 0:
        return Suggestion(
            "Cap the output logits at 30 (logit_softcap).",
            {"logit_softcap": 30.0},
            "Gemma Team 2024",
            "softcap",
        )
    return stability(series)


def unstall(series: RunSeries, updates: str | None = None) -> Suggestion | None:
    """What to try against a stall, given what the run had and how its blocks' weights
    moved at the newest probe (`updates`, gradients.update_sizes): residuals for a block
    without them; Pre-LN for Post-LN without a warm-up (here it ended a Post-LN stall that
    a 100-step warm-up, Xiong et al.'s remedy, did not, nor one at a lower lr); with steps
    normal-sized for the lr the lr itself is small, so a higher one; else Pre-LN for
    Post-LN, or a lower lr."""
    if series.config is None:
        return None
    model, train = series.config.model, series.config.train
    if not model.residual:
        return residual_on()
    if model.norm_position == "post" and train.warmup_steps == 0:
        return pre_ln()
    if updates == "normal":
        return higher_lr(series.config)
    if model.norm_position == "post":
        return pre_ln()
    return lower_lr(series.config)


def plateau_remedy(series: RunSeries) -> Suggestion | None:
    """A lower learning rate against a loss that stopped just below the unigram entropy."""
    return None if series.config is None else lower_lr(series.config)


def normalise_qk(series: RunSeries) -> Suggestion | None:
    """qk_norm against attention-logit growth, else a lower learning rate."""
    if series.config is None:
        return None
    if not series.config.model.qk_norm:
        return Suggestion(
            "Normalize queries and keys (qk_norm).",
            {"qk_norm": True},
            "Dehghani et al. 2023; Wortsman et al. 2023",
            "qk_norm",
        )
    return lower_lr(series.config)
