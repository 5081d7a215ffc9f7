"""The induction statistics: prefix matching and its standard error, copying, the repeated
batch, the probe's rows."""

import math

import numpy as np
import pytest
import torch

from blockviz.core import spec
from blockviz.core.induction import (
    PROBE_TOKENS,
    is_line_break,
    probe_rows,
    probe_tokens,
    uniform_prefix_score,
)
from blockviz.training.induction import (
    add_copying,
    copying_scores,
    induction_parts,
    induction_records,
    ov_circuits,
    prefix_rows,
    prefix_scores,
    repeat_gain,
    repeated_batch,
)
from blockviz.training.model import CharTransformer
from blockviz.training.probe_stats import RunStack
from tests import helpers

torch.set_num_threads(1)


def causal_uniform(T: int, n_head: int = 1) -> torch.Tensor:
    """(1, n_head, T, T) weights spread evenly over each query's causal prefix."""
    mask = torch.ones(T, T).tril()
    return (mask / mask.sum(dim=-1, keepdim=True)).expand(1, n_head, T, T)


def induction_pattern(half: int) -> torch.Tensor:
    """(1, 1, 2L, 2L): the second repeat's query i attends only to i - L + 1; the first
    repeat's queries attend to themselves."""
    T = 2 * half
    weights = torch.zeros(1, 1, T, T)
    for query in range(T):
        key = query - half + 1 if query >= half else query
        weights[0, 0, query, key] = 1.0
    return weights


@pytest.mark.parametrize("half", [2, 5, 16])
def test_a_perfect_induction_pattern_scores_one_and_uniform_attention_its_baseline(half):
    score, error = prefix_scores(induction_pattern(half), half)
    assert score.tolist() == pytest.approx([1.0]) and error.tolist() == [0.0]  # one row
    uniform, _ = prefix_scores(causal_uniform(2 * half, n_head=3), half)
    assert uniform.tolist() == pytest.approx([uniform_prefix_score(half)] * 3)
    # the baseline tends to ln 2 / L
    assert uniform_prefix_score(1000) * 1000 == pytest.approx(math.log(2), rel=1e-3)


def test_attending_to_the_previous_occurrence_itself_does_not_count():
    half = 6
    weights = torch.zeros(1, 1, 2 * half, 2 * half)
    for query in range(2 * half):  # query i -> i - L (the same token, one step too early)
        weights[0, 0, query, max(0, query - half)] = 1.0
    assert prefix_scores(weights, half)[0].tolist() == pytest.approx([0.0])


def test_the_score_of_each_head_is_its_own():
    half = 4
    both = torch.cat([induction_pattern(half), causal_uniform(2 * half)], dim=1)  # (1, 2, T, T)
    scores, errors = prefix_scores(both.expand(3, 2, 2 * half, 2 * half), half)
    assert scores.tolist() == pytest.approx([1.0, uniform_prefix_score(half)])
    assert errors.tolist() == pytest.approx([0.0, 0.0], abs=1e-7)  # three equal rows


