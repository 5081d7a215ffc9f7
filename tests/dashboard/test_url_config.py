"""url_config: a config to a URL query and back, and the preset caption (no Streamlit)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pytest

from blockviz.core import config
from blockviz.core.config import BOUNDS
from blockviz.core.fields import ConfigField
from blockviz.core.presets import DEFAULT_PRESET
from blockviz.dashboard import url_config
from blockviz.dashboard.config_fields import ALL_FIELDS, FINAL_NORM_CHOICES, UPLOAD_CHOICE


def another_value(spec: ConfigField, value: Any) -> Any:
    """An allowed value of the field that differs from `value`."""
    if spec.kind == "bool":
        return not value
    if spec.kind == "tristate":
        return next(v for v in (None, True, False) if v != value)
    if spec.kind == "select":
        return next(option for option in spec.choices if option != value)
    bound = BOUNDS[spec.name]
    if spec.kind == "int":
        return value + 1 if value + 1 <= bound.high else value - 1
    return value / 2 if value else (bound.low + bound.high) / 3


def through_url(query: dict[str, str]) -> dict[str, str]:
    """What a browser hands back after the query has been in its address bar."""
    return dict(parse_qsl(urlencode(query), keep_blank_values=True))


@pytest.mark.parametrize("preset", ["baby-cpu", "postln-original", "tiny"])
@pytest.mark.parametrize("spec", ALL_FIELDS, ids=lambda spec: spec.name)
def test_one_changed_field_round_trips(preset: str, spec: ConfigField) -> None:
    values = url_config.flat_values(config.preset(preset))
    values[spec.name] = another_value(spec, values[spec.name])
    query = url_config.encode(preset, values)
    assert set(query) == {url_config.PRESET_PARAM, spec.name}  # only what differs
    decoded = url_config.decode(through_url(query))
    assert not decoded.problems
    assert decoded.preset == preset
    assert decoded.values == {spec.name: values[spec.name]}
    assert type(decoded.values[spec.name]) is type(values[spec.name])


def test_many_changes_and_a_dataset_round_trip() -> None:
    values = url_config.flat_values(config.preset("tiny"))
    changed = {"norm_position": "post", "lr": 0.003, "final_norm": False, "dataset": "ops"}
    changed |= {"ops_max_args": 3, "min_lr": 1.5e-05, "residual": False}
    values |= changed
    query = url_config.encode("tiny", values, name="my run")
    decoded = url_config.decode(through_url(query))
    assert (decoded.preset, decoded.values, decoded.name) == ("tiny", changed, "my run")
    rebuilt = config.replace(config.preset("tiny"), **decoded.values)
    assert url_config.flat_values(rebuilt) == values


def test_an_upload_stays_out_of_the_query() -> None:
    values = url_config.flat_values(config.preset("baby-cpu")) | {"dataset": UPLOAD_CHOICE}
    values["n_layer"] = 3
    assert url_config.encode("baby-cpu", values) == {"preset": "baby-cpu", "n_layer": "3"}


@pytest.mark.parametrize(
    ("key", "text", "says"),
    [
        ("n_layer", "abc", "must be an integer in [1, 256]"),
        ("n_layer", "100000", "must be an integer in [1, 256]"),
        ("n_layer", "2.5", "must be an integer"),
        ("lr", "nan", "must be a number in (0.0, 10.0]"),
        ("lr", "1e999", "must be a number"),
        ("lr", "fast", "must be a number"),
        ("norm_position", "middle", "choose one of pre, post, none"),
        ("residual", "maybe", "must be true or false"),
        ("final_norm", "sometimes", "must be true or false"),
        ("dataset", "/etc/passwd", "built-in corpus"),
        ("dataset", UPLOAD_CHOICE, "built-in corpus"),
    ],
)
def test_a_bad_value_is_refused_by_name_and_the_field_keeps_the_preset(
    key: str, text: str, says: str
) -> None:
    decoded = url_config.decode({"preset": "baby-cpu", key: text, "d_model": "64"})
    assert decoded.values == {"d_model": 64}  # the good field still applies
    (problem,) = decoded.problems
    assert problem.startswith(f"{key}: ") and says in problem and "preset's value" in problem
    assert "\n" not in problem


def test_unknown_keys_and_presets_are_named() -> None:
    decoded = url_config.decode({"preset": "huge", "flux": "1", "vocab_size": "99"})
    assert decoded.preset == DEFAULT_PRESET and not decoded.values
    problems = "\n".join(decoded.problems)
    assert "preset: 'huge' is not allowed" in problems
    assert "'flux' is not a config field" in problems
    assert "'vocab_size' is not a config field" in problems  # the dataset sets it


def test_the_url_keys_are_every_widget_and_the_dataset() -> None:
    assert set(url_config.FIELD_PARAMS) == {spec.name for spec in ALL_FIELDS} | {"dataset"}
    assert FINAL_NORM_CHOICES == ("auto", "on", "off")  # value_text writes auto/true/false


def test_caption_says_what_changed_from_the_preset() -> None:
    values = url_config.flat_values(config.preset("baby-cpu"))
    assert url_config.changes_caption("baby-cpu", values) == ""
    base = config.preset("baby-cpu")
    values |= {"d_model": 64, "lr": 0.003}
    caption = url_config.changes_caption("baby-cpu", values)
    assert f"d_model 64 (preset {base.model.d_model})" in caption
    assert f"lr 0.003 (preset {base.train.lr:g})" in caption
    many = {spec.name: another_value(spec, values[spec.name]) for spec in ALL_FIELDS}
    caption = url_config.changes_caption("baby-cpu", values | many)
    assert caption.endswith(f"and {len(many) - url_config.MAX_LISTED_CHANGES} more")


def test_the_module_does_not_import_streamlit() -> None:
    code = "import sys, blockviz.dashboard.url_config; print('streamlit' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr
