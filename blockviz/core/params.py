"""Parameter breakdown and training-memory estimate of a config, without torch.

The UI recomputes this on every sidebar change, so it must stay pure arithmetic. The counts
mirror blockviz.training.model exactly (a test checks them against `sum(p.numel())` over a grid of
configs). Layer numbers follow the model's convention: -1 for the embeddings, 0..n_layer-1
for the blocks, n_layer for the final norm and the LM head. `estimate_memory` turns a run
config into the bytes one training step needs, so a run too large for the machine is
refused with its estimate (`check_fits`) before it allocates anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import psutil

from blockviz.core.config import RunConfig, check_int
from blockviz.core.config_model import ModelConfig
from blockviz.core.fields import ConfigError
from blockviz.core.spec import PARAM_GROUPS, layer_label

# The breakdown's rows are parameter groups, finer than the probes' components
# (spec.PARAM_GROUPS maps each to its component).
PARAM_GROUP_NAMES = tuple(PARAM_GROUPS)


@dataclass(frozen=True)
class ParamRow:
    """Parameters of one component in one layer, with the formula that gives the count."""

    layer: int
    component: str
    count: int
    formula: str


@dataclass(frozen=True)
class Breakdown:
    """Every component that exists in a model, one row per (layer, component).

    Switched-off sublayers and absent norms have no rows. The LM head always has one: with
    tie_weights its count is 0 (the shared matrix is counted under token_embedding).
    """

    rows: list[ParamRow]

    @property
    def total(self) -> int:
        """All parameters, a tied matrix counted once."""
        return sum(row.count for row in self.rows)

    def by_component(self) -> dict[str, int]:
        """Count per component, summed over layers, in forward order."""
        counts: dict[str, int] = {}
        for component in PARAM_GROUP_NAMES:
            matching = [row.count for row in self.rows if row.component == component]
            if matching:
                counts[component] = sum(matching)
        return counts

    def by_layer(self) -> dict[int, int]:
        """Count per layer (-1 embeddings, blocks, n_layer head end), in layer order."""
        counts: dict[int, int] = {}
        for row in sorted(self.rows, key=lambda r: r.layer):
            counts[row.layer] = counts.get(row.layer, 0) + row.count
        return counts

    def shares(self) -> dict[str, float]:
        """Percentage of the total per component."""
        total = self.total
        return {name: 100.0 * count / total for name, count in self.by_component().items()}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict: total, components, shares, layers (keys as text), rows."""
        return {
            "total": self.total,
            "components": self.by_component(),
            "shares": {name: round(share, 4) for name, share in self.shares().items()},
            "layers": {str(layer): count for layer, count in self.by_layer().items()},
            "rows": [dataclasses.asdict(row) for row in self.rows],
        }


def _formula(terms: list[tuple[str, str, int]]) -> tuple[int, str]:
    """Sum of (symbols, numbers, value) terms as a count and 'symbols = numbers = count'."""
    count = sum(value for _, _, value in terms)
    symbols = " + ".join(symbol for symbol, _, _ in terms)
    numbers = " + ".join(number for _, number, _ in terms)
    if numbers == symbols or numbers == f"{count}":
        return count, f"{symbols} = {count:,}"
    return count, f"{symbols} = {numbers} = {count:,}"


def _linear(in_symbol: str, n_in: int, out_symbol: str, n_out: int, bias: bool) -> tuple[int, str]:
    """Weight (and bias) of an n_in -> n_out Linear layer."""
    terms = [(f"{in_symbol}·{out_symbol}", f"{n_in}·{n_out}", n_in * n_out)]
    if bias:
        terms.append((out_symbol, f"{n_out}", n_out))
    return _formula(terms)


