"""The model's fields (`ModelConfig`): the block's shape and wiring, one `knob` each.

Each field is declared here once, with everything blockviz says about it (`core.fields`);
`core.config` collects them into the registry. A new architecture toggle is one entry
here, the model code that reads it, and tests (docs/development.md, "Add a config field").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from blockviz.core.bounds import MAX_VOCAB, Bound
from blockviz.core.fields import (
    ARCHITECTURE,
    FORK_OFFERED,
    ConfigError,
    check_fields,
    knob,
)

NORM_POSITIONS = ("pre", "post", "none")
NORM_TYPES = ("layernorm", "rmsnorm", "batchnorm")
ACTIVATIONS = ("gelu", "relu", "silu", "swiglu")
INITS = ("default", "gpt2", "xavier")

_PRE = {"pre": "pre-ln", "post": "post-ln", "none": "no-norm"}
_FINAL = {None: "finalnorm-auto", True: "finalnorm", False: "no-finalnorm"}


def _on_off(on: str, off: str) -> Callable[[Any], str]:
    return lambda value: on if value else off


@dataclass
class ModelConfig:
    """Shape and wiring of the CharTransformer; every block toggle is a field."""

    SECTION: ClassVar[str] = "model"

    vocab_size: int = knob(
        65,
        "Vocabulary size",
        "Size of the character vocabulary; set from the dataset when a run starts.",
        bound=Bound(1, MAX_VOCAB),
    )
    norm_position: str = knob(
        "pre",
        "Norm position",
        "Where the norms sit: Pre-LN `x + f(norm(x))`, Post-LN `norm(x + f(x))`, or no "
        "normalisation anywhere.",
        choices=NORM_POSITIONS,
        group=ARCHITECTURE,
        token=_PRE.__getitem__,
        fork=FORK_OFFERED,
        code="pre | post | none",
    )
    norm_type: str = knob(
        "layernorm",
        "Norm type",
        "LayerNorm (weight, plus bias if `bias`), RMSNorm (weight only, no mean-centring) or "
        "BatchNorm (weight, plus bias if `bias`; it normalises each channel over the batch and "
        "positions, with running statistics in eval); eps 1e-5.",
        choices=NORM_TYPES,
        group=ARCHITECTURE,
        token=str,
        code="layernorm | rmsnorm | batchnorm",
    )
    residual: bool = knob(
        True,
        "Residual (skip) connections",
        "Off removes the skip path: `x = s·f(norm(x))` (pre) or `x = norm(s·f(x))` (post); the "
        "norms stay where they were.",
        group=ARCHITECTURE,
        token=_on_off("resid", "no-resid"),
        code="False: each block is x = f(x), without its skip path",
    )
    residual_scale: float = knob(
        1.0,
        "Residual scale",
        "`s`: multiplies each branch (attention, FFN) before it joins the stream.",
        bound=Bound(0.0, 100.0),
        group=ARCHITECTURE,
        step=0.1,
        fmt="%.2f",
        token=lambda v: f"rs{v:g}",
        code="multiplier on each branch before it joins the stream",
    )
    attention: bool = knob(
        True,
        "Attention sublayer",
        "Off: FFN-only blocks (no token mixing at all); the attention sublayer and its norm "
        "are removed entirely (no parameters).",
        group=ARCHITECTURE,
        token=_on_off("attn", "no-attn"),
        code="False: FFN-only blocks",
    )
    qk_norm: bool = knob(
        False,
        "QK-norm",
        "Normalise each head's queries and keys over `head_dim` before their dot product, so "
        "the attention logits no longer grow with the size of q and k, a growth that can "
        'collapse each softmax onto one key (Dehghani et al. 2023, "Scaling Vision '
        'Transformers to 22 Billion Parameters"; Wortsman et al. 2023, "Small-scale proxies '
        'for large-scale Transformer training instabilities", both with LayerNorm). A '
        "LayerNorm of width `head_dim` (bias if `bias`) for the queries and one for the keys "
        "per layer, shared by the heads; an RMSNorm under norm type rmsnorm. The 1/√head_dim "
        "scale is kept; works with every norm position, none included.",
        group=ARCHITECTURE,
        token=_on_off("qknorm", "no-qknorm"),
        code="normalise each head's q and k (LayerNorm; RMSNorm under rmsnorm)",
    )
    ffn: bool = knob(
        True,
        "FFN sublayer",
        "Off: attention-only blocks; the FFN and its norm are removed entirely. Attention and "
        "FFN cannot both be off.",
        group=ARCHITECTURE,
        token=_on_off("ffn", "no-ffn"),
        code="False: attention-only blocks",
    )
    activation: str = knob(
        "gelu",
        "FFN activation",
        "FFN nonlinearity. swiglu projects to 2·d_ff, splits into gate and value and uses "
        "`silu(gate) · value`; with the same d_ff it has 1.5× the FFN weights.",
        choices=ACTIVATIONS,
        group=ARCHITECTURE,
        token=str,
        code="gelu | relu | silu | swiglu",
    )
    ffn_mult: int = knob(
        4,
        "FFN width multiplier",
        "FFN hidden width `d_ff = ffn_mult · d_model`; 4 is the original Transformer's and "
        "GPT-2's choice.",
        bound=Bound(1, 64),
        group=ARCHITECTURE,
        step=1,
        token=lambda v: f"ffn{v}x",
        code="d_ff = FFN_MULT * D_MODEL",
    )
    n_layer: int = knob(
        4,
        "Layers (n_layer)",
        "Number of blocks.",
        bound=Bound(1, 256),
        group=ARCHITECTURE,
        step=1,
        token=lambda v: f"{v}L",
        code="blocks",
    )
    n_head: int = knob(
        4,
        "Heads (n_head)",
        "Attention heads per block; each has d_model / n_head dimensions, so it must divide "
        "d_model.",
        bound=Bound(1, 256),
        group=ARCHITECTURE,
        step=1,
        token=lambda v: f"{v}H",
        code="attention heads; must divide D_MODEL",
    )
    d_model: int = knob(
        128,
        "Width (d_model)",
        "Width of the residual stream and the embeddings.",
        bound=Bound(1, 16_384),
        group=ARCHITECTURE,
        step=16,
        token=lambda v: f"d{v}",
        code="width of the residual stream",
    )
    block_size: int = knob(
        64,
        "Context (block_size)",
        "Context length in characters (rows of the learned position embedding); a longer "
        "input is an error.",
        bound=Bound(1, 8_192),
        group=ARCHITECTURE,
        step=16,
        token=lambda v: f"ctx{v}",
        code="context length in characters",
    )
    dropout: float = knob(
        0.0,
        "Dropout",
        "Dropout after the embeddings, on the attention weights and on each branch output "
        "(as in nanoGPT); small models on small corpora rarely need it at first.",
        bound=Bound(0.0, 1.0, high_open=True),
        group=ARCHITECTURE,
        step=0.05,
        fmt="%.2f",
        fork=FORK_OFFERED,
        code="",
    )
    bias: bool = knob(
        True,
        "Biases",
        "Biases in every Linear layer (not the LM head) and in the norms that have one "
        "(GPT-2 has them).",
        group=ARCHITECTURE,
        token=_on_off("bias", "nobias"),
        code="biases in Linear layers and LayerNorms",
    )
    final_norm: bool | None = knob(
        None,
        "Final norm",
        "Norm before the LM head. auto: on for pre, off for post; never with norm position none.",
        group=ARCHITECTURE,
        token=_FINAL.__getitem__,
        code="None = auto: on for pre, off for post and none",
    )
    tie_weights: bool = knob(
        False,
        "Tie embedding and LM head",
        "The LM head reuses the token-embedding matrix (counted once; it keeps the head's "
        "initialisation). With init default that is small beside the position embedding "
        "(std 1) and drowns the tokens: a quick run stalled at the unigram entropy; use init "
        "gpt2 (both embeddings at std 0.02).",
        group=ARCHITECTURE,
        token=_on_off("tied", "untied"),
        code="share the token embedding with the LM head",
    )
    logit_softcap: float = knob(
        0.0,
        "Logit soft-cap",
        "c > 0: the LM head's logits become `c·tanh(logits / c)`, smooth and never past ±c "
        '(Gemma Team 2024, "Gemma 2: Improving Open Language Models at a Practical Size", '
        "caps at 30); before the loss and before sampling. 0: off.",
        bound=Bound(0.0, 1000.0),
        group=ARCHITECTURE,
        step=5.0,
        fmt="%.1f",
        token=lambda v: f"softcap{v:g}" if v else "no-softcap",
        fork=FORK_OFFERED,
        code="C > 0: logits = C * tanh(logits / C); 0: off",
    )
    init: str = knob(
        "default",
        "Initialisation",
        "default: PyTorch's own. gpt2: Linear and Embedding weights ~ N(0, 0.02), biases 0, "
        "and the projections that write into the stream ~ N(0, 0.02/√(2·n_layer)). xavier: "
        "every Linear weight Xavier-uniform, biases 0, embeddings N(0, 1) (the init Xiong et "
        'al. 2020, "On Layer Normalization in the Transformer Architecture", analyse). '
        "Norms start at weight 1, bias 0 under every init.",
        choices=INITS,
        group=ARCHITECTURE,
        token=lambda v: f"{v}-init",
        per_replica=True,
        code="default (PyTorch's) | gpt2 | xavier",
    )

    @property
    def d_ff(self) -> int:
        """Hidden width of the FFN."""
        return self.ffn_mult * self.d_model

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_head

    @property
    def use_final_norm(self) -> bool:
        """Whether a norm sits before the LM head, resolving the `None` default."""
        if self.norm_position == "none":
            return False
        if self.final_norm is None:
            return self.norm_position == "pre"
        return self.final_norm

    def validate(self) -> ModelConfig:
        """Raise ConfigError on the first bad field; return self when all are fine."""
        check_fields(self)
        if not (self.attention or self.ffn):
            raise ConfigError(
                "ffn", self.ffn, "attention and ffn cannot both be off (the block would be empty)"
            )
        if self.attention and self.d_model % self.n_head:
            divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
            raise ConfigError(
                "n_head",
                self.n_head,
                f"must divide d_model={self.d_model}; try one of {', '.join(map(str, divisors))}",
            )
        return self


# Which tensors weight_decay reaches, as training.lit.param_groups builds AdamW's groups
# (tests/training/test_lit.py checks that function tensor by tensor).
