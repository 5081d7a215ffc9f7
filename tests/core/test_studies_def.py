"""Study definitions, sizes and custom sweeps (core.studies: define, builtins, sweeps)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from blockviz.core.config import RunConfig
from blockviz.core.fields import ConfigError
from blockviz.core.probe_schedule import probe_steps
from blockviz.core.studies import builtins, define, sweeps
from blockviz.core.studies.verdicts import RULES


@pytest.mark.parametrize("key", builtins.STUDY_KEYS)
@pytest.mark.parametrize("size", define.SIZES)
def test_every_builtin_study_builds_valid_configs_at_every_size(key: str, size: str) -> None:
    study = builtins.builtin(key, size)
    assert study.size == size and study.seeds == tuple(range(1, define.SIZE_SEEDS[size] + 1))
    assert study.baseline in {v.label for v in study.variants}
    for variant in study.variants:
        config = study.config_for(variant.label)
        for name, value in define.SIZE_PRESETS[size].items():
            if name not in variant.overrides and name not in study.base:
                assert define.swept_value(study, variant.label, name) == value
    for claim in study.claims:
        assert claim.rule in RULES and claim.source
    assert config.validate() is config


@pytest.mark.parametrize("key", builtins.STUDY_KEYS)
def test_a_builtin_is_a_typed_study_under_its_own_key_that_its_size_only_adds_to(key: str) -> None:
    defined = builtins.BUILTINS[key]()
    assert isinstance(defined, define.StudyDef) and defined.key == key
    sized = builtins.builtin(key, "standard", 3)
    assert sized.key == key and sized.size == "standard" and sized.seeds == (1, 2, 3)
    assert (sized.title, sized.claims, sized.variants) == (
        defined.title,
        defined.claims,
        defined.variants,
    )
    assert {**define.SIZE_PRESETS["standard"], **defined.base} == dict(sized.base)
    assert builtins.describe([key]) == [(key, defined.title, defined.question)]


@pytest.mark.parametrize("size", define.SIZES)
def test_every_size_probes_often_enough_for_the_findings(size: str) -> None:
    """At least 3 probes after step 0 (a state rule needs two in a row): the quick size
    used to probe at steps 0 and 299 only, so its runs' findings could never fire."""
    for key in builtins.STUDY_KEYS:
        study = builtins.builtin(key, size)
        for variant in study.variants:
            train = study.config_for(variant.label).train
            steps = probe_steps(train.max_steps, train.probe_interval)
            assert steps[0] == 0 and steps[-1] == train.max_steps - 1
            assert len(steps) - 1 >= 3, (key, variant.label, steps)
    assert probe_steps(300, 300) == [0, 299]  # the old quick schedule
    assert probe_steps(300, 100) == [0, 100, 200, 299]
    # The last trained step once, whether or not it falls on the interval.
    assert probe_steps(6, 5) == [0, 5] and probe_steps(5, 5) == [0, 4] and probe_steps(1, 5) == [0]
    assert probe_steps(0, 5) == []


def test_claims_say_what_their_rule_judges() -> None:
    claims = [c for key in builtins.STUDY_KEYS for c in builtins.builtin(key).claims]
    for claim in claims:
        if claim.rule == "fails_often":  # counts every way of failing to train
            assert all(
                w in claim.text for w in ("fails to train", "diverges", "blows up", "stalls")
            )
        if "at least as well" in claim.text:  # non-inferiority, not "lower"
            assert claim.rule == "not_worse"
            assert claim.args["margin"] == builtins.NOT_WORSE_MARGIN
    assert {c.rule for c in claims} >= {"fails_often", "not_worse"}


def test_a_study_round_trips_through_its_stored_spec() -> None:
    study = builtins.builtin("lr-sensitivity", "quick", seeds=3)
    again = define.plan_from_spec(json.loads(json.dumps(study.to_spec())))
    assert again == study
    assert study.n_runs == 21 * 3
    lrs = sorted({define.swept_value(study, v.label, "lr") for v in study.variants})
    assert lrs[0] == pytest.approx(3e-4) and lrs[-1] == pytest.approx(3e-1) and len(lrs) == 7


def test_grid_sets_each_seed() -> None:
    study = builtins.builtin("activation", "quick", seeds=2)
    grid = study.grid()
    assert [(v.label, s) for v, s, _ in grid][:2] == [("ReLU", 1), ("ReLU", 2)]
    assert [c.train.seed for _, _, c in grid][:2] == [1, 2]
    assert {c.model.activation for _, _, c in grid} == {"relu", "gelu", "silu", "swiglu"}


