"""Graphviz DOT text for the wiring of one block and the whole model, from a ModelConfig.

Pure string building (no torch, no graphviz install): the Train page hands the text to
`st.graphviz_chart`, which renders it in the browser. The wiring follows blockviz.training.model
exactly, for residual scale s and a sublayer f (attention or FFN):

    pre   x + s*f(norm(x))      post   norm(x + s*f(x))      none   x + s*f(x)

With the residual off the skip edge and the add go; the norm stays where it sits. Tap names
(the probe points of blockviz.training.model) label the edges they sit on, small and grey.
qk_norm is a line of the attention box (its norms sit inside attention, on q and k only);
a logit soft-cap is a node between the LM head and the logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blockviz.core.config_model import ModelConfig
from blockviz.views.charts.colours import NEUTRAL

FONT = "Helvetica"
COLOURS = {
    "stream": "#eeeeee",
    "norm": "#fff3c4",
    "attn": "#d6e6ff",
    "ffn": "#d9f2d9",
    "op": "#ffffff",
    "embed": "#f3e0f7",
    "head": "#ffe0cc",
}
# Lines and the taps' labels lie on the page itself (the graph is transparent): a grey
# that reads on a light and a dark page (charts.colours.NEUTRAL); #555555 was 2.4:1 on dark.
TAP_COLOUR = LINE_COLOUR = NEUTRAL
NORM_KINDS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "batchnorm": "BatchNorm"}


def _quote(text: str) -> str:
    """A DOT double-quoted string; newlines become DOT's centred line breaks."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n") + '"'


@dataclass
class _Graph:
    """Collects nodes and edges in insertion order and prints them as one digraph."""

    name: str
    rankdir: str
    nodes: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    edges: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def node(self, node_id: str, label: str, kind: str, shape: str = "box") -> str:
        attrs = {"label": label, "shape": shape, "fillcolor": COLOURS[kind]}
        if shape == "box":
            attrs["style"] = "rounded,filled"
        else:
            attrs["style"] = "filled"
        self.nodes.append((node_id, attrs))
        return node_id

    def edge(self, tail: str, head: str, taps: list[str] | None = None, **attrs: str) -> None:
        if taps:
            attrs = {"label": " · ".join(taps), "fontcolor": TAP_COLOUR, "fontsize": "9", **attrs}
        self.edges.append((tail, head, attrs))

    def to_dot(self) -> str:
        lines = [
            f"digraph {self.name} {{",
            f"  rankdir={self.rankdir};",
            '  bgcolor="transparent";',
            # Compact: the page shows the block beside the parameter summary.
            '  nodesep="0.25"; ranksep="0.22";',
            f'  node [fontname="{FONT}", fontsize="10", color="{LINE_COLOUR}", height="0.3", '
            'margin="0.12,0.03"];',
            f'  edge [fontname="{FONT}", fontsize="9", color="{LINE_COLOUR}", arrowsize="0.6"];',
        ]
        for node_id, attrs in self.nodes:
            lines.append(f"  {node_id} [{_attrs(attrs)}];")
        for tail, head, attrs in self.edges:
            suffix = f" [{_attrs(attrs)}]" if attrs else ""
            lines.append(f"  {tail} -> {head}{suffix};")
        lines.append("}")
        return "\n".join(lines) + "\n"


def _attrs(attrs: dict[str, str]) -> str:
    return ", ".join(f"{key}={_quote(value)}" for key, value in attrs.items())


def _norm_label(cfg: ModelConfig, index: int) -> str:
    kind = NORM_KINDS.get(cfg.norm_type, "LayerNorm")
    return f"norm{index}\n{kind}"


def _attention_label(cfg: ModelConfig) -> str:
    """The attention box: heads and their width, and qk_norm's norms when on."""
    head_dim = cfg.d_model // max(cfg.n_head, 1)
    label = f"causal self-attention\n{cfg.n_head} heads × {head_dim}"
    if cfg.qk_norm:
        # A LayerNorm under batchnorm too, as the model builds it.
        kind = "RMSNorm" if cfg.norm_type == "rmsnorm" else "LayerNorm"
        label += f"\nq, k: {kind}({head_dim}), shared by the heads"
    return label


def _add_ffn(graph: _Graph, cfg: ModelConfig) -> tuple[str, str]:
    """The FFN's nodes; returns (entry, exit). Its hidden width and activation are labelled."""
    d, d_ff = cfg.d_model, cfg.d_ff
    if cfg.activation == "swiglu":
        entry = graph.node("ffn_in", f"Linear {d} → 2×{d_ff}\n(gate | value)", "ffn")
        gate = graph.node("ffn_gate", "SiLU(gate)", "ffn")
        product = graph.node("ffn_mul", "⊗", "op", shape="circle")
        graph.edge(entry, gate, ["gate"])
        graph.edge(gate, product)
        graph.edge(entry, product, ["value"])
        hidden = product
    else:
        entry = graph.node("ffn_in", f"Linear {d} → {d_ff}", "ffn")
        hidden = graph.node("ffn_act", cfg.activation.upper(), "ffn")
        graph.edge(entry, hidden)
    exit_node = graph.node("ffn_down", f"Linear {d_ff} → {d}", "ffn")
    graph.edge(hidden, exit_node, ["ffn_hidden"])
    return entry, exit_node


