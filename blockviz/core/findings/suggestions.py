"""What to try against each problem, given what the run already has.

A suggestion names config fields and values (the Try button loads them) and where the idea
comes from: a paper, or "a rule of thumb" where no paper is behind it. It is never a result
of these runs. Every suggestion's values pass the config's validation on the run's config
(tests/test_findings_runs.py checks each one the real runs get). Torch-free.
"""

from __future__ import annotations

from blockviz.core.config import BOUNDS, RunConfig
from blockviz.core.findings.base import RunSeries, Suggestion
from blockviz.core.findings.thresholds import PERSIST
from blockviz.core.probe_schedule import probe_steps

RULE_OF_THUMB = "a rule of thumb"
XIONG = "Xiong et al. 2020"


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
    )


def lower_lr(config: RunConfig) -> Suggestion:
    """A learning rate 3× lower (two significant digits), min_lr kept at or below it."""
    lr = float(f"{config.train.lr / 3:.2g}")
    changes: dict[str, float] = {"lr": lr}
    if config.train.min_lr > lr:
        changes["min_lr"] = lr
    return Suggestion("Lower the learning rate 3×.", changes, RULE_OF_THUMB)


def higher_lr(config: RunConfig) -> Suggestion | None:
    """A learning rate 3× higher (two significant digits), within the lr's bound."""
    lr = min(float(f"{config.train.lr * 3:.2g}"), BOUNDS["lr"].high)
    if lr <= config.train.lr:
        return None
    return Suggestion("Raise the learning rate 3×.", {"lr": lr}, RULE_OF_THUMB)


def pre_ln() -> Suggestion:
    return Suggestion(
        "Put the norms before each sublayer (Pre-LN).", {"norm_position": "pre"}, XIONG
    )


def residual_on(source: str = "He et al. 2016") -> Suggestion:
    return Suggestion("Turn the residual connections on.", {"residual": True}, source)


def clip() -> Suggestion:
    return Suggestion("Clip the gradient norm at 1.", {"grad_clip": 1.0}, "Pascanu et al. 2013")


def warmup(config: RunConfig) -> Suggestion:
    """A linear warm-up over a tenth of the run (at least 100 steps, at most the run)."""
    steps = max(1, min(config.train.max_steps, max(100, config.train.max_steps // 10)))
    return Suggestion(
        f"Warm the learning rate up over {steps:,} steps.",
        {"warmup_steps": steps},
        f"{XIONG}: Post-LN needs a warm-up",
    )


def stability(series: RunSeries) -> Suggestion | None:
    """What to try first against a blow-up, given what the run had."""
    if series.config is None:
        return None
    train, model = series.config.train, series.config.model
    if train.grad_clip == 0:
        return clip()
    if model.norm_position == "post" and train.warmup_steps == 0:
        return warmup(series.config)
    if model.norm_position != "pre":
        return pre_ln()
    return lower_lr(series.config)


def unstall(series: RunSeries, updates: str | None = None) -> Suggestion | None:
    """What to try against a stall, given what the run had and how its blocks' weights
    moved at the newest probe (`updates`, gradients.update_sizes). The literature's remedy
    for the architecture comes first (residuals, Post-LN's warm-up); then, steps
    normal-sized for the lr mean the lr itself is small, so a higher one (a rule of thumb
    no run here has tested on Post-LN without a warm-up, so it does not overrule that)."""
    if series.config is None:
        return None
    model, train = series.config.model, series.config.train
    if not model.residual:
        return residual_on()
    if model.norm_position == "post" and train.warmup_steps == 0:
        return warmup(series.config)
    if updates == "normal":
        return higher_lr(series.config)
    if model.norm_position == "post":
        return pre_ln()
    return lower_lr(series.config)


def normalise_qk(series: RunSeries) -> Suggestion | None:
    """qk_norm against attention-logit growth, else a lower learning rate."""
    if series.config is None:
        return None
    if not series.config.model.qk_norm:
        return Suggestion(
            "Normalize queries and keys (qk_norm).",
            {"qk_norm": True},
            "Dehghani et al. 2023; Wortsman et al. 2023",
        )
    return lower_lr(series.config)
