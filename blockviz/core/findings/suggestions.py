"""What the literature tries against each problem, given what the run already has.

A suggestion names config fields and values (the Try button loads them) and its source;
it is the papers' fix, never a result of these runs. Torch-free.
"""

from __future__ import annotations

from blockviz.core.config import RunConfig
from blockviz.core.findings.base import RunSeries, Suggestion


def stability(series: RunSeries) -> Suggestion | None:
    """What the literature tries first against a blow-up, given what the run had."""
    if series.config is None:
        return None
    train, model = series.config.train, series.config.model
    if train.grad_clip == 0:
        return Suggestion("Clip the gradient norm at 1.", {"grad_clip": 1.0}, "Pascanu et al. 2013")
    if model.norm_position == "post" and train.warmup_steps == 0:
        return warmup(series.config, "Xiong et al. 2020: Post-LN needs a warm-up")
    if model.norm_position != "pre":
        return Suggestion(
            "Put the norms before each sublayer (Pre-LN).",
            {"norm_position": "pre"},
            "Xiong et al. 2020",
        )
    return Suggestion("Lower the learning rate 3×.", {"lr": train.lr / 3})


def warmup(config: RunConfig, source: str) -> Suggestion:
    steps = max(1, min(config.train.max_steps, max(100, config.train.max_steps // 10)))
    return Suggestion(
        f"Warm the learning rate up over {steps:,} steps.", {"warmup_steps": steps}, source
    )


def unstall(series: RunSeries) -> Suggestion | None:
    if series.config is None:
        return None
    model, train = series.config.model, series.config.train
    if not model.residual:
        return Suggestion("Turn the residual connections on.", {"residual": True}, "He et al. 2016")
    if model.norm_position == "post" and train.warmup_steps == 0:
        return warmup(series.config, "Xiong et al. 2020: Post-LN needs a warm-up")
    if model.norm_position == "post":
        return Suggestion(
            "Put the norms before each sublayer (Pre-LN).",
            {"norm_position": "pre"},
            "Xiong et al. 2020",
        )
    return Suggestion("Lower the learning rate 3×.", {"lr": train.lr / 3})


def normalise_qk(series: RunSeries) -> Suggestion | None:
    if series.config is None:
        return None
    if not series.config.model.qk_norm:
        return Suggestion(
            "Normalize queries and keys (qk_norm).",
            {"qk_norm": True},
            "Dehghani et al. 2023; Wortsman et al. 2023",
        )
    return Suggestion("Lower the learning rate 3×.", {"lr": series.config.train.lr / 3})
