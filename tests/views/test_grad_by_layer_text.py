"""Sentences under the gradient-by-layer chart: read off hand-made numbers, never assumed."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from blockviz.views import grad_by_layer_text as ft
from blockviz.views.grad_by_layer_text import RunShape


def grads(rows: dict[int, list[float]], step: int = 0, component: str = "block") -> pd.DataFrame:
    """layer_stats rows of grad_norm: run id -> value per layer, from the embeddings (-1)
    to the head end (n_layer) inclusive, as the probes record the `block` component."""
    records = [
        (run_id, step, layer - 1, "component", component, "grad_norm", value)
        for run_id, values in rows.items()
        for layer, value in enumerate(values)
    ]
    columns = ["run_id", "step", "layer", "kind", "component", "stat", "value"]
    return pd.DataFrame(records, columns=columns)


def test_a_level_profile_says_level_with_its_ratio_and_range() -> None:
    # Embeddings and head (first and last entries) are far off; only blocks count.
    frame = grads({1: [9.0, 0.75, 0.74, 0.76, 0.01]})
    (sentence,) = ft.grad_by_layer_sentences(frame, {1: RunShape("b", 3, "post")}, 0)
    assert sentence == (
        "At initialization (step 0), b (Post-LN, 3 blocks): from the first block to the last "
        "the gradient is level (first / last = 0.99; every block between 0.74 and 0.76)."
    )


@pytest.mark.parametrize(
    ("first", "last", "word"),
    [
        (1.0, 1.2, "level"),  # exactly LEVEL_RATIO apart still reads level
        (1.2, 1.0, "level"),
        (1.2004, 1.0, "level"),  # shown as 1.20: the word agrees with the number shown
        (1.0, 1.206, "level"),  # first / last shown as 0.83
        (1.0, 1.25, "rising towards the output"),
        (1.25, 1.0, "falling towards the output"),
        (2.0, 0.5, "falling towards the output"),
    ],
)
def test_the_profile_word_follows_the_threshold(first: float, last: float, word: str) -> None:
    assert ft.profile_word(first, last) == word
    frame = grads({1: [1.0, first, 1.1, last, 1.0]}, step=250)
    (sentence,) = ft.grad_by_layer_sentences(frame, {1: RunShape("r", 3)}, 250)
    assert sentence.startswith("At step 250, r (3 blocks): ")
    assert f"is {word} (first / last = {first / last:.2f};" in sentence


def test_two_runs_compare_their_last_blocks_larger_first() -> None:
    frame = grads({1: [1.0, 0.5, 0.49, 1.0], 2: [1.0, 0.75, 0.8, 1.0]})
    shapes = {1: RunShape("pre-ln", 2, "pre"), 2: RunShape("post-ln", 2, "post")}
    sentences = ft.grad_by_layer_sentences(frame, shapes, 0)
    assert len(sentences) == 3
    assert sentences[2] == (
        "At initialization (step 0), the last block's gradient is 1.6× larger in post-ln "
        "than in pre-ln (0.8 vs 0.49)."
    )


def test_ratio_wording_for_near_equal_and_large_ratios() -> None:
    same = grads({1: [1.0, 1.0, 1.0], 2: [1.0, 1.04, 1.0]})
    shapes = {1: RunShape("a", 1), 2: RunShape("b", 1)}
    assert ft.grad_by_layer_sentences(same, shapes, 0)[-1] == (
        "At initialization (step 0), the last block's gradient is about the same in b and a "
        "(1.04 vs 1)."
    )
    far = grads({1: [1.0, 0.02, 1.0], 2: [1.0, 0.5, 1.0]})
    assert (
        "is 25× larger in b than in a (0.5 vs 0.02)."
        in ft.grad_by_layer_sentences(far, shapes, 0)[-1]
    )


def test_a_run_with_one_block_has_no_profile_but_still_compares() -> None:
    frame = grads({1: [1.0, 0.3, 1.0], 2: [1.0, 0.6, 0.6, 1.0]})
    shapes = {1: RunShape("one", 1, "pre"), 2: RunShape("two", 2, "pre")}
    sentences = ft.grad_by_layer_sentences(frame, shapes, 0)
    assert sentences[0] == (
        "At initialization (step 0), one (Pre-LN, 1 block) has one block, so no profile "
        "across blocks."
    )
    assert "level" in sentences[1]
    assert sentences[2].endswith("is 2.0× larger in two than in one (0.6 vs 0.3).")


def test_missing_data_gives_no_sentence() -> None:
    shapes = {1: RunShape("a", 3), 2: RunShape("b", 3)}
    assert ft.grad_by_layer_sentences(grads({}), shapes, 0) == []
    # Probed at step 0 only: nothing is said about step 50.
    assert ft.grad_by_layer_sentences(grads({1: [1.0] * 5}), shapes, 50) == []
    # A run whose shape is unknown is not described, and no pair is formed with it.
    only = ft.grad_by_layer_sentences(grads({1: [1.0] * 5, 2: [2.0] * 5}), {1: shapes[1]}, 0)
    assert len(only) == 1 and "a (3 blocks)" in only[0]
    # Embeddings and head have no blocks.
    assert ft.grad_by_layer_sentences(grads({1: [1.0] * 5}, component="embed"), shapes, 0) == []
    # Another component's rows do not describe this one.
    ffn = grads({1: [1.0] * 5}, component="ffn")
    assert ft.grad_by_layer_sentences(ffn, shapes, 0, "attn") == []


def test_missing_first_or_last_block_gives_no_profile_and_a_gap_no_range() -> None:
    shapes = {1: RunShape("a", 3)}
    no_first = grads({1: [1.0, math.nan, 1.0, 1.0, 1.0]})
    assert ft.grad_by_layer_sentences(no_first, shapes, 0) == []
    gap = grads({1: [1.0, 1.0, math.inf, 1.0, 1.0]})
    (sentence,) = ft.grad_by_layer_sentences(gap, shapes, 0)
    assert sentence.endswith("is level (first / last = 1.00).")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0.0, -1.0])
def test_non_finite_or_non_positive_last_blocks_are_left_out(bad: float) -> None:
    frame = grads({1: [1.0, 1.0, bad, 1.0], 2: [1.0, 2.0, 2.0, 1.0]})
    shapes = {1: RunShape("a", 2), 2: RunShape("b", 2)}
    sentences = ft.grad_by_layer_sentences(frame, shapes, 0)
    assert len(sentences) == 1 and sentences[0].startswith("At initialization (step 0), b ")
    assert not any("nan" in s.lower() or "inf" in s for s in sentences)


def test_the_component_is_named_and_the_paper_claim_states_its_conditions() -> None:
    frame = grads({1: [1.0, 1.0, 3.0, 1.0]}, component="attn")
    (sentence,) = ft.grad_by_layer_sentences(frame, {1: RunShape("a", 2)}, 0, "attn")
    assert "the attention gradient is rising towards the output (first / last = 0.33;" in sentence
    claim = ft.PAPER_CLAIM
    assert claim.startswith("The paper's claim") and "Xavier" in claim and "Theorem 1" in claim
    assert "docs/config-guide.md" in claim


def test_a_tiny_first_block_is_shown_with_significant_digits_not_as_zero() -> None:
    # Measured: a Post-LN run at its last step, first block 6.9e-07, last 0.0427.
    frame = grads({1: [1.0, 6.93e-07, 0.01, 0.0427, 1.0]}, step=299)
    (sentence,) = ft.grad_by_layer_sentences(frame, {1: RunShape("p", 3, "post")}, 299)
    assert "rising towards the output (first / last = 1.6e-05; every block between 6.93e-07" in (
        sentence
    )