def test_the_score_s_standard_error_is_the_rows_spread_over_root_rows():
    """Rows scoring 1, 0, 1, 0, ...: the score is their mean, its standard error their
    sample sd / sqrt(rows), per head and per run."""
    half, rows = 4, 10
    perfect, blind = induction_pattern(half), torch.zeros(1, 1, 2 * half, 2 * half)
    batch = torch.cat([perfect if row % 2 == 0 else blind for row in range(rows)])  # (B,1,T,T)
    per_row = prefix_rows(batch, half)
    assert per_row.shape == (rows, 1) and per_row[:, 0].tolist() == [1.0, 0.0] * (rows // 2)
    score, error = prefix_scores(batch.expand(2, rows, 1, 2 * half, 2 * half), half)
    assert score.reshape(-1).tolist() == pytest.approx([0.5, 0.5])
    expected = float(torch.tensor([1.0, 0.0] * (rows // 2)).std()) / math.sqrt(rows)
    assert error.reshape(-1).tolist() == pytest.approx([expected, expected])


def test_copying_score_of_identity_negated_and_rotating_circuits():
    n = 6
    identity = np.eye(n)
    rotation = np.array([[0.0, -1.0], [1.0, 0.0]])  # eigenvalues ±i: neither copies nor inverts
    scores = copying_scores(np.stack([identity, -identity, 3 * identity]))
    assert scores.tolist() == pytest.approx([1.0, -1.0, 1.0])  # norms ignored
    assert copying_scores(rotation).item() == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(copying_scores(np.zeros((2, 2))).item())


def test_a_diverging_models_circuit_scores_nan_instead_of_failing_the_run():
    """A replay probes every step up to a divergence: numpy's eigvals raised LinAlgError
    on a circuit holding NaN or inf, and the replay ended `failed`."""
    identity = np.eye(3)
    broken = identity.copy()
    broken[0, 1] = np.inf
    scores = copying_scores(np.stack([identity, broken, np.full((3, 3), np.nan)]))
    assert scores[0] == pytest.approx(1.0) and np.isnan(scores[1:]).all()


def test_ov_circuits_are_the_heads_value_output_maps_through_embedding_and_unembedding():
    """With W_E and W_U identities (d_model = vocab), each head's circuit is W_V^h W_O^h; a
    head whose W_O^h is W_V^h's transpose copies (score 1), its negation inverts (-1)."""
    config = helpers.tiny_config(vocab_size=8, d_model=8, n_head=2, n_layer=2, ffn=False)
    model = CharTransformer(config.model)
    hs = 4
    with torch.no_grad():
        model.tok_emb.weight.copy_(torch.eye(8))
        model.lm_head.weight.copy_(torch.eye(8))
        for layer, sign in ((0, 1.0), (1, -1.0)):
            attn = model.blocks[layer].attn
            w_v = torch.randn(8, 8)
            attn.qkv.weight[16:].copy_(w_v)
            attn.proj.weight.copy_(sign * w_v.T)  # head h's W_O^h is (W_V^h)^T
    circuits = ov_circuits(RunStack.of(model), [0, 1])[0]  # a stack of one
    assert circuits.shape == (2, 2, hs, hs)
    w_v0 = model.blocks[0].attn.qkv.weight[16:20]
    expected = w_v0 @ w_v0.T  # head 0 of layer 0
    assert torch.allclose(circuits[0, 0], expected, atol=1e-5)
    scores = copying_scores(circuits.numpy())
    assert scores[0].tolist() == pytest.approx([1.0, 1.0])
    assert scores[1].tolist() == pytest.approx([-1.0, -1.0])


def test_repeated_batch_is_fixed_and_leaves_the_training_rng_alone():
    torch.manual_seed(0)
    expected_next = torch.rand(3)
    torch.manual_seed(0)
    batch = repeated_batch(range(11), block_size=21, rows=5)
    assert torch.equal(torch.rand(3), expected_next)  # the global generator did not move
    assert batch.shape == (5, 20) and batch.min() >= 0 and batch.max() < 11
    assert torch.equal(batch[:, :10], batch[:, 10:])
    assert torch.equal(batch, repeated_batch(range(11), block_size=21, rows=5))
    assert repeated_batch(range(11), block_size=3) is None


@pytest.mark.parametrize("block_size", [8, 64, 256, 1024])
def test_the_repeated_batch_has_enough_rows_of_every_character_but_line_breaks(block_size):
    """Issue 39, defect 5: the prefix score came from 4 fixed rows, which held twice the
    expected newlines (a row with one scores low in a model trained on lines). Now the
    batch holds about PROBE_TOKENS tokens (32 rows at ctx 64; never fewer than 16), every
    character but the line breaks drawn uniformly, and no line break at all."""
    chars = ["\n", *"abcdefghijklmnopqrstuvwxyz", "\r", " ", "."]
    tokens = probe_tokens(chars)
    assert [chars[i] for i in range(len(chars)) if i not in tokens] == ["\n", "\r"]
    batch = repeated_batch(tokens, block_size)
    half = block_size // 2
    assert batch.shape == (probe_rows(block_size), 2 * half)
    assert batch.shape[0] == max(16, PROBE_TOKENS // (2 * half)) >= 16
    if block_size == 64:
        assert batch.shape[0] >= 32
    drawn = batch[:, :half].reshape(-1)
    assert set(drawn.tolist()) <= set(tokens) and not {0, 27} & set(drawn.tolist())
    counts = torch.bincount(drawn, minlength=len(chars))[tokens].double()
    expected = len(drawn) / len(tokens)
    spread = math.sqrt(expected)  # a uniform draw's counts: within 5 sd of the mean
    assert ((counts - expected).abs() < 5 * spread + 1).all()


def test_only_line_breaks_are_left_out_and_a_vocabulary_of_little_else_keeps_them():
    assert [c for c in "\n\r\x0b\x0c\x1c\x85\u2028 \t.a" if is_line_break(c)] == list(
        "\n\r\x0b\x0c\x1c\x85\u2028"
    )
    assert probe_tokens(["a", "\n", "b"]) == [0, 2]
    assert probe_tokens(["a", "\n"]) == [0, 1]  # one character left: draw from all


def test_repeat_gain_is_the_first_repeats_loss_minus_the_seconds():
    tokens = repeated_batch(range(5), block_size=8, rows=2)  # (2, 8), L = 4
    # a model that knows the second repeat: one-hot logits there, nothing in the first
    logits = torch.zeros(2, 8, 5)
    for t in range(4, 7):
        logits[torch.arange(2), t, tokens[:, t + 1]] = 50.0
    assert repeat_gain(logits[None], tokens).item() == pytest.approx(math.log(5), abs=1e-4)
    assert repeat_gain(torch.zeros(1, 2, 8, 5), tokens).item() == pytest.approx(0.0, abs=1e-6)


def test_induction_parts_and_records_name_every_head_once():
    config = helpers.tiny_config(n_layer=2, n_head=2, d_model=16, block_size=12)
    model = CharTransformer(config.model).eval()
    tokens = repeated_batch(range(config.model.vocab_size), config.model.block_size)
    parts = induction_parts(RunStack.of(model), tokens, torch.no_grad)
    host = {name: tensor.reshape(-1).tolist() for name, tensor in parts.items()}
    add_copying([host])
    rows, scalars = induction_records(7, [0, 1], host)
    keys = {(row.layer, row.component, row.stat) for row in rows}
    assert keys == {
        (layer, str(head), stat)
        for layer in (0, 1)
        for head in (0, 1)
        for stat in spec.INDUCTION_STATS
    }
    assert len(rows) == len(keys) and all(row.step == 7 for row in rows)
    copies = [row.value for row in rows if row.stat == spec.COPY_SCORE]
    assert all(-1.0 <= value <= 1.0 for value in copies)
    assert list(scalars) == [spec.PROBE_REPEAT_GAIN]
    assert math.isfinite(scalars[spec.PROBE_REPEAT_GAIN])
    no_attention = helpers.tiny_config(attention=False)
    no_heads = RunStack.of(CharTransformer(no_attention.model))
    assert induction_parts(no_heads, tokens, torch.no_grad) == {}
