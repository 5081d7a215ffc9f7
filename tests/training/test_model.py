"""CharTransformer: every toggle combination, wiring, taps, attention capture, init, sampling."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from blockviz.core.config_model import ACTIVATIONS, INITS, NORM_POSITIONS, NORM_TYPES, ModelConfig
from blockviz.core.params import param_breakdown, param_component
from blockviz.core.spec import TAPS
from blockviz.training import model as model_module
from blockviz.training.model import (
    BatchNorm,
    Block,
    CharTransformer,
    LayerNorm,
    ModelInputError,
    RMSNorm,
    block_tap_names,
    capture_attention,
)

torch.set_num_threads(1)

TINY = {"vocab_size": 11, "n_layer": 2, "n_head": 2, "d_model": 8, "block_size": 8, "ffn_mult": 2}
BATCH, SEQ = 2, 8
SUBLAYERS = ((True, True), (True, False), (False, True))  # (attention, ffn); both off is invalid


def tiny(**overrides: object) -> ModelConfig:
    """A tiny validated config with the given fields overridden."""
    return ModelConfig(**{**TINY, **overrides}).validate()


def toggle_grid() -> list[ModelConfig]:
    """Full product of the wiring toggles and activations; the rest rotate through their values.

    norm_position x norm_type x residual x sublayers x activation is 144 configs; final_norm,
    tie_weights, init, bias, qk_norm and logit_softcap change the parameter set or the head but
    not the wiring, so cycling them with co-prime strides covers every value of each (and most
    pairs) without multiplying the grid.
    """
    configs = []
    wiring = itertools.product(NORM_POSITIONS, NORM_TYPES, (True, False), SUBLAYERS, ACTIVATIONS)
    for i, (position, norm_type, residual, (attention, ffn), activation) in enumerate(wiring):
        configs.append(
            tiny(
                norm_position=position,
                norm_type=norm_type,
                residual=residual,
                attention=attention,
                ffn=ffn,
                activation=activation,
                final_norm=(None, True, False)[i % 3],
                tie_weights=bool(i % 2),
                init=INITS[(i // 5) % len(INITS)],
                bias=bool((i // 7) % 2),
                residual_scale=(1.0, 0.5)[(i // 11) % 2],
                qk_norm=bool((i // 13) % 2),
                logit_softcap=(0.0, 30.0)[(i // 17) % 2],
            )
        )
    return configs


GRID = toggle_grid()


def config_id(cfg: ModelConfig) -> str:
    """Short readable test id for a config."""
    sub = {(True, True): "attn+ffn", (True, False): "attn", (False, True): "ffn"}
    return "-".join(
        [
            cfg.norm_position,
            cfg.norm_type,
            "res" if cfg.residual else "nores",
            sub[(cfg.attention, cfg.ffn)],
            cfg.activation,
            f"fn{cfg.final_norm}",
            "tied" if cfg.tie_weights else "untied",
            cfg.init,
            "bias" if cfg.bias else "nobias",
            "qknorm" if cfg.qk_norm else "noqk",
            f"cap{cfg.logit_softcap:g}",
        ]
    )


def random_ids(cfg: ModelConfig, seq_len: int = SEQ) -> torch.Tensor:
    """A (BATCH, seq_len) batch of valid token ids."""
    return torch.randint(
        0, cfg.vocab_size, (BATCH, seq_len), generator=torch.Generator().manual_seed(0)
    )


def test_grid_covers_every_value_of_every_toggle():
    seen = {name: {getattr(cfg, name) for cfg in GRID} for name in (
        "norm_position", "norm_type", "residual", "activation", "final_norm", "tie_weights",
        "init", "bias", "residual_scale", "qk_norm", "logit_softcap",
    )}  # fmt: skip
    assert seen["norm_position"] == set(NORM_POSITIONS)
    assert seen["norm_type"] == set(NORM_TYPES)
    assert seen["activation"] == set(ACTIVATIONS)
    assert seen["init"] == set(INITS)
    assert seen["final_norm"] == {None, True, False}
    for flag in ("residual", "tie_weights", "bias", "qk_norm"):
        assert seen[flag] == {True, False}
    assert seen["logit_softcap"] == {0.0, 30.0}
    assert {(cfg.attention, cfg.ffn) for cfg in GRID} == set(SUBLAYERS)
    qk_norm_types = {cfg.norm_type for cfg in GRID if cfg.qk_norm and cfg.attention}
    assert qk_norm_types == set(NORM_TYPES)
    assert any(cfg.qk_norm and cfg.attention and cfg.norm_position == "none" for cfg in GRID)


@pytest.mark.parametrize("cfg", GRID, ids=config_id)
def test_every_toggle_combination_maps_tokens_to_logits(cfg):
    torch.manual_seed(0)
    model = CharTransformer(cfg)
    idx = random_ids(cfg)
    logits, loss = model(idx, targets=idx)
    assert logits.shape == (BATCH, SEQ, cfg.vocab_size)
    assert torch.isfinite(logits).all()
    assert loss is not None and torch.isfinite(loss)
    # the closed-form breakdown must agree with what was built (tied matrix counted once)
    assert param_breakdown(cfg).total == model.n_params()
    assert (model.final_norm is not None) == cfg.use_final_norm
    for block in model.blocks:
        assert tuple(block.taps.keys()) == block_tap_names(cfg)


@pytest.mark.parametrize(
    ("position", "sublayers", "activation", "tie"),
    [
        (position, sublayers, activation, tie)
        for position, sublayers in itertools.product(NORM_POSITIONS, SUBLAYERS)
        for activation, tie in [("gelu", False), ("swiglu", True)]
    ],
)
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_one_backward_pass_reaches_every_parameter(position, sublayers, activation, tie, norm_type):
    attention, ffn = sublayers
    cfg = tiny(
        norm_position=position,
        norm_type=norm_type,
        attention=attention,
        ffn=ffn,
        activation=activation,
        tie_weights=tie,
        final_norm=True,
    )
    torch.manual_seed(0)
    model = CharTransformer(cfg)
    idx = random_ids(cfg, seq_len=cfg.block_size)  # every position row gets used
    _, loss = model(idx, targets=idx.roll(-1, dims=1))
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        # tensor-level: the k slice of a qkv bias gets no gradient (softmax is shift-invariant)
        # but the fused tensor as a whole must
        assert param.grad.abs().sum() > 0, name


@pytest.mark.parametrize("cfg", GRID, ids=config_id)
def test_every_block_parameter_gets_a_gradient_from_a_random_projection(cfg):
    torch.manual_seed(0)
    block = Block(cfg, layer_index=0)
    x = torch.randn(BATCH, SEQ, cfg.d_model, requires_grad=True)
    out = block(x)
    # A random projection, not out.sum(): a LayerNorm's output sums to the same number over
    # the features whatever its input, so .sum() sends no gradient back through a Post-LN
    # block's last norm (see the test below). A random direction has no such blind spot.
    (out * torch.randn_like(out)).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, param in block.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        if name == "attn.k_norm.bias":
            # It adds one number to every logit of a query's row: the softmax ignores it.
            assert param.grad.abs().max() < 1e-5, name
            continue
        assert param.grad.abs().sum() > 0, name


def test_out_sum_sends_no_gradient_through_a_post_ln_layernorm_block():
    torch.manual_seed(0)
    block = Block(tiny(norm_position="post", norm_type="layernorm"), layer_index=0)
    x = torch.randn(BATCH, SEQ, 8, requires_grad=True)
    block(x).sum().backward()
    grads = {name: param.grad.abs().max().item() for name, param in block.named_parameters()}
    # Only the last norm's own weight and bias see the loss; everything before it, the
    # input included, gets zero up to float round-off, because sum(LayerNorm(h)) over the
    # features is sum(bias) + sum(weight * h_hat) and with weight = 1 (its init) h_hat
    # sums to 0 whatever h is.
    assert grads.pop("norm2.weight") > 1.0 and grads.pop("norm2.bias") > 1.0
    assert max(grads.values()) < 1e-5 and x.grad.abs().max() < 1e-5, grads
    # RMSNorm does not centre, so its output's sum does depend on the input
    rms_block = Block(tiny(norm_position="post", norm_type="rmsnorm"), layer_index=0)
    rms_block(x).sum().backward()
    assert all(param.grad.abs().max() > 1e-3 for param in rms_block.parameters())


@pytest.mark.parametrize(("attention", "ffn"), [(True, False), (False, True)])
def test_switched_off_sublayer_has_no_parameters(attention, ffn):
    cfg = tiny(attention=attention, ffn=ffn)
    model = CharTransformer(cfg)
    gone = "attn" if not attention else "ffn"
    gone_norm = "norm1" if not attention else "norm2"
    names = [name for name, _ in model.named_parameters()]
    assert not [n for n in names if f".{gone}." in n or f".{gone_norm}." in n]
    for block in model.blocks:
        assert getattr(block, gone) is None and getattr(block, gone_norm) is None


def test_norm_position_none_builds_no_norms_even_if_final_norm_requested():
    model = CharTransformer(tiny(norm_position="none", final_norm=True))
    assert model.final_norm is None
    norm_types = (torch.nn.LayerNorm, RMSNorm, BatchNorm)
    assert not [m for m in model.modules() if isinstance(m, norm_types)]


def test_pre_and_post_ln_from_identical_weights_differ():
    torch.manual_seed(0)
    pre = CharTransformer(tiny(norm_position="pre", final_norm=True))
    post = CharTransformer(tiny(norm_position="post", final_norm=True))
    post.load_state_dict(pre.state_dict())  # same parameter names, so same weights
    idx = random_ids(pre.cfg)
    pre_logits, _ = pre(idx)
    post_logits, _ = post(idx)
    assert not torch.allclose(pre_logits, post_logits, atol=1e-4)


@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("residual", [True, False])
def test_pre_ln_block_with_zeroed_sublayers_is_identity_only_with_residual(
    norm_type, activation, residual
):
    cfg = tiny(norm_position="pre", norm_type=norm_type, activation=activation, residual=residual)
    block = Block(cfg, layer_index=0)
    with torch.no_grad():
        for param in [*block.attn.parameters(), *block.ffn.parameters()]:
            param.zero_()
    x = torch.randn(BATCH, SEQ, cfg.d_model)
    y = block(x)
    if residual:
        torch.testing.assert_close(y, x)
    else:
        assert not torch.allclose(y, x)
        assert torch.count_nonzero(y) == 0  # no skip path: the zero branches are all there is


def test_residual_scale_multiplies_each_branch():
    # Without norms the branch output is linear in the scale: x + s*f(x).
    torch.manual_seed(0)
    full = Block(tiny(norm_position="none", ffn=False, residual_scale=1.0), layer_index=0)
    half = Block(tiny(norm_position="none", ffn=False, residual_scale=0.5), layer_index=0)
    half.load_state_dict(full.state_dict())
    x = torch.randn(BATCH, SEQ, 8)
    torch.testing.assert_close(half(x) - x, 0.5 * (full(x) - x))


def test_sequence_longer_than_block_size_is_a_clear_error():
    cfg = tiny()
    model = CharTransformer(cfg)
    with pytest.raises(ModelInputError, match="block_size=8"):
        model(random_ids(cfg, seq_len=cfg.block_size + 1))
    assert issubclass(ModelInputError, ValueError)


def test_rmsnorm_matches_torch_and_keeps_the_input_dtype():
    torch.manual_seed(0)
    ours, reference = RMSNorm(16), torch.nn.RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        reference.weight.copy_(ours.weight)
    x = 3.0 * torch.randn(BATCH, SEQ, 16) + 1.0
    torch.testing.assert_close(ours(x), reference(x))
    assert ours(x.bfloat16()).dtype == torch.bfloat16
    assert [name for name, _ in ours.named_parameters()] == ["weight"]


# ---- reference counts from the course material ------------------------------------------


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("bias", "attention_params"), [(True, 2_362_368), (False, 2_359_296)])
def test_gpt2_small_block_attention_reference_count(bias, attention_params):
    cfg = ModelConfig(n_layer=1, d_model=768, n_head=12, ffn_mult=4, bias=bias)
    with torch.device("meta"):  # counting only: no memory, no init time
        block = Block(cfg, layer_index=0)
    assert _count(block.attn) == attention_params


def test_gpt2_small_block_ffn_and_norm_reference_counts():
    cfg = ModelConfig(n_layer=1, d_model=768, n_head=12, ffn_mult=4, activation="gelu")
    with torch.device("meta"):
        block = Block(cfg, layer_index=0)
    assert cfg.d_ff == 3072
    assert _count(block.ffn) == 4_722_432
    assert _count(block.norm1) + _count(block.norm2) == 3_072


def test_small_ffn_reference_count():
    block = Block(ModelConfig(d_model=64, n_head=4, ffn_mult=4), layer_index=0)
    assert _count(block.ffn) == 33_088


def test_swiglu_ffn_has_one_and_a_half_times_the_weights():
    plain = Block(tiny(bias=False, activation="gelu"), layer_index=0)
    gated = Block(tiny(bias=False, activation="swiglu"), layer_index=0)
    assert 2 * _count(gated.ffn) == 3 * _count(plain.ffn)


# ---- taps -------------------------------------------------------------------------------


@pytest.mark.parametrize("position", NORM_POSITIONS)
@pytest.mark.parametrize(("attention", "ffn"), SUBLAYERS)
def test_taps_present_where_documented_and_hooks_fire_with_shapes(position, attention, ffn):
    cfg = tiny(norm_position=position, attention=attention, ffn=ffn)
    model = CharTransformer(cfg)
    expected = set(TAPS)
    if not attention:
        expected -= {"norm1_out", "attn_out", "resid_mid"}
    if not ffn:
        expected -= {"norm2_out", "ffn_hidden", "ffn_out", "resid_mid"}
    if position == "none":
        expected -= {"norm1_out", "norm2_out"}
    fired: dict[str, tuple[int, ...]] = {}
    handles = []
    for layer in range(cfg.n_layer):
        assert set(model.blocks[layer].taps.keys()) == expected
        for name in expected:
            tap = model.get_submodule(f"blocks.{layer}.taps.{name}")
            key = f"{layer}.{name}"
            handles.append(
                tap.register_forward_hook(
                    lambda _m, _i, out, key=key: fired.__setitem__(key, tuple(out.shape))
                )
            )
    model(random_ids(cfg))
    for handle in handles:
        handle.remove()
    assert set(fired) == {f"{layer}.{name}" for layer in range(cfg.n_layer) for name in expected}
    for key, shape in fired.items():
        width = cfg.d_ff if key.endswith("ffn_hidden") else cfg.d_model
        assert shape == (BATCH, SEQ, width), key


def test_post_ln_resid_mid_is_after_norm1():
    cfg = tiny(norm_position="post")
    model = CharTransformer(cfg)
    seen: dict[str, torch.Tensor] = {}
    for name in ("norm1_out", "resid_mid"):
        model.blocks[0].taps[name].register_forward_hook(
            lambda _m, _i, out, name=name: seen.__setitem__(name, out)
        )
    model(random_ids(cfg))
    torch.testing.assert_close(seen["resid_mid"], seen["norm1_out"])
    # normalised over d_model: mean ~0, std ~1 per position
    torch.testing.assert_close(
        seen["resid_mid"].mean(-1), torch.zeros(BATCH, SEQ), atol=1e-5, rtol=0
    )


# ---- attention weights ------------------------------------------------------------------


def test_capture_attention_gives_causal_maps_and_the_fast_path_output():
    cfg = tiny(n_layer=3, n_head=2, d_model=16)
    torch.manual_seed(0)
    model = CharTransformer(cfg).eval()
    idx = random_ids(cfg)
    fast_logits, _ = model(idx)
    with capture_attention(model) as maps:
        explicit_logits, _ = model(idx)
    torch.testing.assert_close(explicit_logits, fast_logits, atol=1e-5, rtol=1e-5)
    assert sorted(maps) == [0, 1, 2]
    upper = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(diagonal=1)
    for weights in maps.values():
        assert weights.shape == (BATCH, cfg.n_head, SEQ, SEQ)
        torch.testing.assert_close(weights.sum(-1), torch.ones(BATCH, cfg.n_head, SEQ))
        assert torch.count_nonzero(weights[..., upper]) == 0
        assert not weights.requires_grad


def test_fast_path_uses_sdpa_and_capture_does_not(monkeypatch):
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting_sdpa(*args, **kwargs):
        calls.append(kwargs.get("is_causal"))
        return real_sdpa(*args, **kwargs)

    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", counting_sdpa)
    cfg = tiny()
    model = CharTransformer(cfg)
    idx = random_ids(cfg)
    with capture_attention(model):
        model(idx)
    assert calls == []
    model(idx)
    assert calls == [True] * cfg.n_layer


def test_capture_attention_restores_fast_path_on_exception():
    cfg = tiny()
    model = CharTransformer(cfg)
    with pytest.raises(RuntimeError, match="boom"), capture_attention(model) as maps:
        model(random_ids(cfg))
        raise RuntimeError("boom")
    assert len(maps) == cfg.n_layer
    maps.clear()
    model(random_ids(cfg))
    assert maps == {}  # nothing captured after exit
    assert all(block.attn.weights_sink is None for block in model.blocks)


def test_capture_attention_on_an_ffn_only_model_yields_nothing():
    cfg = tiny(attention=False)
    model = CharTransformer(cfg)
    with capture_attention(model) as maps:
        model(random_ids(cfg))
    assert maps == {}


# ---- qk_norm ----------------------------------------------------------------------------

QK_NORM_TYPES = {  # a batchnorm model's qk-norm is a LayerNorm (no batch statistics)
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "batchnorm": LayerNorm,
}


def queries_and_keys(model: CharTransformer, idx: torch.Tensor, monkeypatch) -> list:
    """(q, k) of every attention layer as they enter scaled_dot_product_attention."""
    seen = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spying_sdpa(q, k, v, **kwargs):
        seen.append((q.detach(), k.detach()))
        return real_sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", spying_sdpa)
    model(idx)
    return seen


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_qk_norm_gives_every_heads_queries_and_keys_unit_scale(norm_type, monkeypatch):
    cfg = tiny(qk_norm=True, norm_type=norm_type, d_model=16, n_head=2)
    torch.manual_seed(0)
    model = CharTransformer(cfg)
    for block in model.blocks:
        for norm in (block.attn.q_norm, block.attn.k_norm):
            # One norm of width head_dim per layer, shared by the heads; never a BatchNorm.
            assert type(norm) is QK_NORM_TYPES[norm_type]
            assert norm.weight.shape == (cfg.head_dim,)
    seen = queries_and_keys(model, random_ids(cfg), monkeypatch)
    assert len(seen) == cfg.n_layer
    for q, k in seen:
        for t in (q, k):
            assert t.shape == (BATCH, cfg.n_head, SEQ, cfg.head_dim)
            rms = t.pow(2).mean(-1).sqrt()  # (B, nh, T): per head and position
            torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-3, rtol=0)
            if norm_type != "rmsnorm":  # LayerNorm also centres (weight 1, bias 0 at init)
                mean = t.mean(-1)
                torch.testing.assert_close(mean, torch.zeros_like(mean), atol=1e-5, rtol=0)
    without = queries_and_keys(
        CharTransformer(tiny(d_model=16, n_head=2)), random_ids(cfg), monkeypatch
    )
    rms = without[0][0].pow(2).mean(-1).sqrt()
    assert not torch.allclose(rms, torch.ones_like(rms), atol=0.1)  # the check can tell


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_qk_norm_makes_attention_blind_to_the_size_of_q_and_k(qk_norm, norm_type):
    cfg = tiny(qk_norm=qk_norm, norm_type=norm_type, d_model=16, n_head=2)
    torch.manual_seed(0)
    attn = model_module.CausalSelfAttention(cfg, layer_index=0)
    x = torch.randn(BATCH, SEQ, cfg.d_model)
    with torch.no_grad():
        before = attn(x)
        # q and k ten times larger (their rows of the fused weight and bias), v untouched
        attn.qkv.weight[: 2 * cfg.d_model] *= 10
        attn.qkv.bias[: 2 * cfg.d_model] *= 10
        after = attn(x)
    assert torch.allclose(after, before, atol=1e-4) == qk_norm


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("norm_position", ["pre", "none"])
def test_qk_norm_fast_and_explicit_attention_agree(norm_type, norm_position):
    cfg = tiny(qk_norm=True, norm_type=norm_type, norm_position=norm_position, d_model=16)
    torch.manual_seed(0)
    model = CharTransformer(cfg).eval()
    with torch.no_grad():  # weights away from their init, so the norms' gains count too
        for name, param in model.named_parameters():
            if "_norm" in name:
                param.add_(0.3 * torch.randn_like(param))
    idx = random_ids(cfg)
    fast_logits, _ = model(idx)
    with capture_attention(model) as maps:
        explicit_logits, _ = model(idx)
    torch.testing.assert_close(explicit_logits, fast_logits, atol=1e-5, rtol=1e-5)
    assert sorted(maps) == list(range(cfg.n_layer))
    plain = CharTransformer(dataclasses.replace(cfg, qk_norm=False))
    plain.load_state_dict(model.state_dict(), strict=False)
    assert not torch.allclose(plain.eval()(idx)[0], fast_logits)  # the norms took part


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_qk_norm_weights_get_gradients_and_are_counted(norm_type, bias):
    cfg = tiny(qk_norm=True, norm_type=norm_type, bias=bias)
    torch.manual_seed(0)
    model = CharTransformer(cfg)
    idx = random_ids(cfg)
    _, loss = model(idx, targets=idx.roll(-1, dims=1))
    loss.backward()
    params = dict(model.named_parameters())
    has_bias = bias and norm_type != "rmsnorm"
    for layer in range(cfg.n_layer):
        prefix = f"blocks.{layer}.attn"
        for norm in ("q_norm", "k_norm"):
            assert params[f"{prefix}.{norm}.weight"].grad.abs().sum() > 0
            assert (f"{prefix}.{norm}.bias" in params) == has_bias
            assert param_component(f"{prefix}.{norm}.weight", cfg.n_layer) == (layer, "attn")
        if has_bias:
            assert params[f"{prefix}.q_norm.bias"].grad.abs().sum() > 0
            # k_norm's bias shifts a query's logits all alike: the softmax ignores it
            assert params[f"{prefix}.k_norm.bias"].grad.abs().max() < 1e-5
    assert model.n_params() == param_breakdown(cfg).total
    off = CharTransformer(dataclasses.replace(cfg, qk_norm=False))
    per_norm = 2 if has_bias else 1
    assert model.n_params() - off.n_params() == cfg.n_layer * 2 * per_norm * cfg.head_dim


# ---- logit_softcap ----------------------------------------------------------------------


def capped_and_raw(cap: float) -> tuple[CharTransformer, CharTransformer]:
    """Two models with the same weights, logits soft-capped at `cap` and not capped; the
    raw logits of `random_ids` reach twice the cap, so it bites."""
    cfg = tiny(logit_softcap=cap)
    torch.manual_seed(0)
    capped = CharTransformer(cfg)
    raw = CharTransformer(dataclasses.replace(cfg, logit_softcap=0.0))
    raw.load_state_dict(capped.state_dict())  # the cap adds no parameters
    with torch.no_grad():
        largest = raw(random_ids(cfg))[0].abs().max()
        for model in (capped, raw):
            model.lm_head.weight.mul_(2 * cap / largest)
    return capped, raw


@pytest.mark.parametrize("cap", [0.5, 3.0, 30.0])
def test_logit_softcap_is_cap_tanh_of_the_raw_logits(cap):
    capped, raw = capped_and_raw(cap)
    idx = random_ids(capped.cfg)
    targets = idx.roll(-1, dims=1)
    logits, loss = capped(idx, targets)
    raw_logits, raw_loss = raw(idx, targets)
    assert logits.abs().max() < cap
    assert raw_logits.abs().max() > 1.9 * cap
    torch.testing.assert_close(logits, cap * torch.tanh(raw_logits / cap))
    # the loss is the cross-entropy of the capped logits, not of the raw ones
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(loss, expected)
    assert not torch.allclose(loss, raw_loss)


def test_logit_softcap_passes_gradients_and_shapes_what_is_sampled(monkeypatch):
    capped, raw = capped_and_raw(0.5)
    idx = random_ids(capped.cfg)
    _, loss = capped(idx, idx.roll(-1, dims=1))
    loss.backward()
    assert capped.lm_head.weight.grad.abs().sum() > 0
    assert capped.tok_emb.weight.grad.abs().sum() > 0
    sampled_from = []
    real_multinomial = torch.multinomial

    def spying_multinomial(probs, *args, **kwargs):
        sampled_from.append(probs)
        return real_multinomial(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", spying_multinomial)
    capped.eval().generate(idx[:1, :4], max_new_tokens=1)
    with torch.no_grad():
        raw_logits, _ = raw.eval()(idx[:1, :4])
    expected = (0.5 * torch.tanh(raw_logits[:, -1] / 0.5)).softmax(-1)  # (1, V)
    torch.testing.assert_close(sampled_from[0], expected)
    assert not torch.allclose(sampled_from[0], raw_logits[:, -1].softmax(-1))


# ---- init -------------------------------------------------------------------------------


def test_gpt2_init_scales_residual_projections():
    n_layer = 8
    cfg = ModelConfig(vocab_size=65, n_layer=n_layer, n_head=4, d_model=256, init="gpt2")
    torch.manual_seed(0)
    model = CharTransformer(cfg)
    residual_std = 0.02 / math.sqrt(2 * n_layer)
    for block in (model.blocks[0], model.blocks[-1]):
        # 65k and 262k samples: the sample std is within ~1% of the true one
        assert block.attn.proj.weight.std().item() == pytest.approx(residual_std, rel=0.03)
        assert block.ffn.fc_out.weight.std().item() == pytest.approx(residual_std, rel=0.03)
        assert block.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.03)
        assert block.ffn.fc_in.weight.std().item() == pytest.approx(0.02, rel=0.03)
        assert torch.count_nonzero(block.attn.qkv.bias) == 0
        assert torch.count_nonzero(block.ffn.fc_out.bias) == 0
        assert torch.equal(block.norm1.weight, torch.ones(cfg.d_model))
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
    default = CharTransformer(dataclasses.replace(cfg, init="default"))
    assert default.blocks[0].attn.proj.weight.std().item() > 2 * residual_std


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_xavier_init_matches_its_variance_and_zeroes_biases(activation):
    cfg = ModelConfig(
        vocab_size=65, n_layer=2, n_head=4, d_model=128, init="xavier", activation=activation
    )
    torch.manual_seed(0)
    model = CharTransformer(cfg)
    d, d_ff = cfg.d_model, cfg.d_ff

    def assert_xavier(weight: torch.Tensor, fan_in: int, fan_out: int) -> None:
        # U(-a, a) has variance a²/3 = 2 / (fan_in + fan_out); with >= 8k samples the
        # sample variance is within ~2% of it
        assert weight.var().item() == pytest.approx(2 / (fan_in + fan_out), rel=0.05)
        assert weight.abs().max().item() <= math.sqrt(6 / (fan_in + fan_out))

    for block in model.blocks:
        assert_xavier(block.attn.qkv.weight, d, 3 * d)  # fused, as nn.MultiheadAttention
        assert_xavier(block.attn.proj.weight, d, d)
        gated = 2 if activation == "swiglu" else 1
        assert_xavier(block.ffn.fc_in.weight, d, gated * d_ff)
        assert_xavier(block.ffn.fc_out.weight, d_ff, d)
        for linear in (block.attn.qkv, block.attn.proj, block.ffn.fc_in, block.ffn.fc_out):
            assert torch.count_nonzero(linear.bias) == 0
        assert torch.equal(block.norm1.weight, torch.ones(d))
        assert torch.count_nonzero(block.norm2.bias) == 0
    assert_xavier(model.lm_head.weight, d, cfg.vocab_size)
    # embeddings keep PyTorch's N(0, 1)
    assert model.tok_emb.weight.std().item() == pytest.approx(1.0, rel=0.05)
    assert model.pos_emb.weight.std().item() == pytest.approx(1.0, rel=0.05)


def test_xavier_init_initialises_a_tied_matrix_as_the_head():
    cfg = ModelConfig(vocab_size=65, d_model=128, init="xavier", tie_weights=True)
    model = CharTransformer(cfg)
    assert model.tok_emb.weight is model.lm_head.weight
    assert model.lm_head.weight.var().item() == pytest.approx(2 / (128 + 65), rel=0.05)


@pytest.mark.parametrize("tie", [False, True])
def test_parameter_count_does_not_depend_on_init(tie):
    counts = {init: CharTransformer(tiny(init=init, tie_weights=tie)).n_params() for init in INITS}
    assert len(set(counts.values())) == 1, counts
    assert counts["xavier"] == param_breakdown(tiny(init="xavier", tie_weights=tie)).total


def test_tied_weights_share_one_tensor():
    model = CharTransformer(tiny(tie_weights=True))
    assert model.lm_head.weight is model.tok_emb.weight
    assert "lm_head.weight" not in dict(model.named_parameters())


# ---- sampling ---------------------------------------------------------------------------


def test_generate_appends_valid_ids_beyond_the_context_window():
    cfg = tiny()
    torch.manual_seed(0)
    model = CharTransformer(cfg).eval()
    start = random_ids(cfg, seq_len=3)
    out = model.generate(start, max_new_tokens=2 * cfg.block_size, temperature=0.8, top_k=5)
    assert out.shape == (BATCH, 3 + 2 * cfg.block_size)
    assert torch.equal(out[:, :3], start)
    assert out.min() >= 0 and out.max() < cfg.vocab_size


def test_greedy_generation_is_deterministic():
    cfg = tiny()
    torch.manual_seed(0)
    model = CharTransformer(cfg).eval()
    start = random_ids(cfg, seq_len=2)
    first = model.generate(start, max_new_tokens=10, temperature=0.0)
    torch.manual_seed(123)  # greedy must not touch the RNG
    second = model.generate(start, max_new_tokens=10, temperature=0.0)
    by_top_1 = model.generate(start, max_new_tokens=10, top_k=1)
    assert torch.equal(first, second) and torch.equal(first, by_top_1)


@pytest.mark.parametrize(
    ("kwargs", "needle"), [({"temperature": -1.0}, "temperature"), ({"top_k": 0}, "top_k")]
)
def test_generate_rejects_bad_sampling_settings(kwargs, needle):
    cfg = tiny()
    model = CharTransformer(cfg)
    with pytest.raises(ModelInputError, match=needle):
        model.generate(random_ids(cfg, seq_len=1), max_new_tokens=1, **kwargs)


# ---- parameter names --------------------------------------------------------------------


def test_param_component_maps_every_parameter_of_a_model():
    cfg = tiny(n_layer=3, norm_position="pre")
    model = CharTransformer(cfg)
    mapped = {name: param_component(name, cfg.n_layer) for name, _ in model.named_parameters()}
    assert mapped["tok_emb.weight"] == (-1, "embed")
    assert mapped["pos_emb.weight"] == (-1, "embed")
    assert mapped["blocks.2.attn.qkv.weight"] == (2, "attn")
    assert mapped["blocks.1.attn.proj.bias"] == (1, "attn")
    assert mapped["blocks.0.ffn.fc_in.weight"] == (0, "ffn")
    assert mapped["blocks.0.norm1.weight"] == (0, "norm")
    assert mapped["blocks.2.norm2.bias"] == (2, "norm")
    assert mapped["final_norm.weight"] == (3, "norm")
    assert mapped["lm_head.weight"] == (3, "head")
    assert param_component("model._orig_mod.blocks.1.ffn.fc_out.weight", 3) == (1, "ffn")
    with pytest.raises(ValueError, match="not a CharTransformer parameter"):
        param_component("encoder.layer.0.weight", 3)


# ---------------------------------------------------------------- BatchNorm


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_batchnorm_counts_match_and_running_stats_are_buffers(position: str, bias: bool) -> None:
    config = tiny(norm_type="batchnorm", norm_position=position, bias=bias)
    model = CharTransformer(config)
    assert model.n_params() == param_breakdown(config).total
    state = model.state_dict()
    running = [k for k in state if k.endswith(("running_mean", "running_var"))]
    assert running and all(k not in dict(model.named_parameters()) for k in running)
    norms = [m for m in model.modules() if isinstance(m, BatchNorm)]
    assert norms and all((m.bias is None) != bias for m in norms)
    again = CharTransformer(config)
    again.load_state_dict(state)  # a checkpoint round trip carries the running statistics
    assert torch.equal(again.state_dict()[running[0]], state[running[0]])


def test_batchnorm_uses_the_batch_in_training_and_running_stats_in_eval() -> None:
    torch.manual_seed(0)
    norm = BatchNorm(8)
    x = torch.randn(4, 5, 8)
    other = torch.cat([x[:1], torch.randn(3, 5, 8) * 5 + 2])  # same first sequence
    norm.train()
    assert not torch.allclose(norm(x)[0], norm(other)[0])  # the rest of the batch matters
    norm.eval()
    assert torch.allclose(norm(x)[0], norm(other)[0])  # it does not
    flat = x.reshape(-1, 8)
    expected = (flat - norm.bn.running_mean) / torch.sqrt(norm.bn.running_var + 1e-5)
    assert torch.allclose(norm(x).reshape(-1, 8), expected, atol=1e-5)