def _norm(cfg: ModelConfig) -> tuple[int, str]:
    """A LayerNorm or BatchNorm (weight, and bias when cfg.bias) or an RMSNorm (weight)."""
    d = cfg.d_model
    if cfg.norm_type == "rmsnorm":
        return d, f"d_model (RMSNorm weight) = {d:,}"
    if cfg.norm_type == "batchnorm":
        # Its running mean and variance are buffers, not parameters: not counted.
        if cfg.bias:
            return (
                2 * d,
                f"2·d_model (BatchNorm weight + bias; running stats are buffers) = {2 * d:,}",
            )
        return d, f"d_model (BatchNorm weight, no bias; running stats are buffers) = {d:,}"
    if cfg.bias:
        return 2 * d, f"2·d_model (LayerNorm weight + bias) = 2·{d} = {2 * d:,}"
    return d, f"d_model (LayerNorm weight, no bias) = {d:,}"


def _qk_norms(cfg: ModelConfig) -> tuple[int, str]:
    """qk_norm's q_norm and k_norm: two norms of width head_dim, each shared by every head;
    an RMSNorm (weight) under norm_type rmsnorm, else a LayerNorm (weight, bias if cfg.bias)."""
    check_int("n_head", cfg.n_head)  # an unvalidated config must not divide by zero
    head_dim = cfg.d_model // cfg.n_head
    if cfg.norm_type == "rmsnorm":
        per_norm, what = 1, "RMSNorm weight"
    elif cfg.bias:
        per_norm, what = 2, "LayerNorm weight + bias"
    else:
        per_norm, what = 1, "LayerNorm weight, no bias"
    count = 2 * per_norm * head_dim
    width = "head_dim" if per_norm == 1 else f"{per_norm}·head_dim"
    return count, (
        f"2 norms × {width} (q_norm and k_norm: {what}; head_dim = d_model/n_head = "
        f"{head_dim}) = {count:,}"
    )


# The sizes a breakdown's work and numbers grow with; each is checked against bounds.BOUNDS
# first, so even an unvalidated config (the sidebar's, while another field is wrong) cannot
# make the count loop for minutes.
_SIZE_FIELDS = ("vocab_size", "n_layer", "d_model", "block_size", "ffn_mult")


def param_breakdown(cfg: ModelConfig) -> Breakdown:
    """Closed-form parameter counts of CharTransformer(cfg), per layer and component.

    Raises ConfigError when a size is outside bounds.BOUNDS (the rows grow with n_layer).
    """
    for name in _SIZE_FIELDS:
        check_int(name, getattr(cfg, name))
    d, d_ff = cfg.d_model, cfg.d_ff
    has_norm = cfg.norm_position != "none"
    rows: list[ParamRow] = []

    def add(layer: int, component: str, counted: tuple[int, str]) -> None:
        rows.append(ParamRow(layer, component, *counted))

    vocab, context = cfg.vocab_size, cfg.block_size
    add(-1, "token_embedding", _formula([("vocab_size·d_model", f"{vocab}·{d}", vocab * d)]))
    add(-1, "position_embedding", _formula([("block_size·d_model", f"{context}·{d}", context * d)]))
    for layer in range(cfg.n_layer):
        if cfg.attention:
            add(layer, "attn_qkv", _linear("d_model", d, "3·d_model", 3 * d, cfg.bias))
            if cfg.qk_norm:
                add(layer, "attn_qk_norm", _qk_norms(cfg))
            add(layer, "attn_out", _linear("d_model", d, "d_model", d, cfg.bias))
        if cfg.ffn:
            if cfg.activation == "swiglu":
                # gate and value projections fused into one d_model -> 2·d_ff Linear
                add(layer, "ffn_in", _linear("d_model", d, "2·d_ff", 2 * d_ff, cfg.bias))
            else:
                add(layer, "ffn_in", _linear("d_model", d, "d_ff", d_ff, cfg.bias))
            add(layer, "ffn_out", _linear("d_ff", d_ff, "d_model", d, cfg.bias))
        if has_norm and cfg.attention:
            add(layer, "norm1", _norm(cfg))
        if has_norm and cfg.ffn:
            add(layer, "norm2", _norm(cfg))
    if cfg.use_final_norm:
        add(cfg.n_layer, "final_norm", _norm(cfg))
    if cfg.tie_weights:
        add(cfg.n_layer, "lm_head", (0, "tied to token_embedding (counted there) = 0"))
    else:
        add(cfg.n_layer, "lm_head", _linear("d_model", d, "vocab_size", cfg.vocab_size, False))
    return Breakdown(rows)