def block_dot(model_cfg: ModelConfig) -> str:
    """DOT for one block of `model_cfg`: norms, sublayers, scales, skip adds and taps."""
    cfg = model_cfg
    graph = _Graph("block", "TB")
    stream = graph.node(
        "stream_in", f"residual stream in\n(B, T, {cfg.d_model})", "stream", shape="box"
    )
    # Taps that sit on the next edge leaving `stream`; several can share one point.
    pending = ["resid_pre"]
    sublayers = []
    if cfg.attention:
        sublayers.append(("attn", 1))
    if cfg.ffn:
        sublayers.append(("ffn", 2))
    for position, (sublayer, index) in enumerate(sublayers):
        norm_tap = f"norm{index}_out"
        branch_in, branch_taps = stream, pending
        if cfg.norm_position == "pre":
            norm = graph.node(f"norm{index}", _norm_label(cfg, index), "norm")
            graph.edge(stream, norm, pending)
            branch_in, branch_taps = norm, [norm_tap]
        if sublayer == "attn":
            entry = exit_node = graph.node("attn", _attention_label(cfg), "attn")
        else:
            entry, exit_node = _add_ffn(graph, cfg)
        graph.edge(branch_in, entry, branch_taps)
        out_taps = [f"{sublayer}_out"]
        if cfg.residual_scale != 1.0:
            scale = graph.node(f"scale{index}", f"× {cfg.residual_scale:g}", "op", shape="box")
            graph.edge(exit_node, scale, out_taps)
            exit_node, out_taps = scale, []
        if cfg.residual:
            add = graph.node(f"add{index}", "+", "op", shape="circle")
            graph.edge(exit_node, add, out_taps)
            # The skip path: the taps at `stream` already label the branch's first edge.
            graph.edge(stream, add, style="dashed")
            exit_node, out_taps = add, []
        if cfg.norm_position == "post":
            norm = graph.node(f"norm{index}", _norm_label(cfg, index), "norm")
            graph.edge(exit_node, norm, out_taps)
            exit_node, out_taps = norm, [norm_tap]
        stream = exit_node
        is_last = position == len(sublayers) - 1
        pending = [*out_taps, "resid_post" if is_last else "resid_mid"]
    out = graph.node("stream_out", f"residual stream out\n(B, T, {cfg.d_model})", "stream")
    graph.edge(stream, out, pending)
    return graph.to_dot()


def model_dot(model_cfg: ModelConfig, rankdir: str = "LR") -> str:
    """DOT for the whole model as one strip: embeddings → n_layer × block → final norm → head.

    `rankdir="TB"` stacks the strip top to bottom: narrow enough to show at its own size.
    """
    cfg = model_cfg
    graph = _Graph("model", rankdir)
    tokens = graph.node("tokens", f"characters\n(B, T ≤ {cfg.block_size})", "stream")
    embed = graph.node(
        "embed",
        f"token embedding {cfg.vocab_size}×{cfg.d_model}\n+ position embedding "
        f"{cfg.block_size}×{cfg.d_model}",
        "embed",
    )
    parts = []
    if cfg.attention:
        parts.append("attention with qk-norm" if cfg.qk_norm else "attention")
    if cfg.ffn:
        parts.append(f"FFN {cfg.activation}")
    norm = "no norm" if cfg.norm_position == "none" else f"{cfg.norm_position}-norm"
    skip = "residual" if cfg.residual else "no residual"
    blocks = graph.node(
        "blocks", f"{cfg.n_layer} × block\n{' + '.join(parts)}\n{norm}, {skip}", "attn"
    )
    graph.edge(tokens, embed)
    graph.edge(embed, blocks)
    last = blocks
    if cfg.use_final_norm:
        kind = NORM_KINDS.get(cfg.norm_type, "LayerNorm")
        last_norm = graph.node("final_norm", f"final {kind}", "norm")
        graph.edge(last, last_norm)
        last = last_norm
    tied = " (tied to token embedding)" if cfg.tie_weights else ""
    head = graph.node("lm_head", f"LM head {cfg.d_model} → {cfg.vocab_size}{tied}", "head")
    logits = graph.node("logits", "next-character logits", "stream")
    graph.edge(last, head)
    if cfg.logit_softcap > 0:
        cap = f"{cfg.logit_softcap:g}"
        softcap = graph.node("softcap", f"soft-cap\n{cap}·tanh(logit / {cap})", "op")
        graph.edge(head, softcap)
        head = softcap
    graph.edge(head, logits)
    return graph.to_dot()
