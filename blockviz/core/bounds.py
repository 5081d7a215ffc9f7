"""The range every numeric config field allows: `Bound` and the `BOUNDS` table.

`core.config`'s `validate()` enforces these ranges (`check_int`, `check_number`), the
sidebar's number widgets take their min and max from them, the CLI's --help and the
README quote them. Also the few limits other checks share: `MAX_VOCAB`, `MAX_STEPS`,
`MAX_SEED`. Plain data, no imports from the rest of blockviz.
"""

from __future__ import annotations

from dataclasses import dataclass

# Distinct characters a vocabulary may hold. 10,000 covers every alphabet and the few
# thousand CJK characters of everyday text; past it a "character" model is mostly an
# embedding table of symbols seen once or twice (a text of every Unicode code point has
# 1.1 million). The data checks refuse larger vocabularies with this figure.
MAX_VOCAB = 10_000
MAX_STEPS = 10_000_000  # ~a month of a tiny model on a GPU; also caps warm-up and intervals
MAX_SEED = 2**32 - 1  # what numpy's and torch's seeding accept


@dataclass(frozen=True)
class Bound:
    """The allowed range of one numeric field; inclusive ends unless marked open."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        """Whether `value` lies in the range (NaN never does)."""
        above = self.low < value if self.low_open else self.low <= value
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self, integer: bool) -> str:
        """'an integer in [1, 256]' or 'a number in (0.0, 10.0]'."""
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        kind = "an integer" if integer else "a number"
        return f"{kind} in {left}{self.low}, {self.high}{right}"


# Every numeric field's range, in one place: validate() enforces it, the sidebar's number
# widgets take their min and max from it and the README quotes it. The limits are generous
# for small character models on one machine or GPU box, yet keep every size a count or an
# estimate can loop over, or a tensor can be allocated for, finite. Cross-field rules
# (n_head divides d_model, min_lr <= lr, warmup_steps <= max_steps, ops_min_args <=
# ops_max_args) are checked in validate() on top.
BOUNDS: dict[str, Bound] = {
    # ModelConfig
    "vocab_size": Bound(1, MAX_VOCAB),
    "n_layer": Bound(1, 256),
    "n_head": Bound(1, 256),
    "d_model": Bound(1, 16_384),
    "block_size": Bound(1, 8_192),
    "dropout": Bound(0.0, 1.0, high_open=True),
    "residual_scale": Bound(0.0, 100.0),
    "ffn_mult": Bound(1, 64),
    "logit_softcap": Bound(0.0, 1000.0),
    # TrainConfig
    "batch_size": Bound(1, 65_536),
    "max_steps": Bound(1, MAX_STEPS),
    "lr": Bound(0.0, 10.0, low_open=True),
    "min_lr": Bound(0.0, 10.0),
    "warmup_steps": Bound(0, MAX_STEPS),
    "weight_decay": Bound(0.0, 10.0),
    "beta1": Bound(0.0, 1.0, high_open=True),
    "beta2": Bound(0.0, 1.0, high_open=True),
    "grad_clip": Bound(0.0, 1e6),
    "z_loss": Bound(0.0, 1.0),
    "devices": Bound(1, 1_024),
    "num_nodes": Bound(1, 1_024),
    "seed": Bound(0, MAX_SEED),
    "log_interval": Bound(1, MAX_STEPS),
    "eval_interval": Bound(1, MAX_STEPS),
    "eval_iters": Bound(1, 100_000),
    "probe_interval": Bound(1, MAX_STEPS),
    "sample_interval": Bound(1, MAX_STEPS),
    "ckpt_interval": Bound(0, MAX_STEPS),
    "ckpt_keep": Bound(2, 64),
    # DataConfig
    "val_fraction": Bound(0.0, 0.5, low_open=True),
    "ops_examples": Bound(10, 1_000_000),
    "ops_min_args": Bound(1, 9),
    "ops_max_args": Bound(1, 9),
    "ops_seed": Bound(0, MAX_SEED),
}
