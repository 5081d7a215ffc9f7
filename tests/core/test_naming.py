"""One run name for a config, whoever asks (sidebar or `blockviz train`)."""

from __future__ import annotations

import pytest

from blockviz.core import config
from blockviz.core.naming import (
    MAX_NAME_TOKENS,
    MAX_RUN_ID,
    is_id_text,
    run_id_from_text,
    run_name,
    sanitize_name,
)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, "baby-cpu"),
        ({"norm_position": "post", "activation": "relu", "n_layer": 6}, "post-ln-relu-6L"),
        ({"n_layer": 6, "activation": "relu", "norm_position": "post"}, "post-ln-relu-6L"),
        ({"residual": False, "lr": 3e-4}, "no-resid-lr0.0003"),
        ({"attention": False, "dataset": "/data/My Notes.txt"}, "no-attn-My Notes"),
        ({"vocab_size": 97, "dataset": "pycode"}, "pycode"),
        ({"dataset": "/data/2024.txt"}, "run-2024"),
        ({"dropout": 0.1}, "dropout0.1"),
    ],
)
def test_the_name_lists_what_differs_from_the_default(overrides: dict, expected: str) -> None:
    assert run_name(config.replace(config.RunConfig(), **overrides)) == expected


def test_a_preset_is_the_base_it_differs_from() -> None:
    post = config.preset("postln-original")
    assert run_name(post, "postln-original") == "postln-original"
    assert run_name(config.replace(post, n_layer=8), "postln-original") == "8L"
    assert run_name(post) != "postln-original"  # against the default it lists the changes


def test_many_changes_are_cut_and_counted() -> None:
    changes = {"n_layer": 2, "n_head": 2, "d_model": 64, "block_size": 32, "dropout": 0.1}
    changes |= {"bias": False, "init": "gpt2"}
    name = run_name(config.replace(config.RunConfig(), **changes))
    assert name.endswith(f"+{len(changes) - MAX_NAME_TOKENS}")
    assert len(name.split("-")) >= MAX_NAME_TOKENS


def test_sanitize_and_ids() -> None:
    assert sanitize_name("renamed run / with slash!") == "renamed run - with slash"
    assert sanitize_name("  \t ") == "run"
    assert is_id_text("12") and not is_id_text("²") and not is_id_text("run-1")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12", 12),
        ("007", 7),
        ("0" * 5000 + "3", 3),
        (str(MAX_RUN_ID), MAX_RUN_ID),
        (str(MAX_RUN_ID + 1), None),  # SQLite cannot hold it: no store has that run
        ("9" * 4301, None),  # past Python's int-string limit
        ("9" * 100_000, None),
        ("²", None),
        ("", None),
    ],
)
def test_run_id_from_text_takes_any_digit_string(text: str, expected: int | None) -> None:
    assert run_id_from_text(text) == expected
