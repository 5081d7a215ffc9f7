"""Parameter breakdown of a ModelConfig in closed form, without building (or importing) torch.

The UI recomputes this on every sidebar change, so it must stay pure arithmetic. The counts
mirror blockviz.model exactly (a test checks them against `sum(p.numel())` over a grid of
configs). Layer numbers follow the model's convention: -1 for the embeddings, 0..n_layer-1
for the blocks, n_layer for the final norm and the LM head.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from blockviz.config import ModelConfig

COMPONENTS = (
    "token_embedding",
    "position_embedding",
    "attn_qkv",
    "attn_out",
    "ffn_in",
    "ffn_out",
    "norm1",
    "norm2",
    "final_norm",
    "lm_head",
)


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
        for component in COMPONENTS:
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
    """A LayerNorm (weight, and bias when cfg.bias) or an RMSNorm (weight only)."""
    d = cfg.d_model
    if cfg.norm_type == "rmsnorm":
        return d, f"d_model (RMSNorm weight) = {d:,}"
    if cfg.bias:
        return 2 * d, f"2·d_model (LayerNorm weight + bias) = 2·{d} = {2 * d:,}"
    return d, f"d_model (LayerNorm weight, no bias) = {d:,}"


def param_breakdown(cfg: ModelConfig) -> Breakdown:
    """Closed-form parameter counts of CharTransformer(cfg), per layer and component."""
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


def _layer_label(layer: int, n_layer: int) -> str:
    if layer < 0:
        return "embeddings"
    if layer >= n_layer:
        return "head (final norm + lm_head)"
    return f"block {layer}"


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
        lines.append(f"{_layer_label(layer, head_layer):<28} {count:>14,} {share:>6.2f}%")
    lines += ["", f"{'total':<28} {total:>14,}"]
    return "\n".join(lines)


def cli_main(args: argparse.Namespace) -> int:
    """`python -m blockviz params`: print the breakdown of a model config (table or JSON)."""
    from blockviz import cli, config

    base = config.preset(args.preset).model if args.preset else ModelConfig()
    overrides = cli.config_overrides(args, ["model"])
    model_cfg = dataclasses.replace(base, **overrides).validate()
    breakdown = param_breakdown(model_cfg)
    if args.json:
        print(json.dumps(breakdown.to_dict(), indent=2))
    else:
        print(format_table(breakdown))
    return 0
