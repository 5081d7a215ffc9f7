"""The block and model diagrams: the DOT text shows exactly the wiring the config builds."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil
import subprocess

import pytest

from blockviz.core.config_model import ModelConfig
from blockviz.views.charts.colours import readable
from blockviz.views.diagram import block_dot, model_dot

NODE = re.compile(r"^\s+(\w+) \[", re.MULTILINE)
EDGE = re.compile(r"^\s+(\w+) -> (\w+)(?: \[(.*)\])?;$", re.MULTILINE)
LABEL = re.compile(r'label="([^"]*)"')

GRID = [
    ModelConfig(
        n_layer=2,
        n_head=2,
        d_model=16,
        norm_position=position,
        residual=residual,
        attention=attention,
        ffn=ffn,
        activation=activation,
        qk_norm=qk_norm,
    )
    for position, residual, (attention, ffn), activation, qk_norm in itertools.product(
        ("pre", "post", "none"),
        (True, False),
        ((True, True), (True, False), (False, True)),
        ("gelu", "swiglu"),
        (False, True),
    )
]


def _ids(cfg: ModelConfig) -> str:
    parts = [cfg.norm_position, "res" if cfg.residual else "nores", cfg.activation]
    parts.append("both" if cfg.attention and cfg.ffn else ("attn" if cfg.attention else "ffn"))
    parts.append("qknorm" if cfg.qk_norm else "noqk")
    return "-".join(parts)


def parse(dot: str) -> tuple[set[str], list[tuple[str, str, str]]]:
    """Declared node ids and (tail, head, attribute text) edges of a DOT string."""
    edges = [(tail, head, attrs or "") for tail, head, attrs in EDGE.findall(dot)]
    # `node [...]` and `edge [...]` set defaults; they declare nothing.
    return set(NODE.findall(dot)) - {"node", "edge"}, edges


def edge_taps(edges: list[tuple[str, str, str]]) -> set[str]:
    """Tap names written on edges (labels are 'a · b'); gate/value are not taps."""
    taps: set[str] = set()
    for _, _, attrs in edges:
        for label in LABEL.findall(attrs):
            taps.update(part.strip() for part in label.split("·"))
    return taps - {"gate", "value"}


@pytest.mark.parametrize("cfg", GRID, ids=_ids)
def test_block_dot_is_well_formed_and_wired(cfg: ModelConfig) -> None:
    dot = block_dot(cfg)
    assert dot.startswith("digraph ") and dot.count("{") == dot.count("}")
    assert dot.count('"') % 2 == 0
    nodes, edges = parse(dot)
    assert edges, "no edges parsed"
    for tail, head, _ in edges:
        assert tail in nodes and head in nodes, f"edge {tail} -> {head} has an undeclared end"
    # Every node is connected, and the stream runs from input to output.
    touched = {end for tail, head, _ in edges for end in (tail, head)}
    assert touched == nodes
    assert {"stream_in", "stream_out"} <= nodes

    norms = {n for n in nodes if n.startswith("norm")}
    adds = {n for n in nodes if n.startswith("add")}
    skips = [e for e in edges if "dashed" in e[2]]
    sublayers = int(cfg.attention) + int(cfg.ffn)
    assert ("attn" in nodes) == cfg.attention
    assert any(n.startswith("ffn") for n in nodes) == cfg.ffn
    assert len(norms) == (0 if cfg.norm_position == "none" else sublayers)
    assert len(adds) == len(skips) == (sublayers if cfg.residual else 0)
    assert ("ffn_gate" in nodes) == (cfg.ffn and cfg.activation == "swiglu")

    pairs = {(tail, head) for tail, head, _ in edges}
    if cfg.attention and cfg.norm_position == "pre":
        assert ("norm1", "attn") in pairs  # the norm feeds the sublayer
    if cfg.attention and cfg.norm_position == "post":
        # The norm comes after the add (residual on) or straight after the branch (off).
        assert ("add1" if cfg.residual else "attn", "norm1") in pairs
        assert ("stream_in", "norm1") not in pairs


@pytest.mark.parametrize("cfg", GRID[::5], ids=_ids)
def test_block_dot_taps_match_the_model(cfg: ModelConfig) -> None:
    model = pytest.importorskip("blockviz.training.model")
    _, edges = parse(block_dot(cfg))
    assert edge_taps(edges) == set(model.block_tap_names(cfg))


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_residual_scale_appears_only_when_it_changes_something(scale: float) -> None:
    nodes, _ = parse(block_dot(ModelConfig(residual_scale=scale)))
    assert ({"scale1", "scale2"} <= nodes) == (scale != 1.0)


def test_ffn_label_shows_widths_and_activation() -> None:
    dot = block_dot(ModelConfig(d_model=64, ffn_mult=3, activation="relu"))
    assert "Linear 64 → 192" in dot and "Linear 192 → 64" in dot and "RELU" in dot


@pytest.mark.parametrize(
    ("changes", "final_norm"),
    [({"norm_position": "pre"}, True), ({"norm_position": "post"}, False), ({}, True)],
)
def test_model_dot_strip(changes: dict, final_norm: bool) -> None:
    cfg = dataclasses.replace(ModelConfig(n_layer=6, tie_weights=True), **changes)
    dot = model_dot(cfg)
    nodes, edges = parse(dot)
    assert ("final_norm" in nodes) == final_norm
    assert "6 × block" in dot and "tied" in dot
    for tail, head, _ in edges:
        assert tail in nodes and head in nodes


@pytest.mark.parametrize(
    ("norm_type", "kind"),
    [("layernorm", "LayerNorm"), ("rmsnorm", "RMSNorm"), ("batchnorm", "LayerNorm")],
)
@pytest.mark.parametrize("position", ["pre", "none"])
def test_qk_norm_is_drawn_inside_attention_with_its_kind(norm_type, kind, position) -> None:
    cfg = ModelConfig(d_model=64, n_head=4, norm_type=norm_type, norm_position=position)
    plain = block_dot(cfg)
    with_qk = block_dot(dataclasses.replace(cfg, qk_norm=True))
    assert "q, k:" not in plain
    (attn_label,) = [label for label in LABEL.findall(with_qk) if "self-attention" in label]
    assert f"q, k: {kind}(16), shared by the heads" in attn_label
    # the same boxes and edges otherwise: no stream norm is added or moved
    assert parse(with_qk)[1] == parse(plain)[1] and len(parse(with_qk)[0]) == len(parse(plain)[0])
    assert "attention with qk-norm" in model_dot(dataclasses.replace(cfg, qk_norm=True))
    assert "qk-norm" not in model_dot(cfg)


@pytest.mark.parametrize("cap", [0.0, 30.0, 2.5])
def test_model_dot_puts_the_logit_softcap_between_head_and_logits(cap: float) -> None:
    nodes, edges = parse(model_dot(ModelConfig(logit_softcap=cap)))
    pairs = [(tail, head) for tail, head, _ in edges]
    if cap:
        assert ("lm_head", "softcap") in pairs and ("softcap", "logits") in pairs
        assert f"{cap:g}·tanh(logit / {cap:g})" in model_dot(ModelConfig(logit_softcap=cap))
    else:
        assert "softcap" not in nodes and ("lm_head", "logits") in pairs


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
@pytest.mark.parametrize("cfg", GRID[::4], ids=_ids)
def test_graphviz_accepts_the_dot(cfg: ModelConfig) -> None:
    capped = dataclasses.replace(cfg, logit_softcap=30.0)
    for text in (block_dot(cfg), model_dot(cfg), model_dot(capped)):
        result = subprocess.run(
            ["dot", "-Tsvg"], input=text, capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 0, result.stderr
        assert "<svg" in result.stdout


@pytest.mark.parametrize("dot", [block_dot(ModelConfig()), model_dot(ModelConfig())])
def test_lines_and_edge_labels_read_on_a_light_and_a_dark_page(dot: str) -> None:
    """The graph is transparent: its lines and edge labels lie on the page, light or dark
    (node labels lie on the nodes' own pale fills)."""
    drawn = re.findall(r'\b(?:color|fontcolor)="([^"]+)"', dot)  # not fillcolor, bgcolor
    assert drawn and [c for c in drawn if not readable(c)] == []
    # An edge label without a colour of its own would be Graphviz's black.
    labelled_edges = [line for line in dot.splitlines() if "->" in line and "label=" in line]
    assert all("fontcolor=" in line for line in labelled_edges)
