"""The named presets: each a set of overrides on the default `RunConfig`, and its description.

`core.config.preset(name)` builds a preset's config; the sidebar, `--preset` and the URL
read the names and descriptions from here. Plain data.
"""

from __future__ import annotations

from typing import Any

# Starting points for the sidebar and `--preset`. Each is a set of overrides on the
# defaults, so a preset names only what makes it what it is.
DEFAULT_PRESET = "baby-cpu"  # RunConfig() is this preset
PLAYGROUND_PRESET = "playground"  # the Playground's start (docs/pages.md measures it)
PRESETS: dict[str, dict[str, Any]] = {
    "baby-cpu": {},  # the defaults are the baby-cpu run: 4x4x128, ctx 64, 2000 steps
    "gpt2-preln": {"norm_position": "pre", "init": "gpt2", "bias": True, "activation": "gelu"},
    "postln-original": {
        "norm_position": "post",
        "activation": "relu",
        "init": "default",
        "final_norm": False,
    },
    "no-residual": {"residual": False},
    "rmsnorm": {"norm_type": "rmsnorm", "bias": False, "activation": "swiglu"},
    "attention-only": {"ffn": False},
    "ffn-only": {"attention": False},
    "tiny": {
        "n_layer": 2,
        "n_head": 2,
        "d_model": 32,
        "block_size": 32,
        "batch_size": 8,
        "max_steps": 50,
        "warmup_steps": 5,
        "eval_interval": 25,
        "eval_iters": 2,
        "probe_interval": 10,
        "sample_interval": 25,
    },
    # The Playground's start (PLAYGROUND_PRESET): small enough that an
    # auto-run takes well under 30 s on a laptop core, and a learning rate high enough, with
    # no warm-up, that the block's wiring shows (docs/pages.md has what each toggle does).
    "playground": {
        "n_layer": 4,
        "n_head": 2,
        "d_model": 32,
        "block_size": 32,
        "batch_size": 8,
        "lr": 0.03,
        "warmup_steps": 0,
        "max_steps": 800,
        "eval_interval": 200,
        "eval_iters": 10,
        "sample_interval": 400,
    },
}

PRESET_DESCRIPTIONS: dict[str, str] = {
    "baby-cpu": "4 layers, 4 heads, d_model 128, ctx 64: trains on a laptop CPU in minutes",
    "gpt2-preln": "Pre-LN with GPT-2 initialisation: the modern default",
    "postln-original": "Post-LN with ReLU as in 'Attention Is All You Need', no final norm",
    "no-residual": "Pre-LN without skip connections; Compare draws its gradient by layer",
    "rmsnorm": "RMSNorm, no biases, SwiGLU FFN (the LLaMA-style block)",
    "attention-only": "Blocks without the FFN",
    "ffn-only": "Blocks without attention (no token mixing)",
    "tiny": "2 layers, d_model 32, 50 steps: a smoke test in seconds",
    "playground": "4 layers, d_model 32, lr 0.03 without warm-up: the Playground's start",
}
