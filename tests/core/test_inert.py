"""core.inert: each field it calls inert really changes nothing under that config."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from blockviz.core import config, corpora
from blockviz.core.config_model import ACTIVATIONS, NORM_TYPES, ModelConfig
from blockviz.core.config_train import DataConfig
from blockviz.core.inert import OPS_FIELDS, inert_fields
from blockviz.core.naming import run_name
from blockviz.training.lit import lr_at
from blockviz.training.model import CharTransformer

torch.set_num_threads(1)

TINY = {"vocab_size": 11, "n_layer": 2, "n_head": 2, "d_model": 8, "block_size": 8}
MODEL_CASES = {
    "no-norm": {"norm_position": "none"},
    "no-ffn": {"ffn": False},
    "no-attention": {"attention": False},
    "no-attention-qk-norm": {"attention": False, "qk_norm": True},
    "no-norm-qk-norm": {"norm_position": "none", "qk_norm": True},
}
MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}


def other_value(name: str, value: object) -> object:
    """A different allowed value of a model field."""
    choices = {
        "norm_type": NORM_TYPES,
        "activation": ACTIVATIONS,
        "final_norm": (None, True, False),
    }
    if name in choices:
        return next(c for c in choices[name] if c != value)
    if isinstance(value, bool):
        return not value
    if name == "n_head":
        return 4 if value != 4 else 8  # both divide d_model 8
    assert isinstance(value, int)
    return value + 1


def built(model_cfg: ModelConfig) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The model's weights and its logits on one fixed batch, from seed 0."""
    torch.manual_seed(0)
    model = CharTransformer(model_cfg).eval()
    tokens = torch.arange(16).remainder(model_cfg.vocab_size).view(2, 8)
    with torch.no_grad():
        logits, _ = model(tokens)
    return model.state_dict(), logits


def same_model(a: ModelConfig, b: ModelConfig) -> bool:
    weights_a, logits_a = built(a)
    weights_b, logits_b = built(b)
    if weights_a.keys() != weights_b.keys():
        return False
    if any(weights_a[k].shape != weights_b[k].shape for k in weights_a):
        return False
    return all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a) and torch.equal(
        logits_a, logits_b
    )


def inert_model_fields() -> list[tuple[str, str]]:
    out = []
    for case, overrides in MODEL_CASES.items():
        run_config = config.replace(config.RunConfig(), **TINY, **overrides)
        out += [(case, name) for name in inert_fields(run_config) if name in MODEL_FIELDS]
    return out


@pytest.mark.parametrize(("case", "name"), inert_model_fields())
def test_an_inert_model_field_builds_the_same_model(case: str, name: str) -> None:
    model_cfg = config.replace(config.RunConfig(), **TINY, **MODEL_CASES[case]).model
    changed = dataclasses.replace(model_cfg, **{name: other_value(name, getattr(model_cfg, name))})
    assert same_model(model_cfg.validate(), changed.validate())


@pytest.mark.parametrize("name", ["norm_type", "activation", "n_head", "ffn_mult", "qk_norm"])
def test_the_same_field_changes_the_full_model(name: str) -> None:
    """The check above can tell: in a model with norms, FFN and attention these matter."""
    model_cfg = config.replace(config.RunConfig(), **TINY).model
    assert name not in inert_fields(config.replace(config.RunConfig(), **TINY))
    changed = dataclasses.replace(model_cfg, **{name: other_value(name, getattr(model_cfg, name))})
    assert not same_model(model_cfg, changed.validate())


def test_norm_type_still_picks_the_qk_norms_without_stream_norms() -> None:
    """With norm position none, qk_norm's norms are the model's only ones: rmsnorm or not."""
    run_config = config.replace(config.RunConfig(), **TINY, **MODEL_CASES["no-norm-qk-norm"])
    assert "norm_type" not in inert_fields(run_config)
    assert "final_norm" in inert_fields(run_config)
    model_cfg = run_config.model
    rms = dataclasses.replace(model_cfg, norm_type="rmsnorm").validate()
    assert not same_model(model_cfg, rms)
    name = run_name(config.replace(run_config, norm_type="rmsnorm"))
    assert "rmsnorm" in name.split("-")


def test_min_lr_is_inert_under_a_constant_schedule_only() -> None:
    constant = config.replace(config.RunConfig(), lr_schedule="constant").train
    assert "min_lr" in inert_fields(config.replace(config.RunConfig(), lr_schedule="constant"))
    lower = dataclasses.replace(constant, min_lr=constant.min_lr / 10)
    steps = range(constant.max_steps + 5)
    assert [lr_at(s, constant) for s in steps] == [lr_at(s, lower) for s in steps]
    cosine = dataclasses.replace(constant, lr_schedule="cosine")
    assert "min_lr" not in inert_fields(config.RunConfig(train=cosine))
    assert lr_at(cosine.max_steps, cosine) != lr_at(
        cosine.max_steps, dataclasses.replace(cosine, min_lr=cosine.min_lr / 10)
    )


def test_ops_fields_are_read_by_the_ops_dataset_only() -> None:
    changed = {"ops_examples": 500, "ops_max_args": 3, "ops_seed": 7}
    assert set(changed) <= set(OPS_FIELDS)
    for dataset in ("pydocs", "ops"):
        base = DataConfig(dataset=dataset)
        other = dataclasses.replace(base, **changed)
        same = corpora.load_corpus(base).text == corpora.load_corpus(other).text
        assert same == (dataset != "ops")
        assert (set(changed) <= set(inert_fields(config.RunConfig(data=base)))) == same


@pytest.mark.parametrize(
    ("overrides", "dropped"),
    [
        ({"norm_position": "none", "norm_type": "rmsnorm"}, "rmsnorm"),
        ({"norm_position": "none", "final_norm": True}, "finalnorm"),
        ({"ffn": False, "activation": "relu"}, "relu"),
        ({"attention": False, "n_head": 8}, "8H"),
        ({"attention": False, "qk_norm": True}, "qknorm"),
    ],
)
def test_the_suggested_name_leaves_inert_fields_out(overrides: dict, dropped: str) -> None:
    name = run_name(config.replace(config.RunConfig(), **overrides))
    assert dropped not in name.split("-")
    assert name == run_name(
        config.replace(config.RunConfig(), **{k: v for k, v in list(overrides.items())[:1]})
    )
