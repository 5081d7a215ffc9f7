"""Closed-form parameter breakdown: reference counts, toggles, table, JSON and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from blockviz import cli
from blockviz.core.config import BOUNDS, RunConfig, replace
from blockviz.core.config_model import ModelConfig
from blockviz.core.fields import ConfigError
from blockviz.core.params import (
    PARAM_GROUP_NAMES,
    Breakdown,
    check_fits,
    estimate_memory,
    estimate_memory_bytes,
    format_bytes,
    format_table,
    param_breakdown,
    param_count,
)
from blockviz.training.model import CharTransformer

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[2]


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
        # qk_norm: a LayerNorm of head_dim (bias per `bias`) on q and on k, RMSNorm under
        # rmsnorm, LayerNorm under batchnorm, with or without the stream's norms
        {"qk_norm": True},
        {"qk_norm": True, "bias": False, "n_head": 8},
        {"qk_norm": True, "norm_type": "rmsnorm", "n_head": 2},
        {"qk_norm": True, "norm_type": "rmsnorm", "bias": False, "norm_position": "none"},
        {"qk_norm": True, "norm_type": "batchnorm", "n_head": 1, "d_model": 24},
        {"qk_norm": True, "norm_type": "batchnorm", "bias": False, "norm_position": "post"},
        {"qk_norm": True, "norm_position": "none", "n_layer": 3, "n_head": 16},
        {"qk_norm": True, "attention": False},  # nothing to normalise: no rows, no tensors
    ],
)
def test_closed_form_matches_built_model_at_other_sizes(overrides):
    cfg = ModelConfig(**overrides).validate()
    assert param_breakdown(cfg).total == built_count(cfg)


def test_totals_agree_across_views():
    breakdown = param_breakdown(ModelConfig(n_layer=3, qk_norm=True))
    total = breakdown.total
    assert sum(breakdown.by_component().values()) == total
    assert sum(breakdown.by_layer().values()) == total
    assert sum(breakdown.shares().values()) == pytest.approx(100.0)
    assert list(breakdown.by_component()) == list(PARAM_GROUP_NAMES)  # forward order
    assert list(breakdown.by_layer()) == [-1, 0, 1, 2, 3]


def test_every_formula_shows_its_count():
    cfg = ModelConfig(activation="swiglu", norm_type="rmsnorm", qk_norm=True)
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
        ({"attention": False}, {"attn_qkv", "attn_qk_norm", "attn_out", "norm1"}),
        ({"ffn": False}, {"ffn_in", "ffn_out", "norm2"}),
        ({"norm_position": "none", "final_norm": True}, {"norm1", "norm2", "final_norm"}),
        ({"norm_position": "post"}, {"final_norm"}),  # auto: off for post
        ({"norm_position": "pre", "final_norm": False}, {"final_norm"}),
        ({"qk_norm": False}, {"attn_qk_norm"}),
        ({}, set()),
    ],
)
def test_absent_parts_have_no_rows(overrides, absent):
    # From a model with every part (qk_norm on), each override takes away what it says.
    present = set(param_breakdown(ModelConfig(**{"qk_norm": True, **overrides})).by_component())
    assert present == set(PARAM_GROUP_NAMES) - absent


@pytest.mark.parametrize(
    ("norm_type", "bias", "per_norm"),
    [
        *[("layernorm", True, 2), ("layernorm", False, 1), ("rmsnorm", True, 1)],
        *[("rmsnorm", False, 1), ("batchnorm", True, 2), ("batchnorm", False, 1)],
    ],
)
def test_norm_counts_follow_type_and_bias(norm_type, bias, per_norm):
    cfg = ModelConfig(norm_type=norm_type, bias=bias, qk_norm=True)
    by_component = param_breakdown(cfg).by_component()
    assert by_component["norm1"] == cfg.n_layer * per_norm * cfg.d_model
    assert by_component["final_norm"] == per_norm * cfg.d_model
    # q_norm and k_norm: the same rule at width head_dim (a LayerNorm under batchnorm)
    assert by_component["attn_qk_norm"] == cfg.n_layer * 2 * per_norm * cfg.head_dim


def test_format_table_lists_components_layers_and_total():
    breakdown = param_breakdown(ModelConfig(n_layer=2, qk_norm=True))
    table = format_table(breakdown)
    for component in PARAM_GROUP_NAMES:
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


# ---------------------------------------------------------------- bounds and memory (issue 10)


@pytest.mark.timeout(20)
def test_counting_refuses_an_unbounded_depth_at_once():
    # Unvalidated, as the sidebar's config can be: the count must not loop 10**9 times.
    with pytest.raises(ConfigError, match=r"^n_layer: 1000000000 is not allowed"):
        param_breakdown(ModelConfig(n_layer=10**9))


def test_counting_qk_norms_refuses_zero_heads_by_name():
    # head_dim = d_model / n_head: an unvalidated n_head of 0 is a message, not a crash.
    with pytest.raises(ConfigError, match=r"^n_head: 0 is not allowed"):
        param_breakdown(ModelConfig(qk_norm=True, n_head=0))
    assert param_breakdown(ModelConfig(qk_norm=False, n_head=0)).total > 0  # as before


@pytest.mark.timeout(20)
def test_cli_refuses_a_huge_depth_before_counting(capsys):
    assert cli.main(["params", "--n_layer", "1" + "0" * 20]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err]
    assert err.startswith("blockviz params: error: --n_layer: 100000000000000000000 is not allowed")
    assert f"[1, {BOUNDS['n_layer'].high}]" in err


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"n_layer": 7, "activation": "swiglu", "tie_weights": True},
        {"attention": False, "norm_position": "none"},
        {"ffn": False, "norm_position": "post", "bias": False},
        {"qk_norm": True, "n_layer": 5, "norm_type": "rmsnorm"},
    ],
)
def test_param_count_equals_the_breakdown_total(overrides):
    model = ModelConfig(**overrides).validate()
    assert param_count(model) == param_breakdown(model).total


def test_memory_estimate_counts_weights_gradients_and_two_moments():
    run = RunConfig()
    estimate = estimate_memory(run)
    n_params = param_breakdown(run.model).total
    assert estimate.n_params == n_params
    assert estimate.weights == estimate.gradients == 4 * n_params
    assert estimate.optimizer == 8 * n_params
    assert estimate.weights_and_optimizer == 16 * n_params
    assert estimate.total == estimate.weights_and_optimizer + estimate.activations
    assert estimate_memory_bytes(run) == estimate.total


def test_activations_scale_with_the_batch_and_weights_do_not():
    small = estimate_memory(RunConfig())
    double = estimate_memory(replace(RunConfig(), batch_size=2 * RunConfig().train.batch_size))
    assert double.activations == 2 * small.activations
    assert double.weights_and_optimizer == small.weights_and_optimizer
    longer = estimate_memory(replace(RunConfig(), block_size=2 * RunConfig().model.block_size))
    # Attention scores grow with T²: doubling the context more than doubles activations.
    assert longer.activations > 2 * small.activations


def test_memory_estimate_is_within_reach_of_a_real_training_step():
    # AdamW's state is exactly as counted; what autograd saves is within a factor of 4.
    run = replace(RunConfig(), vocab_size=65)
    estimate = estimate_memory(run)
    model = CharTransformer(run.model)
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randint(65, (run.train.batch_size, run.model.block_size))  # (B, T)
    saved = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        _, loss = model(x, x)
    loss.backward()
    optimizer.step()
    moments = sum(
        value.numel() * value.element_size()
        for state in optimizer.state.values()
        for name, value in state.items()
        if name != "step"
    )
    assert estimate.optimizer == moments
    assert saved / 4 < estimate.activations < saved * 4


def test_format_bytes_uses_binary_units():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(int(37.2 * 2**30)) == "37.2 GiB"
    assert format_bytes(3 * 2**50) == "3.0 PiB"


def test_check_fits_refuses_an_absurd_model_with_its_estimate():
    absurd = replace(
        RunConfig(), n_layer=256, d_model=16_384, n_head=128, block_size=8192, batch_size=512
    ).validate()
    available = 8 * 2**30
    with pytest.raises(ConfigError) as info:
        check_fits(absurd, available)
    estimate = estimate_memory(absurd)
    message = str(info.value)
    assert info.value.field == "model"
    assert message.startswith(f"the model needs about {format_bytes(estimate.total)} to train")
    assert f"weights+optimizer {format_bytes(estimate.weights_and_optimizer)}" in message
    assert f"activations {format_bytes(estimate.activations)}" in message
    assert f"but {format_bytes(available)} is available" in message
    assert "n_layer" in message and "batch_size" in message and "\n" not in message


def test_check_fits_passes_a_small_model_and_returns_its_estimate():
    run = RunConfig()
    assert check_fits(run, 2**40) == estimate_memory(run)
    with pytest.raises(ConfigError):
        check_fits(run, estimate_memory(run).total - 1)


def test_available_host_memory_is_what_psutil_reports() -> None:
    import psutil

    from blockviz.core.params import available_host_memory

    available = available_host_memory()
    assert available is not None and 0 < available <= psutil.virtual_memory().total
