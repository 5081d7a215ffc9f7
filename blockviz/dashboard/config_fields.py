"""The config fields as sidebar widgets: labels, help, kinds, steps, ranges and datasets.

Streamlit-free: what each widget is, not how it is drawn (that is `sidebar`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blockviz.core import config, spec
from blockviz.core.bounds import BOUNDS
from blockviz.core.corpora import BUILTIN

UPLOAD_CHOICE = "upload your own text"
DATASET_CHOICES = (*BUILTIN, UPLOAD_CHOICE)  # a new built-in corpus needs only a note below
DATASET_NOTES = {
    "pydocs": "Python's built-in help topics (~1 MB of English prose and code), offline.",
    "pycode": "Python standard-library source (first 2M characters), offline.",
    "shakespeare": "Tiny Shakespeare: downloads 1.1 MB once, then read from the cache.",
    "ops": f"Synthetic lines like `max(3,9,2)=9`: {spec.VAL_ANSWER_ACC} measures the answers.",
    UPLOAD_CHOICE: "Your own UTF-8 text (.txt, .md, .py, .csv), at most 20 MB.",
}
FINAL_NORM_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class Field:
    """How one config field appears as a widget."""

    name: str
    label: str
    kind: str  # select | bool | int | float | tristate
    help: str = ""
    options: Sequence[str] = ()
    step: float | int | None = None
    fmt: str | None = None


ARCHITECTURE = (
    Field(
        "norm_position",
        "Norm position",
        "select",
        "pre: x + f(norm(x)) · post: norm(x + f(x)) · none: no norms at all",
        config.NORM_POSITIONS,
    ),
    Field(
        "norm_type",
        "Norm type",
        "select",
        "RMSNorm drops the mean-centring and the bias",
        config.NORM_TYPES,
    ),
    Field("residual", "Residual (skip) connections", "bool", "off: x = f(x), no skip path"),
    Field(
        "residual_scale",
        "Residual scale",
        "float",
        "multiplier on each branch before it joins the stream",
        step=0.1,
        fmt="%.2f",
    ),
    Field("attention", "Attention sublayer", "bool", "off: FFN-only blocks (no token mixing)"),
    Field(
        "qk_norm",
        "QK-norm",
        "bool",
        "normalise each head's queries and keys (LayerNorm; RMSNorm under rmsnorm) before "
        "q·k, so attention logits cannot grow with them (Dehghani et al. 2023, "
        "Wortsman et al. 2023)",
    ),
    Field("ffn", "FFN sublayer", "bool", "off: attention-only blocks"),
    Field(
        "activation",
        "FFN activation",
        "select",
        "swiglu gates: silu(x W) * (x V), then W_out",
        config.ACTIVATIONS,
    ),
    Field("ffn_mult", "FFN width multiplier", "int", "d_ff = ffn_mult × d_model", step=1),
    Field("n_layer", "Layers (n_layer)", "int", "number of blocks", step=1),
    Field("n_head", "Heads (n_head)", "int", "must divide d_model", step=1),
    Field("d_model", "Width (d_model)", "int", "residual stream width", step=16),
    Field("block_size", "Context (block_size)", "int", "characters per sequence", step=16),
    Field("dropout", "Dropout", "float", "in [0, 1)", step=0.05, fmt="%.2f"),
    Field("bias", "Biases", "bool", "biases in Linear layers and LayerNorms"),
    Field("final_norm", "Final norm", "tristate", "auto: on for Pre-LN, off for Post-LN"),
    Field("tie_weights", "Tie embedding and LM head", "bool", "share one matrix"),
    Field(
        "logit_softcap",
        "Logit soft-cap",
        "float",
        "c > 0: logits = c·tanh(logits / c), none past ±c (Gemma 2 uses 30); 0: off",
        step=5.0,
        fmt="%.1f",
    ),
    Field(
        "init",
        "Initialisation",
        "select",
        "gpt2: N(0, 0.02), residual projections / sqrt(2·n_layer); xavier: Xavier-uniform "
        "Linear weights, zero biases (Xiong et al. 2020)",
        config.INITS,
    ),
)
TRAINING = (
    Field("batch_size", "Batch size", "int", "sequences per step", step=1),
    Field("max_steps", "Steps (max_steps)", "int", "optimizer steps", step=100),
    Field("lr", "Learning rate", "float", "peak learning rate", step=1e-4, fmt="%.1e"),
    Field("min_lr", "Minimum LR", "float", "floor of the decay", step=1e-5, fmt="%.1e"),
    Field("warmup_steps", "Warm-up steps", "int", "linear warm-up", step=10),
    Field("lr_schedule", "LR schedule", "select", "", config.LR_SCHEDULES),
    Field(
        "precision",
        "Precision",
        "select",
        "auto: bf16-mixed on a CUDA GPU that supports it, else 32-true",
        config.PRECISIONS,
    ),
    Field(
        "accelerator",
        "Accelerator",
        "select",
        "auto picks a GPU if one is visible",
        config.ACCELERATORS,
    ),
)
TRAINING_ADVANCED = (
    Field(
        "weight_decay",
        "Weight decay",
        "float",
        config.WEIGHT_DECAY_HELP,
        step=0.01,
        fmt="%.3f",
    ),
    Field("beta1", "Adam beta1", "float", "", step=0.001, fmt="%.3f"),
    Field("beta2", "Adam beta2", "float", "", step=0.001, fmt="%.3f"),
    Field("grad_clip", "Gradient clip", "float", "0 disables clipping", step=0.1, fmt="%.2f"),
    Field(
        "z_loss",
        "z-loss",
        "float",
        "adds z_loss·mean((log Z)²) to the objective, log Z the logsumexp of the logits "
        "(PaLM: 1e-4); the logged train loss stays the cross-entropy; 0: off",
        step=1e-4,
        fmt="%.1e",
    ),
    Field("devices", "Devices", "int", "per node", step=1),
    Field("num_nodes", "Nodes", "int", "", step=1),
    Field("strategy", "Strategy", "select", "ddp for several GPUs", config.STRATEGIES),
    Field("seed", "Seed", "int", "", step=1),
    Field("compile", "torch.compile", "bool", "worth it on a GPU, not on a laptop CPU"),
    Field("log_interval", "Log every (steps)", "int", "train loss / lr / throughput", step=1),
    Field("eval_interval", "Evaluate every (steps)", "int", "validation loss", step=10),
    Field("eval_iters", "Validation batches", "int", "per evaluation", step=1),
    Field("probe_interval", "Probe every (steps)", "int", "gradient / activation stats", step=10),
    Field("sample_interval", "Sample every (steps)", "int", "text samples, attention", step=10),
    Field(
        "ckpt_interval",
        "Checkpoint every (steps)",
        "int",
        "fork and replay points; 0: none",
        step=50,
    ),
    Field("ckpt_keep", "Checkpoints kept", "int", "more thin out (the spacing doubles)", step=1),
    Field(
        "logger",
        "Also log to",
        "select",
        "TensorBoard or CSV files in the run's folder, besides the dashboard",
        config.LOGGERS,
    ),
)
OPS_FIELDS = (
    Field("ops_examples", "ops: lines", "int", "", step=1000),
    Field("ops_min_args", "ops: min arguments", "int", "", step=1),
    Field("ops_max_args", "ops: max arguments", "int", "at most 9", step=1),
    Field("ops_seed", "ops: seed", "int", "", step=1),
)
VAL_FRACTION = Field(
    "val_fraction",
    "Validation fraction",
    "float",
    "the last part of the text",
    step=0.01,
    fmt="%.2f",
)
ALL_FIELDS = (*ARCHITECTURE, *TRAINING, *TRAINING_ADVANCED, *OPS_FIELDS, VAL_FRACTION)
SPECS = {spec.name: spec for spec in ALL_FIELDS}
# The Playground's fields, beside its chart (the sidebar leaves them out there): the block's
# wiring, its depth and the learning rate. Each flips a curve within a few hundred steps.
QUICK_FIELDS = (
    "norm_position",
    "norm_type",
    "residual",
    "attention",
    "ffn",
    "activation",
    "n_layer",
    "lr",
)
# Fields a run fills in itself: vocab_size comes from the dataset, dataset from its widget.
NOT_WIDGETS = ("vocab_size", "dataset")


def to_widget(name: str, value: Any) -> Any:
    """A config value as its widget holds it."""
    if name == "final_norm":
        return {None: "auto", True: "on", False: "off"}[value]
    if name == "dataset":
        return value if value in DATASET_CHOICES else UPLOAD_CHOICE
    spec = SPECS.get(name)
    if spec is not None and spec.kind == "float":
        return float(value)
    if spec is not None and spec.kind == "int":
        return int(value)
    return value


def from_widget(name: str, value: Any) -> Any:
    """A widget value as the config field holds it."""
    if name == "final_norm":
        return {"auto": None, "on": True, "off": False}.get(value)
    return value


def widget_range(name: str, kind: str) -> tuple[int, int] | tuple[float, float]:
    """(min_value, max_value) of a number widget: the field's bounds.BOUNDS, typed."""
    bound = BOUNDS[name]
    if kind == "int":
        return int(bound.low), int(bound.high)
    return float(bound.low), float(bound.high)
