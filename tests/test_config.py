"""Config validation names the field; JSON and flags round-trip without loss."""

import pytest

from blockviz import cli
from blockviz import config as cfg


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 130, "n_head": 4}, "n_head"),
        ({"n_layer": 0}, "n_layer"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"norm_position": "middle"}, "norm_position"),
        ({"norm_type": "batchnorm"}, "norm_type"),
        ({"activation": "tanh"}, "activation"),
        ({"init": "xavier"}, "init"),
        ({"attention": False, "ffn": False}, "ffn"),
        ({"block_size": 0}, "block_size"),
        ({"ffn_mult": 0}, "ffn_mult"),
        ({"lr": 0.0}, "lr"),
        ({"min_lr": 1.0}, "min_lr"),
        ({"lr_schedule": "step"}, "lr_schedule"),
        ({"precision": "64-true"}, "precision"),
        ({"batch_size": 0}, "batch_size"),
        ({"warmup_steps": 5000}, "warmup_steps"),
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"ops_min_args": 4, "ops_max_args": 3}, "ops_max_args"),
        ({"dataset": " "}, "dataset"),
    ],
)
def test_validation_error_names_field_and_value(overrides, field):
    with pytest.raises(cfg.ConfigError) as info:
        cfg.replace(cfg.RunConfig(), **overrides).validate()
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert repr(overrides.get(field, info.value.value)) in str(info.value)


def test_head_error_suggests_divisors():
    with pytest.raises(cfg.ConfigError, match=r"must divide d_model=96; try one of .*\b3\b"):
        cfg.ModelConfig(d_model=96, n_head=5).validate()


def test_head_count_is_free_when_attention_is_off():
    cfg.ModelConfig(d_model=96, n_head=5, attention=False).validate()


@pytest.mark.parametrize("name", sorted(cfg.PRESETS))
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
    with pytest.raises(cfg.ConfigError, match=r"^n_layers: "):
        cfg.RunConfig.from_dict({"model": {"n_layers": 3}})


def test_invalid_json_is_reported():
    with pytest.raises(cfg.ConfigError, match="not valid JSON"):
        cfg.RunConfig.from_json("{nope")


@pytest.mark.parametrize(
    ("position", "explicit", "expected"),
    [("pre", None, True), ("post", None, False), ("none", None, False), ("post", True, True)],
)
def test_final_norm_default_depends_on_norm_position(position, explicit, expected):
    model = cfg.ModelConfig(norm_position=position, final_norm=explicit)
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
    run = cli.run_config_from_args(args)
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