def test_warmup_is_a_swept_column_of_norm_position() -> None:
    study = builtins.builtin("norm-position")
    values = {v.label: define.swept_value(study, v.label, "warmup") for v in study.variants}
    assert values["Post-LN · depth 6"] == "off"
    assert values["Post-LN + warm-up · depth 6"] == "on"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope",), "study: 'nope' is not allowed"),
        (("activation", "huge"), "size: 'huge'"),
        (("activation", "quick", 0), "seeds: 0"),
        (("activation", "quick", define.MAX_SEEDS + 1), "seeds"),
    ],
)
def test_bad_builtin_requests_name_the_problem(args: tuple, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        builtins.builtin(*args)


@pytest.mark.parametrize(
    ("text", "seeds"),
    [
        ("4", (1, 2, 3, 4)),  # a count, as before: seeds 1..4
        ("5-8", (5, 6, 7, 8)),
        ("5,7,9", (5, 7, 9)),
        ("1, 5-6", (1, 5, 6)),
        ("0-1", (0, 1)),
        (f"1-{define.MAX_SEEDS}", tuple(range(1, define.MAX_SEEDS + 1))),
    ],
)
def test_seeds_are_a_count_a_range_or_a_list(text: str, seeds: tuple[int, ...]) -> None:
    assert define.parse_seeds(text) == seeds
    assert builtins.builtin("activation", "quick", text).seeds == seeds
    assert sweeps.sweep({"lr": [1e-3, 3e-3]}, seeds=text).seeds == seeds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "seeds: none given; give a count (4: seeds 1-4), a range (5-8) or a list (5,7,9)"),
        ("0", "seeds: 0 is not allowed; a count must be from 1 to 20 (or give a range or list)"),
        ("-2", "seeds: '-2' names seed -2; a seed must be >= 0"),
        ("8-5", "seeds: the range '8-5' runs backwards; write it as 5-8"),
        ("5,6,5", "seeds: '5,6,5' names seed 5 twice"),
        ("1-4,3", "seeds: '1-4,3' names seed 3 twice"),
        ("21", "seeds: 21 is not allowed; a count must be from 1 to 20"),
        ("1-21", "seeds: '1-21' names more than 20 seeds"),
        ("0-1000000000", "seeds: '0-1000000000' names more than 20 seeds"),
        ("five", "seeds: 'five' is not a seed; write seeds as a count"),
        ("5-", "seeds: '5-' is not a seed"),
        ("1,,2", "seeds: '1,,2' has an empty item"),
    ],
)
def test_bad_seeds_get_one_line_naming_the_problem(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        define.parse_seeds(text)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_seeds_are_written_as_ranges_where_they_run_on() -> None:
    assert define.seeds_text((5, 6, 7, 8)) == "5–8"
    assert define.seeds_text((9, 10)) == "9–10"
    assert define.seeds_text((5, 7, 9)) == "5, 7, 9"
    assert define.seeds_text((3,)) == "3"


def test_parse_values_lists_and_log_ranges() -> None:
    assert sweeps.parse_values("lr", "1e-4:1e-2:3") == [1e-4, 1e-3, 1e-2]
    assert sweeps.parse_values("norm_position", "pre, post") == ["pre", "post"]
    assert sweeps.parse_values("residual", "true,false") == [True, False]
    assert sweeps.parse_values("n_layer", "1:8:4") == [1, 2, 4, 8]


def test_a_log_range_of_dropout_ends_where_it_was_typed() -> None:
    values = sweeps.parse_values("dropout", "1e-3:0.999999:3")
    assert values == [1e-3, 0.0316, 0.999999]  # 0.999999 is not rounded up to 1.0...
    study = sweeps.sweep({"dropout": values})  # ...which dropout refuses
    assert [v.label for v in study.variants][-1] == "dropout 0.999999"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("dropout", "1e-3:0.999999:3"),
        ("dropout", "0.0001234:0.98765:7"),
        ("lr", "0.00012345:0.12345:50"),
        ("beta2", "0.9:0.999:2"),
        ("grad_clip", "0.0999:0.1001:3"),
        ("n_layer", "2.4:10.6:3"),  # whole numbers: 2.4 may not round down to 2, 10.6 up to 11
    ],
)
def test_a_log_range_never_rounds_past_a_bound(name: str, text: str) -> None:
    low, high, n = text.split(":")
    values = sweeps.parse_values(name, text)
    assert values == sorted(values) and len(set(values)) == len(values)
    assert all(float(low) <= value <= float(high) for value in values), values
    if name != "n_layer":  # the ends exactly as typed
        assert (values[0], values[-1], len(values)) == (float(low), float(high), int(n))


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("dropout", "0.999:0.999999:3", "repeats a value"),
        ("n_layer", "2.2:2.8:2", "no whole number"),
        ("lr", "1e-4:x:3", "lr: '1e-4:x:3'"),
        ("lr", "1e-2:1e-4:3", "0 < low < high"),
        ("lr", "1e-4:1e-2:1", "2 to"),
        ("lr", "1e-3,,1e-2", "empty value"),
        ("lr", "1e-3,1e-3", "twice"),
        ("n_layer", "2,x", "n_layer: 'x'"),
        ("residual", "maybe,true", "true or false"),
        ("colour", "red,blue", "colour: 'red,blue' is not allowed; is not a config field"),
    ],
)
def test_bad_sweep_values_name_the_field_and_value(name: str, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sweeps.parse_values(name, text)


def test_sweep_crosses_fields_and_keeps_the_lr_floor_valid() -> None:
    study = sweeps.sweep(
        {"lr": [1e-5, 1e-3], "norm_position": ["pre", "post"]}, seeds=2, size="quick"
    )
    assert study.n_runs == 8 and study.claims == ()
    assert [v.label for v in study.variants][:2] == [
        "lr 1e-05 · norm_position pre",
        "lr 1e-05 · norm_position post",
    ]
    config = study.config_for(study.variants[0].label)
    assert config.train.min_lr <= config.train.lr == 1e-5
    assert config.model.d_model == define.SIZE_PRESETS["quick"]["d_model"]


def test_sweep_starts_from_the_base_config_given() -> None:
    base = RunConfig()
    base.model.n_layer = 3
    study = sweeps.sweep({"ffn_mult": [1, 2]}, base=base)
    assert study.config_for(study.variants[1].label).model.n_layer == 3


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({}, "at least one field"),
        ({"seed": [1, 2]}, "seeds count"),
        ({"n_head": [3]}, "n_head: 3 is not allowed"),
        ({"lr": [1e-3] * 1, "n_layer": list(range(1, 26)), "ffn_mult": list(range(1, 26))},
         "625 runs, more than the 500"),
    ],
)  # fmt: skip
def test_bad_sweeps_say_what_is_wrong(grid: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sweeps.sweep(grid)


class _Uncountable(Sequence):
    """A field's values that may be counted but not listed: listing them builds the grid."""

    def __len__(self) -> int:
        return define.MAX_VALUES

    def __getitem__(self, index: int) -> float:
        raise AssertionError("the sweep listed its values before counting its runs")


def test_a_huge_sweep_is_refused_by_its_count_before_a_combination_is_built() -> None:
    fields = ("lr", "min_lr", "weight_decay", "beta2")  # 50**4 runs: 2.7 GB once built
    with pytest.raises(ConfigError) as refused:
        sweeps.sweep({name: _Uncountable() for name in fields}, seeds=2)
    message = str(refused.value)
    assert message == (
        "sweep: 50 lr × 50 min_lr × 50 weight_decay × 50 beta2 × 2 seeds = 12,500,000 runs, "
        "more than the 500 a study may hold; sweep fewer values or seeds"
    )


def test_a_sweep_of_exactly_the_cap_is_built() -> None:
    study = sweeps.sweep({"n_layer": [1, 2, 3, 4, 5], "ffn_mult": [1, 2, 3, 4, 5]}, seeds=20)
    assert study.n_runs == define.MAX_STUDY_RUNS == 500
    assert study.variants[1].overrides == {"n_layer": 1, "ffn_mult": 2}  # last field fastest


def test_fields_fixed_for_a_sweep_win_over_its_size() -> None:
    study = sweeps.sweep({"lr": [1e-3, 3e-3]}, size="quick", fixed={"n_layer": 12})
    config = study.config_for(study.variants[0].label)
    assert config.model.n_layer == 12
    assert config.model.d_model == define.SIZE_PRESETS["quick"]["d_model"]
