"""Config validation names the field; JSON and flags round-trip without loss."""

import json
import math

import pytest

from blockviz import cli
from blockviz.core import config as cfg
from blockviz.core.bounds import MAX_STEPS
from blockviz.core.config import BOUNDS
from blockviz.core.config_model import ModelConfig
from blockviz.core.config_train import DataConfig
from blockviz.core.fields import ConfigError
from blockviz.core.flags import run_config_from_args
from blockviz.core.presets import PRESETS


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 130, "n_head": 4}, "n_head"),
        ({"n_layer": 0}, "n_layer"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"norm_position": "middle"}, "norm_position"),
        ({"norm_type": "groupnorm"}, "norm_type"),
        ({"activation": "tanh"}, "activation"),
        ({"init": "orthogonal"}, "init"),
        ({"qk_norm": "yes"}, "qk_norm"),
        ({"logit_softcap": -1.0}, "logit_softcap"),
        ({"logit_softcap": 1e9}, "logit_softcap"),
        ({"attention": False, "ffn": False}, "ffn"),
        ({"block_size": 0}, "block_size"),
        ({"ffn_mult": 0}, "ffn_mult"),
        ({"lr": 0.0}, "lr"),
        ({"min_lr": 1.0}, "min_lr"),
        ({"lr_schedule": "step"}, "lr_schedule"),
        ({"z_loss": -1.0}, "z_loss"),
        ({"z_loss": 1e9}, "z_loss"),
        ({"precision": "64-true"}, "precision"),
        ({"batch_size": 0}, "batch_size"),
        ({"warmup_steps": 5000}, "warmup_steps"),
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"ops_min_args": 4, "ops_max_args": 3}, "ops_max_args"),
        ({"dataset": " "}, "dataset"),
    ],
)
def test_validation_error_names_field_and_value(overrides, field):
    with pytest.raises(ConfigError) as info:
        cfg.replace(cfg.RunConfig(), **overrides).validate()
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert repr(overrides.get(field, info.value.value)) in str(info.value)


@pytest.mark.parametrize("value", [-1.0, 1e9, math.nan, math.inf])
@pytest.mark.parametrize(
    ("name", "allowed"), [("logit_softcap", "[0.0, 1000.0]"), ("z_loss", "[0.0, 1.0]")]
)
def test_the_instability_fixes_refuse_out_of_range_values_by_name(name, allowed, value):
    with pytest.raises(ConfigError) as info:
        cfg.replace(cfg.RunConfig(), **{name: value}).validate()
    assert str(info.value) == f"{name}: {value!r} is not allowed; must be a number in {allowed}"


def test_a_config_stored_before_the_instability_fixes_loads_with_them_off():
    stored = cfg.RunConfig().to_dict()
    del stored["model"]["qk_norm"], stored["model"]["logit_softcap"], stored["train"]["z_loss"]
    loaded = cfg.RunConfig.from_json(json.dumps(stored)).validate()
    assert loaded == cfg.RunConfig()
    assert (loaded.model.qk_norm, loaded.model.logit_softcap, loaded.train.z_loss) == (
        False,
        0.0,
        0.0,
    )


def test_head_error_suggests_divisors():
    with pytest.raises(ConfigError, match=r"must divide d_model=96; try one of .*\b3\b"):
        ModelConfig(d_model=96, n_head=5).validate()


def test_head_count_is_free_when_attention_is_off():
    ModelConfig(d_model=96, n_head=5, attention=False).validate()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_and_round_trip_through_json(name):
    run = cfg.preset(name).validate()
    assert cfg.RunConfig.from_json(run.to_json()) == run


def test_json_round_trip_keeps_every_non_default_value():
    run = cfg.replace(
        cfg.RunConfig(),
        final_norm=True,
        residual_scale=0.5,
        activation="swiglu",
        lr=3e-4,
        compile=True,
        dataset="/tmp/x.txt",
    )
    again = cfg.RunConfig.from_json(run.to_json())
    assert again == run
    assert again.model.final_norm is True and again.train.lr == 3e-4


def test_unknown_field_in_json_is_named():
    with pytest.raises(ConfigError, match=r"^n_layers: "):
        cfg.RunConfig.from_dict({"model": {"n_layers": 3}})


def test_invalid_json_is_reported():
    with pytest.raises(ConfigError, match="not valid JSON"):
        cfg.RunConfig.from_json("{nope")


@pytest.mark.parametrize(
    ("position", "explicit", "expected"),
    [("pre", None, True), ("post", None, False), ("none", None, False), ("post", True, True)],
)
def test_final_norm_default_depends_on_norm_position(position, explicit, expected):
    model = ModelConfig(norm_position=position, final_norm=explicit)
    assert model.use_final_norm is expected


def test_diff_lists_only_changed_fields():
    a = cfg.preset("gpt2-preln")
    b = cfg.replace(a, norm_position="post", lr=3e-4)
    assert cfg.diff(a, b) == {"norm_position": ("pre", "post"), "lr": (1e-3, 3e-4)}


