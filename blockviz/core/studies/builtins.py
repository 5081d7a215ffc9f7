"""The built-in studies: each one's question, claims (with their sources) and variants.

Each `_<study>()` returns its `StudyDef` (`studies.define`) at no size (its base holds only
the study's own overrides; seeds and size are the defaults); `builtin(key, size, seeds)`
sizes one, `describe()` lists them. The grids' values (depths, learning rates, FFN widths)
and the margins the claims use are named here, with the calibration that chose them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from blockviz.core.fields import ConfigError
from blockviz.core.studies.define import (
    Claim,
    StudyDef,
    Variant,
    check_study,
    log_space,
    seeds_for,
    sized_base,
)

COURSE = "the course material"


def _lr_label(lr: float) -> str:
    """`lr 3e-4`, `lr 9.5e-4`: two significant digits, short exponent."""
    mantissa, exponent = f"{lr:.1e}".split("e")
    return f"lr {mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


NORM_NAMES = {"pre": "Pre-LN", "post": "Post-LN", "none": "no norm"}
LR_GRID = log_space(3e-4, 3e-1, 7)
DEPTHS_NORM = (6, 12)
DEPTHS_RESIDUAL = (2, 6, 12, 24)
FFN_MULTS = (1, 2, 4, 8, 16)
# High enough for the norm position to matter on the quick model: in a calibration sweep
# (12 layers, 300 steps, no warm-up, constant lr, seed 1; round two, val losses on the
# seed's own windows) Post-LN reached val loss 2.16 at 3e-3 and stalled at 3.24, the
# corpus's unigram entropy (3.25), at 1e-2.
NORM_POSITION_LR = 1e-2
# "At least as well" is judged as non-inferiority: the claim holds if the 95% interval of
# (claimed − other) final val loss stays below this many nats. 0.02 nats is a 2% change of
# perplexity (e^0.02 = 1.020), less than anyone would call "does worse". (For scale: on one
# evaluation set the quick activation study's GELU and ReLU runs differed by 0.008 in both
# seeds, and its variants' seeds by at most 0.014.)
NOT_WORSE_MARGIN = 0.02


def _norm_position() -> StudyDef:
    variants = []
    for depth in DEPTHS_NORM:
        variants += [
            Variant(
                f"Post-LN · depth {depth}",
                {"norm_position": "post", "n_layer": depth, "warmup_steps": 0},
            ),
            Variant(
                f"Post-LN + warm-up · depth {depth}", {"norm_position": "post", "n_layer": depth}
            ),
            Variant(
                f"Pre-LN · depth {depth}",
                {"norm_position": "pre", "n_layer": depth, "warmup_steps": 0},
            ),
        ]
    no_warmup = {"warmup": "off"}
    return StudyDef(
        key="norm-position",
        title="Post-LN or Pre-LN, with and without warm-up",
        question="Does the norm's position decide whether a deep block trains at a high "
        "learning rate, and does a warm-up rescue Post-LN?",
        claims=(
            Claim(
                "Post-LN without a learning-rate warm-up often fails to train (diverges, blows "
                "up or stalls).",
                f"{COURSE}; Xiong et al. 2020, On Layer Normalization in the Transformer "
                "Architecture",
                "fails_often",
                {"groups": [{"norm_position": "post", **no_warmup}]},
            ),
            Claim(
                "With a warm-up, Post-LN converges.",
                f"{COURSE}; Xiong et al. 2020",
                "converges",
                {"groups": [{"norm_position": "post", "warmup": "on"}]},
            ),
            Claim(
                "Pre-LN converges without a warm-up.",
                f"{COURSE}; Xiong et al. 2020",
                "converges",
                {"groups": [{"norm_position": "pre", **no_warmup}]},
            ),
        ),
        variants=tuple(variants),
        swept=("norm_position", "warmup", "n_layer"),
        baseline=f"Pre-LN · depth {DEPTHS_NORM[0]}",
        base={"lr": NORM_POSITION_LR, "lr_schedule": "constant"},
    )


def _lr_sensitivity() -> StudyDef:
    variants = tuple(
        Variant(
            f"{NORM_NAMES[position]} · {_lr_label(lr)}",
            {"norm_position": position, "lr": lr, "min_lr": 0.0},
        )
        for position in ("pre", "post", "none")
        for lr in LR_GRID
    )
    return StudyDef(
        key="lr-sensitivity",
        title="Learning-rate sensitivity",
        question="How much does the final loss depend on the learning rate with Pre-LN, "
        "Post-LN and no normalization?",
        claims=(
            Claim(
                "Pre-LN is easier to tune than Post-LN: its final loss depends less on the "
                "learning rate.",
                f"{COURSE}; sensitivity as defined by Wortsman et al. 2023, Small-scale "
                "proxies for large-scale Transformer training instabilities",
                "less_sensitive",
                {
                    "better": {"norm_position": "pre"},
                    "worse": {"norm_position": "post"},
                    "field": "lr",
                },
            ),
            Claim(
                "Without normalization the largest stable learning rate is far lower.",
                f"{COURSE}; Wortsman et al. 2023",
                "lower_max_stable_lr",
                {
                    "lower": {"norm_position": "none"},
                    "than": {"norm_position": "pre"},
                    "field": "lr",
                    "factor": 3,
                },
            ),
        ),
        variants=variants,
        swept=("lr", "norm_position"),
        baseline=f"Pre-LN · {_lr_label(LR_GRID[3])}",
    )


# Wortsman et al. 2023 sweep learning rates up to 1 for their small models; the instabilities
# qk-layernorm and the z-loss address (attention logits, output logits that grow without
# bound) show at the top of such a sweep, above the lr-sensitivity study's 0.3.
STABILITY_LR_GRID = log_space(1e-3, 1.0, 7)
STABILITY = "Wortsman et al. 2023, Small-scale proxies for large-scale Transformer training "
STABILITY += "instabilities (arXiv:2309.14322)"
Z_LOSS = 1e-4  # the coefficient PaLM used, and Wortsman et al. with it
STABILIZERS = {  # label: overrides; the claims compare each with "neither"
    "neither": {"qk_norm": False, "z_loss": 0.0},
    "qk-layernorm": {"qk_norm": True, "z_loss": 0.0},
    "z-loss": {"qk_norm": False, "z_loss": Z_LOSS},
    "both": {"qk_norm": True, "z_loss": Z_LOSS},
}


def _stability() -> StudyDef:
    variants = tuple(
        Variant(f"{name} · {_lr_label(lr)}", {**overrides, "lr": lr, "min_lr": 0.0})
        for name, overrides in STABILIZERS.items()
        for lr in STABILITY_LR_GRID
    )
    neither = STABILIZERS["neither"]
    return StudyDef(
        key="qk-norm-z-loss",
        title="qk-layernorm, z-loss and the learning rate",
        question="Do qk-layernorm and the z-loss make the final loss depend less on the "
        "learning rate, and keep a block stable at learning rates where it fails without "
        "them?",
        claims=(
            Claim(
                "qk-layernorm makes the final loss depend less on the learning rate.",
                f"{STABILITY}: qk-layernorm against attention logit growth",
                "less_sensitive",
                {"better": STABILIZERS["qk-layernorm"], "worse": neither, "field": "lr"},
            ),
            Claim(
                "The z-loss makes the final loss depend less on the learning rate.",
                f"{STABILITY}: the z-loss against output logit divergence",
                "less_sensitive",
                {"better": STABILIZERS["z-loss"], "worse": neither, "field": "lr"},
            ),
            Claim(
                "Without qk-layernorm the largest stable learning rate is lower.",
                STABILITY,
                "lower_max_stable_lr",
                {
                    "lower": neither,
                    "than": STABILIZERS["qk-layernorm"],
                    "field": "lr",
                    "factor": 3,  # at least one step of the grid (3.16×) lower
                },
            ),
        ),
        variants=variants,
        swept=("lr", "qk_norm", "z_loss"),
        baseline=f"neither · {_lr_label(STABILITY_LR_GRID[2])}",
    )


SOFTCAP = 30.0  # Gemma 2's cap on the final logits
GEMMA = "Gemma Team 2024, Gemma 2: Improving Open Language Models at a Practical Size"


def _logit_softcap() -> StudyDef:
    variants = tuple(
        Variant(
            f"{'softcap 30' if cap else 'no softcap'} · {_lr_label(lr)}",
            {"logit_softcap": cap, "lr": lr, "min_lr": 0.0},
        )
        for cap in (0.0, SOFTCAP)
        for lr in STABILITY_LR_GRID
    )
    return StudyDef(
        key="logit-softcap",
        title="Logit soft-capping and the learning rate",
        question="Does capping the output logits make the final loss depend less on the "
        "learning rate?",
        claims=(
            Claim(
                "Soft-capping the output logits at 30 makes the final loss depend less on "
                "the learning rate.",
                f"{GEMMA} (caps the final logits at 30 for stability); sensitivity as "
                "defined by Wortsman et al. 2023",
                "less_sensitive",
                {
                    "better": {"logit_softcap": SOFTCAP},
                    "worse": {"logit_softcap": 0.0},
                    "field": "lr",
                },
            ),
        ),
        variants=variants,
        swept=("lr", "logit_softcap"),
        baseline=f"no softcap · {_lr_label(STABILITY_LR_GRID[2])}",
    )


def _residual_depth() -> StudyDef:
    variants = tuple(
        Variant(
            f"residual {'on' if on else 'off'} · depth {depth}", {"residual": on, "n_layer": depth}
        )
        for on in (True, False)
        for depth in DEPTHS_RESIDUAL
    )
    deepest = DEPTHS_RESIDUAL[-1]
    return StudyDef(
        key="residual-depth",
        title="Residual connections and depth",
        question="Do deep stacks still train when the blocks have no residual path?",
        claims=(
            Claim(
                "Without residual connections, deep stacks fail to train.",
                f"{COURSE}; He et al. 2016, Deep Residual Learning for Image Recognition",
                "fails_deep",
                {
                    "deep": {"residual": False, "n_layer": deepest},
                    "reference": {"residual": True, "n_layer": deepest},
                },
            ),
        ),
        variants=variants,
        swept=("n_layer", "residual"),
        baseline=f"residual on · depth {DEPTHS_RESIDUAL[0]}",
    )


def _normalization() -> StudyDef:
    variants = (
        Variant("no norm", {"norm_position": "none"}),
        Variant("BatchNorm", {"norm_type": "batchnorm"}),
        Variant("LayerNorm", {"norm_type": "layernorm"}),
        Variant("RMSNorm", {"norm_type": "rmsnorm"}),
    )
    return StudyDef(
        key="normalization",
        title="Which normalization",
        question="Does the kind of normalization in a Pre-LN block change how well it trains?",
        claims=(
            Claim(
                "LayerNorm trains a transformer to a lower loss than BatchNorm.",
                f"{COURSE}; Shen et al. 2020, PowerNorm: Rethinking Batch Normalization in "
                "Transformers",
                "lower_loss",
                {"better": "LayerNorm", "worse": "BatchNorm"},
            ),
            Claim(
                "RMSNorm does at least as well as LayerNorm.",
                "Zhang & Sennrich 2019, Root Mean Square Layer Normalization: comparable "
                "performance without re-centring",
                "not_worse",
                {"better": "RMSNorm", "worse": "LayerNorm", "margin": NOT_WORSE_MARGIN},
            ),
        ),
        variants=variants,
        swept=("norm_type", "norm_position"),
        baseline="LayerNorm",
        base={"norm_position": "pre"},
    )


def _ffn_ratio() -> StudyDef:
    variants = tuple(Variant(f"FFN {m}×", {"ffn_mult": m}) for m in FFN_MULTS)
    return StudyDef(
        key="ffn-ratio",
        title="FFN width",
        question="How wide should the FFN be relative to d_model?",
        claims=(
            Claim(
                "4× is the sweet spot for the FFN's width.",
                f"{COURSE}; Vaswani et al. 2017 use d_ff = 4 · d_model",
                "sweet_spot",
                {"at": {"ffn_mult": 4}, "field": "ffn_mult"},
            ),
            Claim(
                "The FFN holds about 2/3 of a block's parameters.",
                COURSE,
                "param_share",
                {"variant": "FFN 4×", "part": "ffn", "low": 0.6, "high": 0.72},
            ),
        ),
        variants=variants,
        swept=("ffn_mult",),
        baseline="FFN 4×",
    )


def _activation() -> StudyDef:
    names = {"relu": "ReLU", "gelu": "GELU", "silu": "SiLU (Swish)", "swiglu": "SwiGLU"}
    return StudyDef(
        key="activation",
        title="FFN activation",
        question="Does the FFN's activation change the loss a block reaches?",
        claims=(
            Claim(
                "GELU does at least as well as ReLU.",
                f"{COURSE}; Hendrycks & Gimpel 2016, Gaussian Error Linear Units",
                "not_worse",
                {"better": "GELU", "worse": "ReLU", "margin": NOT_WORSE_MARGIN},
            ),
        ),
        variants=tuple(Variant(name, {"activation": key}) for key, name in names.items()),
        swept=("activation",),
        baseline="GELU",
    )


# A SwiGLU FFN has three d_model x d_ff matrices to GELU's two (model.FFN), so at
# ffn_mult 2 it holds exactly the weights of a GELU FFN at ffn_mult 3: the pair compares the
# activations at equal parameters, as Shazeer 2020 does by shrinking d_ff by 2/3.
SWIGLU_MATCHED = {"GELU · FFN 3×": ("gelu", 3), "SwiGLU · FFN 2×": ("swiglu", 2)}


def _swiglu() -> StudyDef:
    return StudyDef(
        key="swiglu",
        title="SwiGLU at equal parameters",
        question="With the FFN's weights held equal, does a gated (SwiGLU) FFN reach a lower "
        "loss than a GELU one?",
        claims=(
            Claim(
                "At equal parameters, SwiGLU trains to a lower loss than GELU.",
                "Shazeer 2020, GLU Variants Improve Transformer (d_ff shrunk by 2/3 to keep "
                "the parameters equal)",
                "lower_loss",
                {"better": "SwiGLU · FFN 2×", "worse": "GELU · FFN 3×"},
            ),
        ),
        variants=tuple(
            Variant(label, {"activation": key, "ffn_mult": mult})
            for label, (key, mult) in SWIGLU_MATCHED.items()
        ),
        swept=("activation", "ffn_mult"),
        baseline="GELU · FFN 3×",
    )


# GPT-2's init (both embeddings at std 0.02), as tied GPT-2 and nanoGPT use. At the default
# one the shared matrix keeps the head's small Linear init beside a position embedding at
# std 1, and quick tied runs stalled at the unigram entropy (docs/studies.md).
TIED_INIT = "gpt2"


def _tied_embeddings() -> StudyDef:
    return StudyDef(
        key="tied-embeddings",
        title="Tied embeddings",
        question="Does sharing the token embedding with the LM head cost any loss (at "
        "GPT-2's initialisation)?",
        claims=(
            Claim(
                "Tying the token embedding and the LM head does at least as well as two matrices.",
                "Press & Wolf 2017, Using the Output Embedding to Improve Language Models",
                "not_worse",
                {"better": "tied", "worse": "untied", "margin": NOT_WORSE_MARGIN},
            ),
        ),
        variants=(
            Variant("untied", {"tie_weights": False}),
            Variant("tied", {"tie_weights": True}),
        ),
        swept=("tie_weights",),
        baseline="untied",
        base={"init": TIED_INIT},
    )


def _sublayers() -> StudyDef:
    return StudyDef(
        key="sublayers",
        title="Attention, FFN, or both",
        question="What does each sublayer contribute on its own?",
        claims=(
            Claim(
                "Attention alone trains to a higher loss than the full block.",
                COURSE,
                "lower_loss",
                {"better": "attention + FFN", "worse": "attention only"},
            ),
            Claim(
                "The FFN alone (no token mixing) trains to a higher loss than the full block.",
                COURSE,
                "lower_loss",
                {"better": "attention + FFN", "worse": "FFN only"},
            ),
        ),
        variants=(
            Variant("attention only", {"ffn": False}),
            Variant("FFN only", {"attention": False}),
            Variant("attention + FFN", {}),
        ),
        swept=("attention", "ffn"),
        baseline="attention + FFN",
    )


INIT_DEPTHS = (3, 6, 12, 24)


def _init_gradients() -> StudyDef:
    variants = tuple(
        Variant(f"depth {depth} · {init} init", {"n_layer": depth, "init": init})
        for depth in INIT_DEPTHS
        for init in ("default", "gpt2", "xavier")
    )
    return StudyDef(
        key="init-gradients",
        title="Gradients at initialisation",
        question="How large is each layer's gradient before any training, Pre-LN against "
        "Post-LN, by depth and initialisation?",
        claims=(),
        variants=variants,
        swept=("n_layer", "init"),
        baseline=variants[0].label,
        trains=False,
    )


BUILTINS: dict[str, Callable[[], StudyDef]] = {
    "norm-position": _norm_position,
    "lr-sensitivity": _lr_sensitivity,
    "qk-norm-z-loss": _stability,
    "logit-softcap": _logit_softcap,
    "residual-depth": _residual_depth,
    "normalization": _normalization,
    "ffn-ratio": _ffn_ratio,
    "activation": _activation,
    "swiglu": _swiglu,
    "tied-embeddings": _tied_embeddings,
    "sublayers": _sublayers,
    "init-gradients": _init_gradients,
}
STUDY_KEYS = tuple(BUILTINS)


def builtin(key: str, size: str = "quick", seeds: int | str | None = None) -> StudyDef:
    """A built-in study at a size with its seeds (`define.seeds_for`: a count, or text such
    as `5-8`); ConfigError for an unknown key, size or bad seeds."""
    if key not in BUILTINS:
        raise ConfigError("study", key, "choose one of " + ", ".join(STUDY_KEYS))
    study = BUILTINS[key]()
    base = sized_base(size, study.base)
    chosen = seeds_for(seeds, size, base.get("accelerator", "auto"))
    sized = replace(study, base=base, seeds=chosen, size=size)
    check_study(sized)
    return sized


def describe(studies: Iterable[str] = STUDY_KEYS) -> list[tuple[str, str, str]]:
    """(key, title, question) of the built-in studies."""
    defined = [BUILTINS[key]() for key in studies]
    return [(study.key, study.title, study.question) for study in defined]
