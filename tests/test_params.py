"""Closed-form parameter breakdown: reference counts, toggles, table, JSON and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from blockviz import cli
from blockviz.config import ModelConfig
from blockviz.model import CharTransformer
from blockviz.params import COMPONENTS, Breakdown, format_table, param_breakdown

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


def gpt2_block(**overrides: object) -> ModelConfig:
    """One GPT-2-small-sized block (d_model 768, 12 heads, d_ff 3072)."""
    return ModelConfig(n_layer=1, d_model=768, n_head=12, ffn_mult=4, **overrides).validate()


def layer_sum(b: Breakdown, layer: int, components: tuple[str, ...]) -> int:
    """Parameters of the given components in one layer."""
    return sum(r.count for r in b.rows if r.layer == layer and r.component in components)


def built_count(cfg: ModelConfig) -> int:
    """Parameters of the instantiated model, on the meta device (no memory, no init)."""
    with torch.device("meta"):
        return CharTransformer(cfg).n_params()


@pytest.mark.parametrize(("bias", "expected"), [(True, 2_362_368), (False, 2_359_296)])
def test_attention_reference_count(bias, expected):
    breakdown = param_breakdown(gpt2_block(bias=bias))
    assert layer_sum(breakdown, 0, ("attn_qkv", "attn_out")) == expected


def test_ffn_and_layernorm_reference_counts():
    breakdown = param_breakdown(gpt2_block(activation="gelu"))
    assert layer_sum(breakdown, 0, ("ffn_in", "ffn_out")) == 4_722_432
    assert layer_sum(breakdown, 0, ("norm1", "norm2")) == 3_072
    small = param_breakdown(ModelConfig(d_model=64, n_head=4, ffn_mult=4))
    assert layer_sum(small, 0, ("ffn_in", "ffn_out")) == 33_088


@pytest.mark.parametrize(
    "overrides",
    [
        {"vocab_size": 1, "n_layer": 1, "n_head": 1, "d_model": 4, "ffn_mult": 1, "block_size": 1},
        {"vocab_size": 97, "n_layer": 3, "n_head": 6, "d_model": 48, "ffn_mult": 8},
        {"activation": "swiglu", "bias": False, "norm_type": "rmsnorm", "tie_weights": True},
        {"norm_position": "post", "final_norm": True, "ffn": False, "bias": False},
        {"norm_position": "none", "attention": False, "activation": "relu"},
        {"norm_position": "post", "norm_type": "rmsnorm", "residual": False},
    ],
)
def test_closed_form_matches_built_model_at_other_sizes(overrides):
    cfg = ModelConfig(**overrides).validate()
    assert param_breakdown(cfg).total == built_count(cfg)


def test_totals_agree_across_views():
    breakdown = param_breakdown(ModelConfig(n_layer=3))
    total = breakdown.total
    assert sum(breakdown.by_component().values()) == total
    assert sum(breakdown.by_layer().values()) == total
    assert sum(breakdown.shares().values()) == pytest.approx(100.0)
    assert list(breakdown.by_component()) == list(COMPONENTS)  # forward order
    assert list(breakdown.by_layer()) == [-1, 0, 1, 2, 3]


def test_every_formula_shows_its_count():
    cfg = ModelConfig(activation="swiglu", norm_type="rmsnorm")
    for row in param_breakdown(cfg).rows:
        assert row.formula.endswith(f"= {row.count:,}"), row
        assert "d_model" in row.formula, row
    qkv = next(r for r in param_breakdown(cfg).rows if r.component == "attn_qkv")
    assert "3·d_model" in qkv.formula


def test_swiglu_doubles_ffn_in_only():
    plain = param_breakdown(ModelConfig(activation="gelu")).by_component()
    gated = param_breakdown(ModelConfig(activation="swiglu")).by_component()
    d_model, n_layer = ModelConfig().d_model, ModelConfig().n_layer
    # the extra value projection: d_model x d_ff weights plus d_ff biases per layer
    assert gated["ffn_in"] - plain["ffn_in"] == n_layer * (d_model + 1) * ModelConfig().d_ff
    assert gated["ffn_out"] == plain["ffn_out"]


def test_tied_head_counts_zero_and_says_so():
    untied = param_breakdown(ModelConfig())
    tied = param_breakdown(ModelConfig(tie_weights=True))
    head = next(r for r in tied.rows if r.component == "lm_head")
    assert head.count == 0 and "tied" in head.formula
    cfg = ModelConfig()
    assert untied.total - tied.total == cfg.vocab_size * cfg.d_model


@pytest.mark.parametrize(
    ("overrides", "absent"),
    [
        ({"attention": False}, {"attn_qkv", "attn_out", "norm1"}),
        ({"ffn": False}, {"ffn_in", "ffn_out", "norm2"}),
        ({"norm_position": "none", "final_norm": True}, {"norm1", "norm2", "final_norm"}),
        ({"norm_position": "post"}, {"final_norm"}),  # auto: off for post
        ({"norm_position": "pre", "final_norm": False}, {"final_norm"}),
        ({}, set()),
    ],
)
def test_absent_parts_have_no_rows(overrides, absent):
    present = set(param_breakdown(ModelConfig(**overrides)).by_component())
    assert present == set(COMPONENTS) - absent


@pytest.mark.parametrize(
    ("norm_type", "bias", "per_norm"),
    [("layernorm", True, 2), ("layernorm", False, 1), ("rmsnorm", True, 1), ("rmsnorm", False, 1)],
)
def test_norm_counts_follow_type_and_bias(norm_type, bias, per_norm):
    cfg = ModelConfig(norm_type=norm_type, bias=bias)
    by_component = param_breakdown(cfg).by_component()
    assert by_component["norm1"] == cfg.n_layer * per_norm * cfg.d_model
    assert by_component["final_norm"] == per_norm * cfg.d_model


def test_format_table_lists_components_layers_and_total():
    breakdown = param_breakdown(ModelConfig(n_layer=2))
    table = format_table(breakdown)
    for component in COMPONENTS:
        assert component in table
    assert "block 0" in table and "block 1" in table and "embeddings" in table
    assert f"{breakdown.total:,}" in table.splitlines()[-1]
    shares = breakdown.shares()
    assert f"{shares['ffn_in']:.2f}%" in table


def test_to_dict_is_json_with_total_components_and_layers():
    breakdown = param_breakdown(ModelConfig(n_layer=2, tie_weights=True))
    data = json.loads(json.dumps(breakdown.to_dict()))
    assert data["total"] == breakdown.total
    assert data["components"] == breakdown.by_component()
    assert data["layers"] == {str(k): v for k, v in breakdown.by_layer().items()}
    assert len(data["rows"]) == len(breakdown.rows)
    assert set(data["rows"][0]) == {"layer", "component", "count", "formula"}


def test_params_module_does_not_import_torch():
    code = "import sys, blockviz.params; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True)
    assert result.returncode == 0, result.stderr.decode()


def test_cli_json_total_equals_the_built_model():
    argv = ["params", "--n_layer", "12", "--d_model", "768", "--n_head", "12", "--json"]
    result = subprocess.run(
        [sys.executable, "-m", "blockviz", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    cfg = ModelConfig(n_layer=12, d_model=768, n_head=12)  # vocab_size 65 by default
    assert data["total"] == built_count(cfg)
    assert set(data["components"]) >= {"token_embedding", "attn_qkv", "ffn_in", "lm_head"}
    assert set(data["layers"]) == {str(layer) for layer in range(-1, 13)}


def test_cli_table_and_preset_with_override(capsys):
    assert cli.main(["params", "--preset", "rmsnorm", "--n_layer", "2"]) == 0
    table = capsys.readouterr().out
    cfg = ModelConfig(n_layer=2, norm_type="rmsnorm", bias=False, activation="swiglu")
    assert f"{param_breakdown(cfg).total:,}" in table.splitlines()[-1]
    assert "RMSNorm" in table and "block 1" in table and "block 2" not in table


def test_cli_unknown_preset_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["params", "--preset", "nope"])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