def param_count(cfg: ModelConfig) -> int:
    """`param_breakdown(cfg).total` in constant time: one block's count times n_layer."""
    one_block = param_breakdown(dataclasses.replace(cfg, n_layer=1)).by_layer()
    return one_block[-1] + cfg.n_layer * one_block.get(0, 0) + one_block[1]


# ---------------------------------------------------------------- training memory

BYTES_PER_VALUE = 4  # float32; mixed precision keeps float32 weights and optimizer state
# Per parameter AdamW training holds the weight, its gradient and two moments.
TRAINING_COPIES = 4
# Autograd keeps most forward intermediates for the backward pass, which at its peak holds
# gradients of about the same size: the activations counted below, times this.
AUTOGRAD_FACTOR = 2
# Stream-sized (batch, block_size, d_model) tensors one block keeps: attention has its norm,
# q, k, v, the heads' output, the projection and the sum; the FFN its norm, output and sum.
_ATTN_STREAM_TENSORS = 7
_FFN_STREAM_TENSORS = 3


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one training process needs, by part; see `estimate_memory`."""

    n_params: int
    weights: int
    gradients: int
    optimizer: int  # AdamW's two moments
    activations: int  # one step's forward intermediates and backward peak

    @property
    def weights_and_optimizer(self) -> int:
        """Weights, gradients and optimizer state: what does not shrink with the batch."""
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        """Everything counted."""
        return self.weights_and_optimizer + self.activations


def estimate_memory(run_config: RunConfig) -> MemoryEstimate:
    """An estimate (not a measurement) of the memory one training process needs.

    It counts the parameters at 4 bytes each four times (weight, gradient and AdamW's two
    moments), and the activations of one step of batch_size x block_size characters: per
    block the residual-stream-sized tensors, the attention scores (batch·n_head·T·T) and
    the FFN hidden activations before and after the nonlinearity (batch·T·d_ff each; SwiGLU
    three), plus the embeddings and the logits with their softmax (batch·T·vocab_size each),
    all at 4 bytes times AUTOGRAD_FACTOR for what autograd keeps and the backward peak.
    Not counted: the framework itself, the data, CUDA's workspace and allocator slack. On
    a GPU, fused attention does not keep the scores, so there it errs on the safe side.
    With `devices` > 1 every process (device) needs this much on its own.
    """
    model, batch = run_config.model, run_config.train.batch_size
    n_params = param_count(model)
    tokens = batch * model.block_size  # B·T
    stream = tokens * model.d_model  # one (B, T, d_model) tensor
    per_block = stream  # the block's output
    if model.attention:
        per_block += _ATTN_STREAM_TENSORS * stream
        per_block += batch * model.n_head * model.block_size * model.block_size  # (B, H, T, T)
    if model.ffn:
        hidden_tensors = 3 if model.activation == "swiglu" else 2  # pre/post nonlinearity
        per_block += _FFN_STREAM_TENSORS * stream + hidden_tensors * tokens * model.d_ff
    embeddings_and_head = 2 * stream + 2 * tokens * model.vocab_size  # (B, T, d), (B, T, V)
    values = model.n_layer * per_block + embeddings_and_head
    per_param = BYTES_PER_VALUE * n_params
    return MemoryEstimate(
        n_params=n_params,
        weights=per_param,
        gradients=per_param,
        optimizer=(TRAINING_COPIES - 2) * per_param,
        activations=AUTOGRAD_FACTOR * BYTES_PER_VALUE * values,
    )


def estimate_memory_bytes(run_config: RunConfig) -> int:
    """`estimate_memory(run_config).total`: the bytes a training process needs, estimated."""
    return estimate_memory(run_config).total


_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n_bytes: int) -> str:
    """A byte count in binary units with one decimal: '512 B', '13.1 MiB', '37.2 GiB'."""
    n_bytes = int(n_bytes)
    if abs(n_bytes) < 1024:
        return f"{n_bytes} B"
    unit = min((abs(n_bytes).bit_length() - 1) // 10, len(_BYTE_UNITS) - 1)
    return f"{n_bytes / (1 << (10 * unit)):,.1f} {_BYTE_UNITS[unit]}"


def check_fits(run_config: RunConfig, available_bytes: int) -> MemoryEstimate:
    """The estimate, or ConfigError (field `model`) saying it exceeds `available_bytes`."""
    estimate = estimate_memory(run_config)
    if estimate.total <= available_bytes:
        return estimate
    if estimate.activations > estimate.weights_and_optimizer:
        shrink = "batch_size, block_size, n_layer or d_model"
    else:
        shrink = "n_layer, d_model, batch_size or block_size"
    needs = format_bytes(estimate.total)
    message = (
        f"the model needs about {needs} to train (weights+optimizer "
        f"{format_bytes(estimate.weights_and_optimizer)}, activations "
        f"{format_bytes(estimate.activations)}) but {format_bytes(available_bytes)} is "
        f"available; make it smaller ({shrink})"
    )
    allowed = f"must fit in the {format_bytes(available_bytes)} available"
    raise ConfigError("model", f"about {needs}", allowed, message=message)


def available_host_memory() -> int | None:
    """Bytes of RAM a new allocation can get (psutil: MemAvailable on Linux), or None."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):  # psutil could not read the system's figures
        return None