def test_cli_flags_become_typed_overrides():
    parser = cli.build_parser()
    args = parser.parse_args(
        ["train", "--n_layer", "6", "--bias", "false", "--final_norm", "auto", "--lr", "3e-4"]
    )
    run = run_config_from_args(args)
    assert run.model.n_layer == 6 and run.model.bias is False
    assert run.model.final_norm is None and run.train.lr == 3e-4


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["params", "--n_layer", "two"], "n_layer: 'two'"),
        (["params", "--bias", "maybe"], "bias: 'maybe'"),
        (["params", "--d_model", "100", "--n_head", "3"], "n_head: 3"),
        (["params", "--nope", "1"], "--nope"),
    ],
)
def test_cli_bad_flag_is_one_line_and_exit_2(argv, needle, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert needle in err
    assert len(err.splitlines()) == 1


# ------------------------------------------------------------------ bounds (issue 10)

NUMERIC_FIELDS = {
    name
    for cls in cfg.SECTIONS.values()
    for name, annotation in cfg.field_types(cls).items()
    if annotation in (int, float)
}
# Partners an end value needs so that the cross-field rules hold as well.
PARTNERS = {
    ("n_head", "high"): {"d_model": 256},
    ("d_model", "low"): {"n_head": 1},
    ("min_lr", "high"): {"lr": 10.0},
    ("max_steps", "low"): {"warmup_steps": 0},
    ("warmup_steps", "high"): {"max_steps": MAX_STEPS},
    ("ops_min_args", "high"): {"ops_max_args": 9},
    ("ops_max_args", "low"): {"ops_min_args": 1},
}


def is_int_field(name):
    return cfg.field_types(cfg.SECTIONS[cfg.section_of(name)])[name] is int


def test_every_numeric_field_has_one_bound():
    assert set(BOUNDS) == NUMERIC_FIELDS
    for name, bound in BOUNDS.items():
        assert bound.low < bound.high, name


@pytest.mark.parametrize("name", sorted(NUMERIC_FIELDS))
def test_values_past_either_end_are_refused_by_name(name):
    bound, is_int = BOUNDS[name], is_int_field(name)
    if is_int:
        outside = [bound.high + 1, bound.high * 1000, bound.low - 1]
    else:
        outside = [bound.high * 1.001 + 1e-9, bound.high * 1000.0, bound.low - 1.0]
    for value in outside:
        with pytest.raises(ConfigError) as info:
            cfg.replace(cfg.RunConfig(), **{name: value}).validate()
        assert info.value.field == name
        assert str(info.value) == (
            f"{name}: {value!r} is not allowed; must be {bound.describe(integer=is_int)}"
        )


@pytest.mark.parametrize("name", sorted(NUMERIC_FIELDS))
@pytest.mark.parametrize("end", ["low", "high"])
def test_the_ends_themselves_follow_the_table(name, end):
    bound = BOUNDS[name]
    value, is_open = (bound.low, bound.low_open) if end == "low" else (bound.high, bound.high_open)
    run = cfg.replace(cfg.RunConfig(), **{**PARTNERS.get((name, end), {}), name: value})
    if is_open:
        with pytest.raises(ConfigError, match=f"^{name}: "):
            run.validate()
    else:
        assert run.validate() is run


def test_huge_values_give_a_short_message():
    with pytest.raises(ConfigError) as info:
        ModelConfig(n_layer=10**5000).validate()
    message = str(info.value)
    assert message.startswith("n_layer: an integer of 5,001 digits is not allowed")
    assert len(message) < 200
    with pytest.raises(ConfigError, match=r"^dataset: ") as info:
        DataConfig(dataset=["x"] * 10_000).validate()
    assert len(str(info.value)) < 300


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
        ('{"train": {"seed": ' + "9" * 5000 + "}}", "more than"),
        ("[1, 2]", "must be a JSON object"),
        ('{"model": [1]}', "must be a JSON object"),
    ],
    ids=["deep", "5000-digits", "list", "section-list"],
)
def test_unusable_json_is_one_config_error(text, reason):
    with pytest.raises(ConfigError, match=reason) as info:
        cfg.RunConfig.from_json(text)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300


def test_an_int_too_large_for_a_float_field_is_refused_not_an_overflow():
    run = cfg.RunConfig.from_dict({"train": {"lr": 10**400}})
    with pytest.raises(ConfigError, match=r"^lr: an integer of 401 digits"):
        run.validate()


@pytest.mark.parametrize(
    ("name", "text"), [("lr", "1e999"), ("lr", "nan"), ("lr", "-inf"), ("dropout", "NaN")]
)
def test_non_finite_flags_are_refused_by_name(name, text):
    value = cfg.coerce(name, text, float)
    with pytest.raises(ConfigError, match=f"^{name}: "):
        cfg.replace(cfg.RunConfig(), **{name: value}).validate()


def test_an_integer_flag_past_pythons_digit_limit_gives_the_range():
    with pytest.raises(ConfigError) as info:
        cfg.coerce("max_steps", "9" * 5000, int)
    assert str(info.value).endswith("must be an integer in [1, 10000000]")
    assert len(str(info.value)) < 200