def format_table(b: Breakdown) -> str:
    """Aligned text: per component (count, share, formula), per layer, and the total."""
    total = b.total
    shares = b.shares()
    head_layer = max(row.layer for row in b.rows)
    lines = [f"{'component':<20} {'params':>14} {'share':>7}  formula (per layer)"]
    for component, count in b.by_component().items():
        rows = [row for row in b.rows if row.component == component]
        formula = rows[0].formula if len(rows) == 1 else f"{len(rows)} × [{rows[0].formula}]"
        lines.append(f"{component:<20} {count:>14,} {shares[component]:>6.2f}%  {formula}")
    lines += ["", f"{'layer':<28} {'params':>14} {'share':>7}"]
    for layer, count in b.by_layer().items():
        share = 100.0 * count / total
        lines.append(f"{layer_label(layer, head_layer):<28} {count:>14,} {share:>6.2f}%")
    lines += ["", f"{'total':<28} {total:>14,}"]
    return "\n".join(lines)


_PARAM_ROOTS = ("blocks", "tok_emb", "pos_emb", "final_norm", "lm_head")


def param_component(name: str, n_layer: int) -> tuple[int, str]:
    """(layer, component) of a parameter name: layer -1 = embeddings, n_layer = the head end.

    Components: attn, ffn, norm (norm1/norm2/final_norm), embed, head. A wrapper prefix such
    as `model.` or `_orig_mod.` in front of the name is ignored.
    """
    parts = name.split(".")
    start = next((i for i, part in enumerate(parts) if part in _PARAM_ROOTS), None)
    if start is not None:
        root, rest = parts[start], parts[start + 1 :]
        if root == "blocks" and len(rest) >= 2 and rest[0].isdigit():
            sub = rest[1]
            if sub in ("attn", "ffn"):
                return int(rest[0]), sub
            if sub in ("norm1", "norm2"):
                return int(rest[0]), "norm"
        elif root in ("tok_emb", "pos_emb"):
            return -1, "embed"
        elif root == "final_norm":
            return n_layer, "norm"
        elif root == "lm_head":
            return n_layer, "head"
    raise ValueError(f"parameter name {name!r} is not a CharTransformer parameter")
